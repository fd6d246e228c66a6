"""The wire format (vlaperf.serve.protocol): round trips, openpi-client compatibility, and
strict decoding of untrusted bytes. CPU only, no sockets."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest

from vlaperf.serve.protocol import ProtocolError, error_frame, packb, parse_error_frame, unpackb

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


def _array(dtype: str, shape=(3, 4)) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _raw_ndarray(dtype: str, data: bytes, shape) -> bytes:
    """An ndarray map as openpi's extension writes it, with whatever fields we like."""
    return msgpack.packb({b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}, use_bin_type=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_dtypes(dtype):
    for shape in [(3, 4), (), (0,), (2, 1, 3)]:
        a = _array(dtype, shape)
        b = unpackb(packb({"x": a}))["x"]
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)
        assert b.flags.writeable and b.flags.c_contiguous


def test_round_trip_nested_scalars_and_views():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous
    msg = {"obs": {"img": a, "n": np.int16(-3), "f": np.float32(1.5), "flag": np.bool_(True)}, "prompt": "hi",
           "list": [1, 2.5, None, b"raw"]}
    out = unpackb(packb(msg))
    np.testing.assert_array_equal(out["obs"]["img"], a)
    assert out["obs"]["n"] == -3 and out["obs"]["n"].dtype == np.int16
    assert out["obs"]["f"] == np.float32(1.5) and out["obs"]["f"].dtype == np.float32
    assert out["obs"]["flag"] is np.True_ or bool(out["obs"]["flag"]) is True
    assert out["prompt"] == "hi" and out["list"] == [1, 2.5, None, b"raw"]


def test_big_endian_arrays_decode_to_native():
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = unpackb(packb(a))
    assert b.dtype == np.dtype("float32") and b.dtype.isnative
    np.testing.assert_array_equal(a, b)


def test_compatible_with_openpi_client_msgpack_numpy():
    openpi = pytest.importorskip("openpi_client.msgpack_numpy")
    msg = {d: _array(d) for d in DTYPES}
    msg["scalar"] = np.float64(2.25)
    msg["nested"] = {"state": np.ones(8, np.float32), "prompt": "pick"}
    theirs = unpackb(openpi.packb(msg))  # what an openpi client sends, decoded by us
    ours = openpi.unpackb(packb(msg))  # what we send, decoded by an openpi client
    for out in (theirs, ours):
        for d in DTYPES:
            assert out[d].dtype == np.dtype(d)
            np.testing.assert_array_equal(out[d], msg[d])
        assert out["scalar"] == 2.25 and out["nested"]["prompt"] == "pick"
        np.testing.assert_array_equal(out["nested"]["state"], msg["nested"]["state"])


@pytest.mark.parametrize("dtype", ["|O", "|O8", "<O8", "|V8", "<U5", "|S3", "<c8", "<c16", "<M8[s]", "<m8[s]", "<f16",
                                   "[('a', 'O')]", "object", "O", "__import__('os')", "<f4 ", "float32"])
def test_refuses_non_numeric_dtypes(dtype):
    with pytest.raises(ProtocolError, match="dtype"):
        unpackb(_raw_ndarray(dtype, b"\x00" * 8, [1]))
    generic = msgpack.packb({b"__npgeneric__": True, b"data": 0, b"dtype": dtype}, use_bin_type=True)
    with pytest.raises(ProtocolError, match="dtype"):
        unpackb(generic)


def test_text_as_a_0d_array_or_a_scalar_decodes_to_text():
    """openpi's transforms hold a prompt as np.asarray(prompt), and its msgpack_numpy sends that as a 0-d "<U" array:
    it decodes to the str (bytes for "S"), in either byte order. Text of any other shape, of the wrong byte count or
    past U+10FFFF is refused naming the dtype."""
    msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
    out = unpackb(msgpack_numpy.packb({"prompt": np.asarray("pick up the bowl"), "raw": np.asarray(b"ab")}))
    assert out == {"prompt": "pick up the bowl", "raw": b"ab"} and type(out["prompt"]) is str
    assert unpackb(_raw_ndarray(">U2", "hi".encode("utf-32-be"), [])) == "hi"
    assert unpackb(_raw_ndarray("<U4", "hi".encode("utf-32-le") + b"\x00" * 8, [])) == "hi"  # NUL padding dropped
    assert unpackb(msgpack.packb({b"__npgeneric__": True, b"data": "yo", b"dtype": "<U2"}, use_bin_type=True)) == "yo"
    for raw, match in [(_raw_ndarray("<U2", b"\x00" * 16, [2]), "accepted only 0-d"),
                       (_raw_ndarray("<U2", b"\x00" * 7, []), "needs 8 bytes, got 7 bytes"),
                       (_raw_ndarray("<U1", b"\xff\xff\xff\xff", []), "past U\\+10FFFF"),
                       (_raw_ndarray("<U9999999", b"", []), "bytes wide"),
                       (msgpack.packb({b"__npgeneric__": True, b"data": b"yo", b"dtype": "<U2"}, use_bin_type=True),
                        "needs a str, got bytes")]:
        with pytest.raises(ProtocolError, match=match):
            unpackb(raw)


def test_refuses_pickle_payloads():
    evil = pickle.dumps(object())  # a pickle stream, whatever dtype claims to read it
    for dtype in ("|O", "|O8", "|V" + str(len(evil))):
        with pytest.raises(ProtocolError):
            unpackb(_raw_ndarray(dtype, evil, [1]))
    with pytest.raises(ProtocolError):  # a bare pickle is not msgpack
        unpackb(evil)
    with pytest.raises(ProtocolError):  # bytes as an object array through the scalar path
        unpackb(msgpack.packb({b"__npgeneric__": True, b"data": evil, b"dtype": "|O"}, use_bin_type=True))


@pytest.mark.parametrize("shape,data,match", [
    ([3], b"\x00" * 11, "needs 12 bytes"),
    ([3], b"\x00" * 13, "needs 12 bytes"),
    ([-1], b"", "non-negative"),
    ([True, 3], b"\x00" * 12, "non-negative"),
    ([1.5], b"", "non-negative"),
    ("3", b"", "shape"),
    ([1] * 33, b"\x00" * 4, "at most 32"),
    ([2**20, 2**20], b"\x00" * 16, "bytes"),
])
def test_refuses_inconsistent_arrays(shape, data, match):
    with pytest.raises(ProtocolError, match=match):
        unpackb(_raw_ndarray("<f4", data, shape))


def test_refuses_malformed_messages():
    with pytest.raises(ProtocolError, match="msgpack"):
        unpackb(b"\xc1\xc1\xc1")  # 0xc1 is never used in msgpack
    with pytest.raises(ProtocolError, match="trailing"):
        unpackb(packb({"a": 1}) + b"junk")
    with pytest.raises(ProtocolError):
        unpackb(b"\x92\x01")  # truncated
    with pytest.raises(ProtocolError, match="nested"):
        unpackb(b"\x91" * 5000 + b"\x00")
    with pytest.raises(ProtocolError, match="extension"):
        unpackb(msgpack.packb(msgpack.ExtType(7, b"xx")))
    with pytest.raises(ProtocolError):
        unpackb(msgpack.packb({1: 2}))  # int map keys
    with pytest.raises(ProtocolError, match="binary"):
        unpackb("text")
    with pytest.raises(ProtocolError, match="exceeds"):
        unpackb(packb(np.zeros(4096, np.uint8)), max_bytes=1024)
    with pytest.raises(ProtocolError, match="bytes"):
        unpackb(msgpack.packb({b"__ndarray__": True, b"data": "str", b"dtype": "<f4", b"shape": [0]}, use_bin_type=True))
    with pytest.raises(ProtocolError):
        unpackb(msgpack.packb({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}, use_bin_type=True))
    with pytest.raises(ProtocolError):
        unpackb(msgpack.packb({b"__npgeneric__": True, b"data": "1", b"dtype": "<f4"}, use_bin_type=True))


def test_random_bytes_only_raise_protocol_error():
    rng = np.random.default_rng(1)
    for n in list(range(1, 40)) + [100, 1000]:
        for _ in range(20):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            try:
                unpackb(data)
            except ProtocolError:
                pass


def test_bool_bytes_are_normalised():
    out = unpackb(_raw_ndarray("|b1", b"\x00\x01\x07", [3]))
    assert out.dtype == bool and out.tolist() == [False, True, True]


def test_encode_sends_a_0d_text_array_as_its_text():
    """A prompt held as np.asarray(prompt), as openpi's transforms hold it, is sent by vlaperf's client as the str it
    holds (bytes for "S"), which every server reads; openpi-client could send it and vlaperf's refused it. Text of
    any other shape is still refused."""
    out = unpackb(packb({"prompt": np.asarray("pick up the bowl"), "raw": np.asarray(b"ab")}))
    assert out == {"prompt": "pick up the bowl", "raw": b"ab"} and type(out["prompt"]) is str
    with pytest.raises(ProtocolError, match="cannot send numpy dtype '<U1'"):
        packb({"prompt": np.asarray(["a", "b"])})


def test_encode_refuses_unsupported_types():
    for bad in (np.array([object()]), np.array(["a"]), np.zeros(2, np.complex64), np.zeros(1, "V4"), object()):
        with pytest.raises(ProtocolError):
            packb({"x": bad})


def test_error_frame_round_trip():
    frame = error_frame("InputError", "observation is missing key 'prompt'", request_id="r1", index=2)
    assert isinstance(frame, str)
    body = parse_error_frame(frame)
    assert body == {"error": "InputError", "message": "observation is missing key 'prompt'", "request_id": "r1", "index": 2}
    assert parse_error_frame("Traceback (most recent call last): ...") == {
        "error": "ServerError", "message": "Traceback (most recent call last): ..."}


def test_a_refused_array_is_named_by_its_key_with_the_request_id():
    """The msgpack hook sees an array's map, not where it sits: the error names the key it was found under (one
    level of nesting too, as ALOHA's images/cam_high), and keeps the observation's request_id and list index."""
    bad = {b"__ndarray__": True, b"data": b"\x00" * 4, b"dtype": "<f16", b"shape": [1]}
    with pytest.raises(ProtocolError, match=r"^observation/image: unsupported array dtype '<f16'") as e:
        unpackb(msgpack.packb({"observation/image": bad, "request_id": "r9"}, use_bin_type=True))
    assert (e.value.request_id, e.value.index) == ("r9", None)
    message = [{"prompt": "a"}, {"images": {"cam_high": {**bad, b"dtype": "<f4", b"data": b"\x00" * 3}}, "request_id": 7}]
    with pytest.raises(ProtocolError, match=r"^\[1\] images/cam_high: array of shape \(1,\) and dtype <f4 needs 4") as e:
        unpackb(msgpack.packb(message, use_bin_type=True))
    assert (e.value.request_id, e.value.index) == (7, 1)
    with pytest.raises(ProtocolError) as e:  # an id the server would refuse is not echoed
        unpackb(msgpack.packb({"x": bad, "request_id": ["no"]}, use_bin_type=True))
    assert e.value.request_id is None and str(e.value).startswith("x: ")
    forged = "x\n2026-12-03 00:00:00,000 vlaperf.serve CRITICAL fake"  # a key that would forge a server log line
    with pytest.raises(ProtocolError) as e:
        unpackb(msgpack.packb({forged: bad}, use_bin_type=True))
    assert "\n" not in str(e.value) and str(e.value).startswith("x\\n2026-12-03")


def test_containers_past_their_limits_are_refused_at_the_header():
    """A frame of 16 million empty lists (16 MB) used to be decoded, seconds of CPU, before the server counted the
    list; each container's length is now checked by msgpack at its header."""
    from vlaperf.serve.protocol import MAX_LIST_LEN, MAX_MAP_LEN

    huge = b"\xdd" + (16_000_000).to_bytes(4, "big") + b"\x90" * 1000
    with pytest.raises(ProtocolError, match="a msgpack list of 16000000 items exceeds the limit of 4096"):
        unpackb(huge)
    with pytest.raises(ProtocolError, match=f"a msgpack map of {MAX_MAP_LEN + 1} keys exceeds the limit"):
        unpackb(msgpack.packb({str(i): 0 for i in range(MAX_MAP_LEN + 1)}))
    assert len(unpackb(msgpack.packb([[]] * MAX_LIST_LEN))) == MAX_LIST_LEN  # at the limit: decoded


def test_a_scalar_past_its_dtype_and_an_unholdable_shape_are_refused():
    """1e10 as float16 used to become inf with only a RuntimeWarning on the server's stderr; a shape with a zero
    dimension and two of 2**39 passed the byte count and failed inside numpy with a message about msgpack."""
    scalar = {b"__npgeneric__": True, b"data": 1e10, b"dtype": "<f2"}
    with pytest.raises(ProtocolError, match=r"^x: numpy scalar 10000000000.0 does not fit dtype <f2"):
        unpackb(msgpack.packb({"x": scalar}, use_bin_type=True))
    empty = {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [0, 2**39, 2**39]}
    with pytest.raises(ProtocolError, match=r"^x: array shape \(0, 549755813888, 549755813888\) is not one numpy can hold"):
        unpackb(msgpack.packb({"x": empty}, use_bin_type=True))
    assert unpackb(msgpack.packb({"x": {**scalar, b"data": 1.5}}, use_bin_type=True))["x"] == np.float16(1.5)


def test_a_message_of_too_many_values_stops_decoding():
    """Within every container's own limit, nested empty lists still made ~16 million objects of a 16 MiB frame
    (seconds of decoding); decoding now stops past MAX_VALUES values, while two camera images sent as nested lists
    of numbers still decode."""
    from vlaperf.serve.protocol import MAX_VALUES

    frame = msgpack.packb({str(i): [[]] * 4096 for i in range(MAX_VALUES // 4096 + 1)})
    with pytest.raises(ProtocolError, match=f"the message holds more than {MAX_VALUES} values"):
        unpackb(frame)
    image = np.zeros((224, 224, 3), np.uint8).tolist()
    decoded = unpackb(msgpack.packb({"observation/image": image, "observation/wrist_image": image}))
    assert np.asarray(decoded["observation/image"]).shape == (224, 224, 3)


def test_an_array_with_text_keys_and_a_number_as_map_key_are_named():
    """An array map packed with text keys (msgpack < 1.0, or use_bin_type=False) was refused later as "an object
    array"; an int map key got msgpack's own wording about strict_map_key."""
    old_style = {"__ndarray__": True, "data": b"\x00", "dtype": "|u1", "shape": [1]}
    with pytest.raises(ProtocolError, match=r"^observation/image: a numpy array sent with text keys .*use_bin_type"):
        unpackb(msgpack.packb({"observation/image": old_style}, use_bin_type=True))
    with pytest.raises(ProtocolError, match="^map keys must be strings, got int$"):
        unpackb(msgpack.packb({"prompt": "a", 7: 1}, use_bin_type=True))


def test_the_client_and_the_protocol_import_without_torch():
    """A robot's side needs only the client: importing it must not pull in torch (session 33 nearly made the
    protocol import vlaperf.inputs, and with it torch, for one text helper)."""
    import subprocess
    import sys

    code = "import sys, vlaperf.serve.client, vlaperf.serve.protocol; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_limits_are_inclusive_and_a_bool_is_not_an_integer_id():
    """Each documented bound admits its own value and refuses the next one: a request_id of MAX_REQUEST_ID_CHARS
    characters, an array of MAX_NDIM dimensions, a message of exactly `max_bytes` bytes. A bool is not an integer
    request_id (msgpack's true would come back as an id the client never sent)."""
    from vlaperf.serve.protocol import MAX_NDIM, MAX_REQUEST_ID_CHARS, valid_request_id

    assert valid_request_id("r" * MAX_REQUEST_ID_CHARS) and not valid_request_id("r" * (MAX_REQUEST_ID_CHARS + 1))
    assert valid_request_id(0) and valid_request_id(-7) and not valid_request_id(True) and not valid_request_id(1.0)
    assert unpackb(_raw_ndarray("<f4", b"\x00" * 4, [1] * MAX_NDIM)).shape == (1,) * MAX_NDIM
    frame = packb(np.zeros(4000, np.uint8))
    assert unpackb(frame, max_bytes=len(frame)).shape == (4000,)
    with pytest.raises(ProtocolError, match=f"message of {len(frame)} bytes exceeds the limit of {len(frame) - 1} bytes"):
        unpackb(frame, max_bytes=len(frame) - 1)


def test_the_value_count_stops_exactly_past_max_values():
    """MAX_VALUES counts every list and map together with its items: {1023 keys: lists of 1023 ints} holds
    1 + 1023 (the map) + 1023 * (1 + 1023) (the lists) = 1023 * 1025 + 1 = 2**20 values, the limit itself, and
    decodes; one more int is one value past it."""
    from vlaperf.serve.protocol import MAX_VALUES

    assert 1023 * 1025 + 1 == MAX_VALUES
    message = {str(i): [0] * 1023 for i in range(1023)}
    assert len(unpackb(msgpack.packb(message))) == 1023
    message["0"].append(0)
    with pytest.raises(ProtocolError, match=f"more than {MAX_VALUES} values"):
        unpackb(msgpack.packb(message))


def test_decoded_bools_are_clean_bytes_and_float_scalars_take_integers():
    """A bool array sent with bytes other than 0/1 decodes to clean 0/1 bytes (re-encoded, e.g. for a remote
    replica, it carries valid numpy bools); a float scalar whose data is a msgpack integer (a client in another
    language writes 3 for 3.0) is that float."""
    out = unpackb(_raw_ndarray("|b1", b"\x00\x01\x07", [3]))
    assert out.tobytes() == b"\x00\x01\x01"
    scalar = unpackb(msgpack.packb({b"__npgeneric__": True, b"data": 3, b"dtype": "<f4"}, use_bin_type=True))
    assert scalar.dtype == np.float32 and scalar == 3.0


def test_a_dtype_with_a_trailing_newline_is_refused_by_the_whitelist():
    """`$` matches before a final newline: "<f4\\n" passed the whitelist, reached numpy, and came back as "not a
    valid msgpack message: data type ... not understood" with no key named. It is refused as a dtype, by key."""
    for dtype in ("<f4\n", "|b1\n"):
        with pytest.raises(ProtocolError, match=r"^observation/state: unsupported array dtype"):
            unpackb(msgpack.packb({"observation/state": {b"__ndarray__": True, b"data": b"\x00" * 4, b"dtype": dtype,
                                                         b"shape": [1]}}, use_bin_type=True))


def test_error_frames_keep_a_zero_id_and_index_and_parse_what_a_server_sends():
    """An integer request_id of 0 and the list index 0 are values, not absent (a client numbering its requests from
    0 got its first error without its id); a JSON error without a message gets an empty one, and JSON that is not an
    error object is a ServerError holding the text."""
    assert parse_error_frame(error_frame("InputError", "m", request_id=0, index=0)) == {
        "error": "InputError", "message": "m", "request_id": 0, "index": 0}
    assert parse_error_frame('{"error": "Overloaded"}') == {"error": "Overloaded", "message": ""}
    for text in ('{"message": "no kind"}', '{"error": 5, "message": "x"}', "[1, 2]"):
        assert parse_error_frame(text) == {"error": "ServerError", "message": text}


def test_printable_cuts_at_its_limit_and_marks_the_cut():
    from vlaperf.serve.protocol import printable

    assert printable("a" * 10, 10) == "a" * 10  # at the limit: whole
    assert printable("a" * 11, 10) == "a" * 9 + "\u2026"  # past it: `limit` characters, the last one the mark
    assert printable("a\nb\x1bc") == "a\\nb\\x1bc"


def test_trailing_bytes_and_truncation_are_told_apart():
    """Two different faults of a frame, each said as such (both were only 'msgpack' to the tests)."""
    frame = packb({"a": 1})
    with pytest.raises(ProtocolError, match="^not a msgpack message: trailing bytes after the first object$"):
        unpackb(frame + b"junk")
    with pytest.raises(ProtocolError, match="^not a valid msgpack message: "):
        unpackb(frame[:-1])
