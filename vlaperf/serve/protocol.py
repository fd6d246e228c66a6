"""The wire format: msgpack with numpy arrays, compatible with openpi-client.

openpi-client (`openpi_client.msgpack_numpy`) sends every numpy array as a msgpack map whose
keys are msgpack *bin* (bytes) strings:

    {b"__ndarray__": True, b"data": <raw bytes, C order>, b"dtype": <dtype.str, e.g. "<f4">,
     b"shape": [d0, d1, ...]}

and every numpy scalar (np.float32(1.5), np.bool_(True), ...) as

    {b"__npgeneric__": True, b"data": <the Python value>, b"dtype": <dtype.str>}

Everything else is plain msgpack (str keys, str, int, float, bool, None, bytes, lists, maps).
This module writes and reads that format. It is written from the format alone; it shares no
code with openpi.

Decoding is strict, because the bytes come from the network:

- Only plain numeric dtypes are accepted: bool, signed and unsigned integers (1, 2, 4, 8
  bytes) and floats (2, 4, 8 bytes), in any byte order; and text (numpy's fixed-width "U" and
  "S") as a 0-d array or a scalar only, decoded to a str or bytes: openpi's transforms hold
  a prompt as np.asarray(prompt), and openpi's msgpack_numpy sends it so. Object, void
  (structured), complex, datetime and every other dtype is refused with ProtocolError.
  Nothing is ever unpickled, imported or evaluated: a dtype string is matched against a
  whitelist before numpy sees it.
- An array's byte count must equal prod(shape) * itemsize exactly; at most 32 dimensions.
- msgpack extension types are refused (msgpack's own timestamp, type -1, decodes to a Timestamp value, which every
  field refuses as of the wrong type); map keys must be str or bytes; nesting is bounded by msgpack itself
  (StackError); the whole message is bounded by `max_bytes`, and each container before it is read: a list at most
  MAX_LIST_LEN items, a map MAX_MAP_LEN keys, a string MAX_STR_BYTES bytes (a frame of 16 million empty lists is
  refused at its first header, not decoded for seconds first), and the message at MAX_VALUES values in all.
- A refused array is named by where it is: "observation/image: unsupported array dtype ..." (a key of the message's
  map, or of a map inside it), with the observation's `request_id` kept for the error frame.
- Decoded arrays are writable copies in native byte order (the message buffer is not kept).

`ProtocolError` is the one exception a caller has to handle for untrusted input.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgpack
import numpy as np

# Keys of openpi-client's numpy extension (msgpack bin strings, not str).
NDARRAY, NPGENERIC, DATA, DTYPE, SHAPE = b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape"

DEFAULT_MAX_MESSAGE_BYTES = 16 * 2**20
MIN_MESSAGE_BYTES = 1024  # the smallest limit a server takes: below it not even an error frame fits
MAX_MESSAGE_BYTES = 4 * 2**30  # the largest limit a server takes: beyond any observation (and msgpack's 32-bit lengths)
MAX_NDIM = 32
# Per-container limits of a decoded message, checked by msgpack at each header. An observation has a few keys and
# arrays as bytes; lists are short (a batch of at most 64 observations, a state, an image given as nested lists of
# at most 4096 pixels a side).
MAX_LIST_LEN, MAX_MAP_LEN, MAX_STR_BYTES = 4096, 1024, 2**20
# Values in one message, lists and maps counted with their items: decoding stops once past it. Without it a 16 MiB
# frame of nested empty lists, each within the limits above, held ~16 million objects and took seconds to decode;
# two camera images sent as nested lists of numbers (no numpy arrays) are ~400,000.
MAX_VALUES = 2**20

# The optional key of an observation that the server echoes in its reply or error frame.
REQUEST_ID_KEY = "request_id"
MAX_REQUEST_ID_CHARS = 256
# Real-time chunking's optional keys of an observation (a server started with --rtc; docs/serving.md): how many
# actions of the last chunk this connection got had been executed when the observation was taken, and how many
# more the robot executes while the next one is computed. openpi's own server ignores keys it does not know.
RTC_EXECUTED_KEY, RTC_DELAY_KEY = "rtc/executed", "rtc/delay"


def valid_request_id(value: Any) -> bool:
    """A request id is a string of at most MAX_REQUEST_ID_CHARS characters or an integer."""
    return isinstance(value, str) and len(value) <= MAX_REQUEST_ID_CHARS or type(value) is int

# byte order (optional) + kind + item size. b = bool, i = signed int, u = unsigned, f = float.
_DTYPE_RE = re.compile(r"[<>=|]?(b1|i1|i2|i4|i8|u1|u2|u4|u8|f2|f4|f8)")  # fullmatch: `$` would admit a final "\n"
_ALLOWED_KINDS = "biuf"
# fixed-width text: byte order + U (UCS-4 code points) or S (bytes) + its width in characters
_TEXT_DTYPE_RE = re.compile(r"[<>=|]?[US][1-9][0-9]{0,6}")


class ProtocolError(ValueError):
    """A message that is not valid vlaperf/openpi msgpack, or holds a refused type. `request_id` / `index`: the
    observation it was found in (its id, where it had a valid one; its place in a list), for the error frame."""

    def __init__(self, message: str, request_id: Any = None, index: int | None = None):
        super().__init__(message)
        self.request_id, self.index = request_id, index


# --------------------------------------------------------------------------- encode


def _check_dtype_for_encode(dtype: np.dtype) -> None:
    if dtype.kind not in _ALLOWED_KINDS or not _DTYPE_RE.fullmatch(dtype.str):
        raise ProtocolError(f"cannot send numpy dtype {dtype.str!r} ({dtype}): only bool, integer and float arrays are allowed")


def _default(obj: Any) -> Any:
    """msgpack `default` hook: numpy arrays and scalars -> openpi's extension maps."""
    if isinstance(obj, np.ndarray):
        if obj.ndim == 0 and obj.dtype.kind in "US":  # openpi's np.asarray(prompt): sent as the text it holds
            return obj.item()
        _check_dtype_for_encode(obj.dtype)
        return {NDARRAY: True, DATA: obj.tobytes(order="C"), DTYPE: obj.dtype.str, SHAPE: list(obj.shape)}
    if isinstance(obj, np.generic):
        _check_dtype_for_encode(obj.dtype)
        return {NPGENERIC: True, DATA: obj.item(), DTYPE: obj.dtype.str}
    raise ProtocolError(f"cannot send an object of type {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """Encode `obj` (dicts, lists, str, numbers, numpy arrays/scalars) as openpi msgpack."""
    try:
        return msgpack.packb(obj, default=_default, use_bin_type=True)
    except ProtocolError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"cannot encode message: {e}") from None


# --------------------------------------------------------------------------- decode


def printable(text: Any, limit: int = 500) -> str:
    """`text` safe for one log line: control characters (a newline in a client's map key would forge a log line)
    escaped, and at most `limit` characters, the cut marked."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _parse_dtype(value: Any) -> np.dtype:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError("array dtype is not an ASCII string") from None
    if not isinstance(value, str):
        raise ProtocolError(f"array dtype must be a string, got {type(value).__name__}")
    if len(value) > 8 or not _DTYPE_RE.fullmatch(value):
        raise ProtocolError(
            f"unsupported array dtype {value[:32]!r}: only bool, signed/unsigned integers and floats are accepted, "
            "and text as a 0-d array (send text as a plain msgpack string)"
        )
    dtype = np.dtype(value)  # safe: value matched the whitelist above
    if dtype.kind not in _ALLOWED_KINDS:  # pragma: no cover - the regex already ensures this
        raise ProtocolError(f"unsupported array dtype {value!r}")
    return dtype


def _text_dtype(value: Any) -> np.dtype | None:
    """The dtype when `value` names fixed-width text of at most MAX_STR_BYTES bytes, else None."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > 10 or not _TEXT_DTYPE_RE.fullmatch(value):
        return None
    dtype = np.dtype(value)  # safe: value matched the whitelist above
    if dtype.itemsize > MAX_STR_BYTES:
        raise ProtocolError(f"text array dtype {value!r} is {dtype.itemsize} bytes wide, above {MAX_STR_BYTES}")
    return dtype


def _decode_text(obj: dict, dtype: np.dtype, generic: bool) -> str | bytes:
    """A 0-d text array or a text scalar (a prompt as openpi's transforms hold it) as a str or bytes."""
    if generic:
        value = obj.get(DATA)
        if not isinstance(value, str if dtype.kind == "U" else bytes):
            raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs a {'str' if dtype.kind == 'U' else 'bytes'}, "
                                f"got {type(value).__name__}")
        return value
    shape = obj.get(SHAPE)
    if not isinstance(shape, (list, tuple)) or len(shape) != 0:
        raise ProtocolError(f"a text array (dtype {dtype.str}) is accepted only 0-d, as np.asarray(prompt) is; got "
                            f"shape {shape if not isinstance(shape, (list, tuple)) else list(shape)[:8]!r}: send "
                            "text as a plain msgpack string")
    data = obj.get(DATA)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        got = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
        raise ProtocolError(f"a 0-d text array of dtype {dtype.str} needs {dtype.itemsize} bytes, got {got}")
    if dtype.kind == "U":  # UCS-4: numpy's .item() fails with a SystemError on a code point past U+10FFFF
        codes = np.frombuffer(data, dtype=np.dtype(dtype.str[0] + "u4"))
        if codes.size and int(codes.max()) > 0x10FFFF:
            raise ProtocolError(f"a 0-d text array of dtype {dtype.str} holds a value past U+10FFFF, not text")
    return np.frombuffer(data, dtype=dtype).item()  # trailing NULs dropped, as numpy does


def _decode_ndarray(obj: dict) -> np.ndarray | str | bytes:
    text = _text_dtype(obj.get(DTYPE))
    if text is not None:
        return _decode_text(obj, text, generic=False)
    dtype = _parse_dtype(obj.get(DTYPE))
    shape = obj.get(SHAPE)
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
        raise ProtocolError(f"array shape must be a list of at most {MAX_NDIM} integers")
    if not all(type(d) is int and 0 <= d < 2**40 for d in shape):
        raise ProtocolError(f"array shape must hold non-negative integers, got {list(shape)[:8]!r}")
    data = obj.get(DATA)
    if not isinstance(data, bytes):
        raise ProtocolError(f"array data must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(f"array of shape {tuple(shape)} and dtype {dtype.str} needs {expected} bytes, got {len(data)}")
    try:
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as e:  # e.g. (0, 2**39, 2**39): no bytes, yet more elements than numpy can index
        raise ProtocolError(f"array shape {tuple(shape)} is not one numpy can hold: {e}") from None
    if dtype.kind == "b":
        # a clean copy: bytes other than 0/1 are not valid numpy bools
        return np.array(arr.view(np.uint8) != 0, dtype=bool).reshape(arr.shape)
    if not dtype.isnative and dtype.itemsize > 1:
        return arr.astype(dtype.newbyteorder("="))  # a native-order copy
    return arr.copy()  # writable and independent of the message buffer


_SCALAR_TYPES = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int)}


def _decode_generic(obj: dict) -> np.generic | str | bytes:
    text = _text_dtype(obj.get(DTYPE))
    if text is not None:
        return _decode_text(obj, text, generic=True)
    dtype = _parse_dtype(obj.get(DTYPE))
    value = obj.get(DATA)
    if type(value) not in _SCALAR_TYPES[dtype.kind]:
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs a {_SCALAR_TYPES[dtype.kind][0].__name__}, "
                            f"got {type(value).__name__}")
    try:
        with np.errstate(over="raise", invalid="raise"):  # 1e10 as float16 would be inf, with only a warning
            return dtype.type(value)
    except (OverflowError, ValueError, FloatingPointError) as e:
        raise ProtocolError(f"numpy scalar {value!r} does not fit dtype {dtype.str}: {e}") from None


def _object_hook(obj: dict) -> Any:
    if NDARRAY in obj:
        return _decode_ndarray(obj)
    if NPGENERIC in obj:
        return _decode_generic(obj)
    if "__ndarray__" in obj or "__npgeneric__" in obj:  # otherwise it fails later as an "object array" of a map
        raise ProtocolError("a numpy array sent with text keys ('__ndarray__'): openpi-client's msgpack_numpy packs "
                            "them as binary (msgpack >= 1.0, use_bin_type=True); update the client's msgpack")
    return obj


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not accepted")


_LIMIT_RE = re.compile(r"^(\d+) exceeds max_(array|map|str|bin|ext)_len\((\d+)\)")
_LIMIT_NAMES = {"array": ("list", "items"), "map": ("map", "keys"), "str": ("string", "bytes"),
                "bin": ("binary", "bytes"), "ext": ("extension", "bytes")}


class _RefusedArray:
    """Stands in, during decoding, for an array or scalar map that was refused: the error is raised once the
    message is decoded, naming the key it sat under (msgpack's hook sees a map, never where it is)."""

    def __init__(self, reason: str):
        self.reason = reason


def _where_refused(payload: Any, first: _RefusedArray) -> ProtocolError:
    """The ProtocolError for a message holding a refused array: "<key>: <reason>" for one at a key of the message
    (or of one observation in a list, "[i] <key>"), or of a map one level further in ("images/cam_high")."""
    observations = [(None, payload)] if isinstance(payload, dict) else list(enumerate(payload)) if isinstance(payload, list) else []
    for index, obs in observations:
        if not isinstance(obs, dict):
            continue
        rid = obs.get(REQUEST_ID_KEY)
        rid = rid if valid_request_id(rid) else None
        for key, value in obs.items():
            inner = value.items() if isinstance(value, dict) else ()
            # a client's key, with any control character escaped: the message goes into the server's log
            for path, found in [(printable(key, 80), value), *((printable(f"{key}/{k}", 80), v) for k, v in inner)]:
                if isinstance(found, _RefusedArray):
                    where = f"[{index}] " if index is not None else ""
                    return ProtocolError(f"{where}{path}: {found.reason}", rid, index)
    return ProtocolError(first.reason)  # deeper than that: the reason alone


def unpackb(data: bytes | bytearray | memoryview, max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Decode one message. Raises ProtocolError (only) for anything malformed or refused."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"expected a binary message, got {type(data).__name__}")
    if max_bytes is not None and len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    refused: list[_RefusedArray] = []
    values = [0]  # lists and maps with their items, counted as msgpack hands each container over

    def count(n: int) -> None:
        values[0] += n + 1
        if values[0] > MAX_VALUES:
            raise ProtocolError(f"the message holds more than {MAX_VALUES} values (lists and maps counted with their "
                                "items); send arrays as numpy arrays")

    def object_hook(obj: dict) -> Any:
        count(len(obj))
        try:
            return _object_hook(obj)
        except ProtocolError as e:
            refused.append(_RefusedArray(str(e)))
            return refused[-1]

    def list_hook(items: list) -> list:
        count(len(items))
        return items

    try:
        payload = msgpack.unpackb(
            data,
            object_hook=object_hook,
            list_hook=list_hook,
            ext_hook=_refuse_ext,
            raw=False,
            strict_map_key=True,
            use_list=True,
            timestamp=0,
            max_str_len=MAX_STR_BYTES,
            max_bin_len=max_bytes if max_bytes is not None else len(data),
            max_array_len=MAX_LIST_LEN,
            max_map_len=MAX_MAP_LEN,
            max_ext_len=len(data),
        )
    except ProtocolError:
        raise
    except msgpack.ExtraData:
        raise ProtocolError("not a msgpack message: trailing bytes after the first object") from None
    except msgpack.StackError:
        raise ProtocolError("msgpack message is nested too deeply") from None
    except (ValueError, TypeError, KeyError, OverflowError, MemoryError, UnicodeDecodeError) as e:
        # msgpack.FormatError / OutOfData are ValueError subclasses.
        reason = str(e) or type(e).__name__
        over = _LIMIT_RE.match(reason)
        if over:  # one of the container limits above, said in the message's terms
            kind, unit = _LIMIT_NAMES[over.group(2)]
            raise ProtocolError(f"a msgpack {kind} of {over.group(1)} {unit} exceeds the limit of {over.group(3)}") from None
        if "is not allowed for map key" in reason:  # msgpack's strict_map_key wording
            raise ProtocolError(f"map keys must be strings, got {reason.split(' is not', 1)[0]}") from None
        if reason in ("FormatError", "OutOfData") or reason.startswith("Unpack failed"):  # msgpack names no more
            reason = "the bytes are not msgpack, or are cut short (send the observation packed with msgpack, as " \
                     "openpi-client's msgpack_numpy.packb does)"
        raise ProtocolError(f"not a valid msgpack message: {reason}") from None
    except Exception as e:  # anything else msgpack may raise on garbage
        raise ProtocolError(f"not a valid msgpack message: {type(e).__name__}: {e}") from None
    if refused:
        raise _where_refused(payload, refused[0])
    return payload


# ----------------------------------------------------------------------- error frames


def error_frame(error_type: str, message: str, request_id: str | None = None, index: int | None = None) -> str:
    """The error reply: a websocket *text* frame holding one JSON object.

    openpi-client treats any text (str) reply as a server error and raises
    `RuntimeError("Error in inference server:\n" + text)`, so real openpi clients raise with
    this JSON in the message; vlaperf's own client parses it (`parse_error_frame`).
    """
    body: dict[str, Any] = {"error": error_type, "message": message}
    if request_id is not None:
        body["request_id"] = request_id
    if index is not None:
        body["index"] = index
    return json.dumps(body)


def parse_error_frame(text: str) -> dict[str, Any]:
    """{"error", "message", ...} from an error frame; any other text becomes
    {"error": "ServerError", "message": text} (e.g. an openpi server's traceback)."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        body.setdefault("message", "")
        return body
    return {"error": "ServerError", "message": text}
