"""CPU tests of vlaperf.profile.syncs: host reads of the reference loop (the CPU standing in
for the device), none for the for_loop engine, and the CUDA sync-debug path via fakes."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from vlaperf.engine import Engine
from vlaperf.inputs import make_example, random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.policy import Policy
from vlaperf.profile.syncs import CUDA_SYNC_MESSAGE, CudaSyncCounter, HostReadMode, count_syncs, format_syncs
from vlaperf.workloads import get_workload

WHILE_LINE = "while time >= -dt / 2"


@pytest.fixture(scope="module")
def tiny():
    w = get_workload("tiny")
    model = build_model("tiny")
    return model, w, random_observation(w, model.config), random_noise(w, model.config)


@pytest.mark.parametrize("steps", [1, 4, 6])
def test_reference_loop_reads_the_device_n_plus_1_times(tiny, steps):
    model, w, obs, noise = tiny
    rep = count_syncs(lambda: model.sample_actions(obs, noise, steps), device="cpu", calls=2, treat_as_device=True)
    assert rep["per_call"] >= steps + 1
    top = rep["sites"][0]
    assert top["file"].replace("\\", "/").endswith("vlaperf/models/pi0.py")
    assert top["code"].startswith(WHILE_LINE)
    assert top["op"] == "Tensor.__bool__"
    assert top["count"] == 2 * (steps + 1) and top["per_call"] == steps + 1
    with open(top["file"]) as f:
        assert f.readlines()[top["line"] - 1].strip().startswith(WHILE_LINE)
    assert WHILE_LINE in format_syncs(rep)


def test_for_loop_engine_has_no_host_reads(tiny):
    model, w, obs, noise = tiny
    for levers in ("for_loop", "best"):
        engine = Engine(model, levers)
        rep = count_syncs(lambda: engine.sample_actions(obs, noise, w.steps), device="cpu", calls=2)
        assert rep["treat_as_device"] is True  # the default on the CPU
        assert rep["total"] == 0, rep["sites"]


def test_engine_without_for_loop_keeps_the_while_reads(tiny):
    model, w, obs, noise = tiny
    engine = Engine(model, "sdpa")
    rep = count_syncs(lambda: engine.sample_actions(obs, noise, 3), device="cpu")
    assert rep["per_call"] == 4
    assert rep["sites"][0]["file"].replace("\\", "/").endswith("vlaperf/engine/engine.py")


def test_plan_reads_masks_without_host_metadata(tiny):
    model, w, obs, noise = tiny
    bare = dataclasses.replace(obs, host_image_valid=None, host_prompt_len=None)
    engine = Engine(model, "for_loop,skip_masked_images,trim_prompt_padding")
    rep = count_syncs(lambda: engine.sample_actions(bare, noise, 2), device="cpu")
    assert rep["per_call"] == 2
    assert {s["op"] for s in rep["sites"]} == {"Tensor.tolist", "Tensor.cpu"}  # the image mask, the prompt's
    assert all(s["file"].replace("\\", "/").endswith("vlaperf/engine/prefix.py") for s in rep["sites"])


def test_policy_mode_has_exactly_the_expected_read(tiny):
    model, w, obs, noise = tiny
    policy = Policy(model, Engine(model, "best").sample_actions, w, noise=noise)
    example = make_example(w, image_size=model.config.vision.image_size)
    rep = count_syncs(lambda: policy.infer(example), device="cpu", expected_per_call=1)
    assert rep["per_call"] == 1 and rep["hidden_per_call"] == 0
    assert rep["sites"][0]["op"] == "Tensor.cpu"


def test_host_read_mode_ops():
    dev = torch.arange(6.0)  # created outside the mode: an input, counts as device data
    with HostReadMode("cpu", treat_as_device=True) as mode:
        dev.sum().item()
        dev.tolist()
        dev[dev > 2]  # boolean-mask index
        torch.nonzero(dev)
        bool(dev.sum() > 0)
        float(dev[0])
        dev.cpu()
        dev.to("cpu")  # placement on "the device" when the CPU stands in for it: not a read
        host = torch.tensor(0.5)  # host-born (no device argument)
        host.item()
        (host * 2).item()
        torch.tensor(0.5, device="cpu").item()  # explicitly on the device: counts
        dev.sum()  # no read
    ops = [e.op for e in mode.events]
    assert ops == ["Tensor.item", "Tensor.tolist", "Tensor.__getitem__", "torch.nonzero", "Tensor.__bool__",
                   "Tensor.__float__", "Tensor.cpu", "Tensor.item"]
    assert all(e.file == __file__ for e in mode.events)


def test_host_read_mode_ignores_cpu_without_flag():
    with HostReadMode("cpu") as mode:
        torch.arange(3.0).sum().item()
    assert mode.events == []


def _fake_sync_debug():
    state = {"mode": 0, "history": []}

    def set_mode(m):
        state["history"].append(m)
        state["mode"] = m

    return state, set_mode, lambda: state["mode"]


def _synchronizing_op():
    warnings.warn(CUDA_SYNC_MESSAGE, UserWarning)  # what torch's C++ TORCH_WARN raises


def test_cuda_counter_catches_sync_warnings_with_source_line():
    state, set_mode, get_mode = _fake_sync_debug()
    counter = CudaSyncCounter(set_mode=set_mode, get_mode=get_mode)
    with counter:
        assert state["mode"] == "warn"
        for _ in range(3):
            _synchronizing_op()
        with warnings.catch_warnings(record=True) as other:
            warnings.simplefilter("always")
            warnings.warn("unrelated", UserWarning)
    assert state["history"] == ["warn", 0]  # the previous mode is restored
    assert len(counter.events) == 3
    e = counter.events[0]
    assert e.kind == "cuda_sync" and e.function == "_synchronizing_op" and e.file == __file__
    assert e.code == "warnings.warn(CUDA_SYNC_MESSAGE, UserWarning)  # what torch's C++ TORCH_WARN raises"
    assert len(other) == 1  # other warnings are not swallowed


def test_cuda_counter_passes_other_warnings_through():
    state, set_mode, get_mode = _fake_sync_debug()
    with pytest.warns(UserWarning, match="something else"):
        with CudaSyncCounter(set_mode=set_mode, get_mode=get_mode) as counter:
            warnings.warn("something else", UserWarning)
    assert counter.events == []


def test_count_syncs_with_the_cuda_counter_interface():
    state, set_mode, get_mode = _fake_sync_debug()

    def policy_call():
        for _ in range(5):
            _synchronizing_op()

    counter = CudaSyncCounter(set_mode=set_mode, get_mode=get_mode)
    rep = count_syncs(policy_call, device="cpu", calls=2, warmup=0, counter=counter)
    assert rep["source"] == "cuda_sync"
    assert rep["total"] == 10 and rep["per_call"] == 5
    (site,) = rep["sites"]
    assert site["function"] == "_synchronizing_op" and site["per_call"] == 5


def test_the_profiling_guides_example_names_the_reference_loops_line():
    """docs/profiling.md shows `vlaperf syncs`' output for the reference: the source line it names must be the line
    of the reference's `while` in vlaperf/models/pi0.py (it drifted once as the file grew)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    lines = (root / "vlaperf/models/pi0.py").read_text().splitlines()
    loop = [i + 1 for i, text in enumerate(lines) if text.strip().startswith("while time >= -dt / 2:")]
    assert len(loop) == 1, loop
    assert f"vlaperf/models/pi0.py:{loop[0]}  Tensor.__bool__" in (root / "docs/profiling.md").read_text()


def test_where_and_repeat_interleave_are_host_reads():
    """Torch.where(cond) and repeat_interleave with tensor repeats read the device."""
    import torch
    from vlaperf.profile.syncs import HostReadMode
    dev = torch.arange(6.0)
    reps = torch.tensor([1, 2, 1, 1, 1, 1], device="cpu")
    ops = []
    for fn in (lambda: torch.where(dev > 2), lambda: torch.repeat_interleave(dev, reps),
               lambda: torch.repeat_interleave(dev, reps, output_size=7)):  # the last: size given, no read
        with HostReadMode("cpu", treat_as_device=True) as mode:
            fn()
        ops.append([e.op for e in mode.events])
    assert ops == [["torch.where"], ["torch.repeat_interleave"], []]


def test_a_boolean_mask_write_of_a_host_value_is_masked_fill_and_reads_nothing():
    """`x[mask] = 0.0` (one mask, one host value) is run by torch as masked_fill_, with no nonzero and no sync on a
    GPU (index_put_'s canDispatchToMaskedFill): the mode counted it as a host read, so an attention mask written
    with `scores[~mask] = float("-inf")` showed up as a sync per call. A read through the mask, a device value,
    several values, two masks or an accumulating index_put_ still run nonzero, and are still counted."""
    dev = torch.arange(6.0)
    mask = dev > 2
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x = dev.clone()
        x[mask] = 0.0
        x[~mask] = float("-inf")
        x[mask] = torch.tensor(1.0)  # host-born: a host value
        x.index_put_((mask,), torch.tensor(2.0))
        x[:, None][mask] = 3
    assert [e.op for e in mode.events] == []
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x = dev.clone()
        x[mask] = dev.max()  # a value on the device
        x[mask] = torch.ones(3)  # several values
        x.index_put_((mask,), torch.tensor(2.0), accumulate=True)
        x[mask]  # a read
    assert [e.op for e in mode.events] == ["Tensor.__setitem__", "Tensor.__setitem__", "Tensor.index_put_",
                                           "Tensor.__getitem__"]


def test_in_on_a_device_tensor_is_a_host_read():
    """`v in t` reads the device (torch's __contains__ calls .item() inside, where the mode cannot see it): it was
    missed, and a policy's `if token in tokens:` looked sync-free."""
    dev = torch.arange(6.0)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        found = 2.0 in dev
        missing = 7.0 in torch.arange(6.0)  # host-born: no read
    assert found and not missing
    assert [(e.op, e.file) for e in mode.events] == [("Tensor.__contains__", __file__)]


def test_copy_into_host_tensor_is_a_host_read():
    """Copying device data into a host tensor (host.copy_(dev)) is a host read."""
    import torch
    from vlaperf.profile.syncs import HostReadMode
    dev = torch.arange(6.0)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        host = torch.empty(6)  # host-born
        host.copy_(dev)
    assert [e.op for e in mode.events] == ["Tensor.copy_"]


def test_what_host_born_tensors_carry_and_what_device_tensors_pass_on():
    """With the CPU standing in for the device: indexing a host tensor with a host mask reads nothing, a device
    mask (or device data) makes it a read; an op mixing host and device tensors gives device data; as_tensor of
    a device tensor is still device data (only host data without a device argument is host-born)."""
    dev = torch.arange(6.0)  # an input: device data
    with HostReadMode("cpu", treat_as_device=True) as mode:
        host = torch.arange(4.0)  # host-born
        host[host > 1]  # host mask on host data: no read
        assert mode.events == []
        dev[dev > 2]  # a device mask: a read
        (host + dev[:4]).sum().item()  # mixed: device data
        torch.as_tensor(dev, dtype=torch.float64).sum().item()  # a new tensor made from device data
        torch.as_tensor([1.0, 2.0]).sum().item()  # host data, no device argument: host-born
    assert [e.op for e in mode.events] == ["Tensor.__getitem__", "Tensor.item", "Tensor.item"]


def test_count_syncs_runs_its_warm_up_unwatched_and_drops_host_to_device_events():
    """The warm-up calls run before the counter is on (a lazy first-call read is not counted); a counter's
    host_to_device events are not syncs and stay out of the total."""
    from vlaperf.profile.syncs import SyncEvent

    dev = torch.arange(3.0)
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            dev.sum().item()  # first call only: lazy initialisation

    rep = count_syncs(fn, device="cpu", warmup=2, calls=3)
    assert len(calls) == 5 and rep["total"] == 0 and rep["calls"] == 3

    class Counter:
        kind = "custom"

        def __enter__(self):
            self.events = []
            return self

        def __exit__(self, *exc):
            self.events += [SyncEvent("upload", "host_to_device", None, None, None, None),
                            SyncEvent("read", "host_read", None, None, None, None)]

    rep = count_syncs(lambda: None, device="cpu", warmup=0, counter=Counter())
    assert rep["total"] == 1 and [s["op"] for s in rep["sites"]] == ["read"] and rep["source"] == "custom"


def test_cuda_counter_restores_the_mode_it_found():
    state, set_mode, get_mode = _fake_sync_debug()
    state["mode"] = "error"  # e.g. a test suite that runs with syncs as errors
    with CudaSyncCounter(set_mode=set_mode, get_mode=get_mode):
        assert state["mode"] == "warn"
    assert state["history"] == ["warn", "error"] and state["mode"] == "error"


def test_sites_are_grouped_by_line_most_frequent_first_with_counts_per_call():
    from vlaperf.profile.syncs import group_events

    dev = torch.arange(3.0)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        for _ in range(2):
            dev.sum().item()  # first seen, less often
            for _ in range(3):
                dev.tolist()
    sites = group_events(mode.events, calls=2)
    assert [(s["op"], s["count"], s["per_call"]) for s in sites] == [("Tensor.tolist", 6, 3.0), ("Tensor.item", 2, 1.0)]
    assert sites[0]["code"] == "dev.tolist()" and sites[0]["function"] == \
        "test_sites_are_grouped_by_line_most_frequent_first_with_counts_per_call"


def test_to_the_cpu_standing_in_for_the_device_keeps_device_data():
    """With the CPU standing in for the device, .to(cpu) places data on the device (only .cpu() reads it back):
    device data converted by .to("cpu", float64) stayed on the device in name only and its reads were missed,
    while .to(float64) of the same data counted; host data placed with .to(cpu) or .to(<a tensor>) is device data."""
    dev = torch.arange(6.0)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        dev.to("cpu", torch.float64).sum().item()
        dev.to(device=torch.device("cpu"), dtype=torch.float64).sum().item()
        dev.to(torch.float64).sum().item()
        torch.ones(2).to("cpu", torch.float64).sum().item()
        torch.ones(2).to(torch.zeros(1, dtype=torch.float64)).sum().item()
        torch.ones(2).to(torch.float64).sum().item()  # host data, no device named: still host-born
    assert [e.op for e in mode.events] == ["Tensor.item"] * 5


def test_format_syncs_and_the_cpu_without_treat_as_device():
    """The summary line says expected and hidden reads; at most `limit` sites are listed, and a line says how many
    more there are (the result file holds them all). Without treat_as_device the CPU is host memory: even an input
    tensor's reads are not syncs."""
    from vlaperf.profile.syncs import format_syncs

    sites = [{"per_call": 1.0, "location": f"f.py:{i}", "op": "Tensor.item", "code": f"line {i}"} for i in range(20)]
    report = {"per_call": 3.0, "source": "host_read", "device": "cpu", "calls": 2, "expected_per_call": 1,
              "hidden_per_call": 2.0, "sites": sites, "note": None}
    lines = format_syncs(report, limit=5).splitlines()
    assert lines == ["3 host syncs per call (host_read, cpu, 2 calls); 1 expected (reading the actions), 2 hidden",
                     *(f"       1/call  f.py:{i}  Tensor.item  | line {i}" for i in range(5)),
                     "  (15 more sites not listed; --json writes them all)"]
    assert format_syncs(report, limit=19).splitlines()[-1] == "  (1 more site not listed; --json writes them all)"
    assert format_syncs(report, limit=20).splitlines()[-1].endswith("f.py:19  Tensor.item  | line 19")  # all listed
    dev = torch.arange(3.0)  # an input, made outside the mode
    with HostReadMode("cpu") as mode:
        dev.sum().item()
    assert mode.events == []


def test_sites_in_vlaperf_are_named_by_their_package_path_wherever_the_command_runs(tmp_path, monkeypatch):
    """A sync site in vlaperf's own code reads vlaperf/<module>.py:<line> as the docs print it, from any working
    directory (from the parent of the checkout it read <checkout>/vlaperf/...); other files stay relative to it."""
    import os

    import vlaperf
    from vlaperf.profile.syncs import _short

    pi0 = os.path.join(os.path.dirname(vlaperf.__file__), "models", "pi0.py")
    for cwd in (os.path.dirname(os.path.dirname(os.path.dirname(vlaperf.__file__))), str(tmp_path)):
        monkeypatch.chdir(cwd)
        assert _short(pi0, 7) == "vlaperf/models/pi0.py:7"
    (tmp_path / "my_policy.py").write_text("")
    assert _short(str(tmp_path / "my_policy.py"), 3) == "my_policy.py:3"


def test_the_cpu_without_treat_as_device_says_nothing_was_watched():
    """On the CPU without treat_as_device the mode watches no tensor, so the 0 it reports is no measurement: the
    note says so, and does not send the reader to source='cuda' (a CPU run cannot use it)."""
    dev = torch.arange(3.0)
    rep = count_syncs(lambda: dev.sum().item(), device="cpu", calls=1, warmup=0, source="mode", treat_as_device=False)
    assert rep["per_call"] == 0
    assert rep["note"].startswith("nothing was watched") and "source='cuda'" not in rep["note"]
    assert "nothing was watched" in format_syncs(rep)
    counted = count_syncs(lambda: dev.sum().item(), device="cpu", calls=1, warmup=0, treat_as_device=True)
    assert counted["per_call"] == 1 and counted["note"].startswith("counted on the CPU as if it were the device")


def test_a_slice_bounded_by_a_device_tensor_is_a_host_read():
    """x[:n] with n on the device reads n on the host (its __index__, inside torch, where the mode is off): a read,
    in a tuple index and a write too; a Python bound or a host-born tensor bound reads nothing."""
    x = torch.arange(10.0)
    n = torch.tensor(3, device="cpu")  # placed on the device (the CPU standing in for it)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x[:n]
        x[None, 1:n]
        x.clone()[:n] = 0.0
        x[:3]
        x[: torch.tensor(3)]  # host-born: no device data read
    assert [e.op for e in mode.events] == ["Tensor.__getitem__", "Tensor.__getitem__", "Tensor.__setitem__"]
    assert all(e.file == __file__ for e in mode.events)


def test_a_device_tensor_passed_as_a_size_is_a_host_read():
    """torch.zeros(n), x.view(n, -1), x.narrow(0, 0, n), ... with n on the device read n on the host (torch's argument
    parser calls .item() on it, inside torch, where the mode is off, as for x[:n]'s bound): they were missed. Sizes
    that are host values (ints, .shape, .size(), len(), a host-born tensor) read nothing, nor does the input tensor
    of a method or an out= tensor; range(n) reads through n's __index__, which the mode sees."""
    x = torch.arange(12.0)
    n = torch.tensor(3, device="cpu")  # placed on the device (the CPU standing in for it)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        torch.zeros(n)
        torch.empty(n, 4, dtype=torch.float32)
        torch.ones(size=(n,))
        torch.full((2,), n)  # a fill value is a host number too
        torch.arange(n)
        torch.linspace(0, 1, n)
        x.narrow(0, 0, n)
        x.view(n, -1)
        x.reshape((n, 4))
        torch.ones(1, 2).expand(n, 2)
        x.repeat(n)
        x.new_zeros(n)
        x.unflatten(0, (n, -1))
        list(range(n))
    assert [e.op for e in mode.events] == [
        "torch.zeros", "torch.empty", "torch.ones", "torch.full", "torch.arange", "torch.linspace", "Tensor.narrow",
        "Tensor.view", "Tensor.reshape", "Tensor.expand", "Tensor.repeat", "Tensor.new_zeros", "Tensor.unflatten",
        "Tensor.__index__"]
    assert all(e.file == __file__ for e in mode.events)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        torch.zeros(3)
        torch.zeros(x.shape)
        torch.zeros(x.size(0), len(x))
        x.view(x.shape[0] // 4, -1)
        x.narrow(0, 0, 3)
        torch.arange(torch.tensor(3))  # host-born: no device data read
        torch.zeros(3, out=torch.empty(3, device="cpu"))  # a device tensor, but as the output, not a size
        torch.full_like(x, 1.0)
        x.expand(2, 12)
    assert mode.events == []


def test_a_0_dim_integer_device_tensor_in_an_index_is_a_host_read():
    """x[n] and x[:, n] with n a 0-dim integer tensor on the device select with n read by .item() (torch's slicing,
    inside torch, where the mode is off), as x[:n] does; they were missed. So does a 0-dim bool one, in a write of
    a host value too (x[b] = 0.0 is read before any masked_fill). A 1-element index of one dimension is gathered on
    the device, and a host-born or Python index reads nothing."""
    x = torch.arange(12.0).reshape(3, 4)
    n = torch.tensor(1, device="cpu")  # placed on the device (the CPU standing in for it)
    b = torch.tensor(True, device="cpu")
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x[n]
        x[:, n]
        x.clone()[n] = 0.0
        x.clone()[b] = 0.0
    assert [e.op for e in mode.events] == ["Tensor.__getitem__", "Tensor.__getitem__", "Tensor.__setitem__",
                                           "Tensor.__setitem__"]
    assert all(e.file == __file__ for e in mode.events)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x[n.reshape(1)]  # advanced indexing: a gather on the device
        x[torch.tensor(1)]  # host-born: no device data read
        x[1, 2]
        x[x.shape[0] - 1]
    assert mode.events == []


def test_a_device_tensor_where_an_op_takes_a_number_is_a_host_read():
    """x.select(0, n), x.topk(n), torch.cat(xs, dim=n), F.pad(x, (0, n)), x.add(y, alpha=v), ... with n, v on the
    device: torch's argument parser reads the tensor with .item() (inside torch, where the mode is off), as for a
    size. Which arguments take numbers comes from the op's schemas, by position (after self for a method, a lone
    size taking the rest: x.view(4, n)) and by keyword; these were missed. Where any overload takes a tensor as it
    is (x.add(v), torch.max(x, n), x.clamp(min=v), x.index_select(0, n)), nothing is read, and nothing counts."""
    import torch.nn.functional as F

    x = torch.arange(24.0).reshape(4, 6)
    n = torch.tensor(1, device="cpu")  # placed on the device (the CPU standing in for it)
    v = torch.tensor(0.5, device="cpu")
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x.select(0, n)
        torch.select(x, dim=0, index=n)
        x.topk(n)
        x.kthvalue(n)
        x.roll(n)
        x.chunk(n + 1)
        F.pad(x, (0, n))
        x.unsqueeze(n)
        x.transpose(0, n)
        x.movedim(n, 0)
        x.flatten(n - 1)
        torch.cat([x, x], dim=n)
        x.softmax(n)
        F.softmax(x, dim=n)
        x.sum(n)
        x.permute(n, 0)
        x.view(4, n * 6)  # a size given as varargs, the tensor second
        x.size(n)
        x.add(x, alpha=v)
        torch.scalar_tensor(v)
        F.dropout(x, v)
    assert [e.op for e in mode.events] == [
        "Tensor.select", "torch.select", "Tensor.topk", "Tensor.kthvalue", "Tensor.roll", "Tensor.chunk", "pad",
        "Tensor.unsqueeze", "Tensor.transpose", "Tensor.movedim", "Tensor.flatten", "torch.cat", "Tensor.softmax",
        "softmax", "Tensor.sum", "Tensor.permute", "Tensor.view", "Tensor.size", "Tensor.add", "torch.scalar_tensor",
        "dropout"]
    assert all(e.file == __file__ for e in mode.events)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x.add(v)  # a tensor operand, not a Scalar
        x * v
        torch.max(x, n)  # the elementwise maximum with a tensor, not a dim
        x.clamp(min=v)
        torch.where(x > 2, x, v)
        x.index_select(0, n)
        x.clone().fill_(v)
        torch.stack([n, n])  # the way to build a tensor of device scalars
        torch.polygamma(1, x)
        torch.einsum("ij,kj->ik", x, x)
        x.select(0, torch.tensor(1))  # host-born: no device data read
        x.select(0, 1)
    assert mode.events == []


def test_a_tensor_built_from_device_scalars_is_a_host_read():
    """torch.tensor([n, m]) (as_tensor, asarray, x.new_tensor) with n on the device converts each device tensor in
    the data to a Python number (.item(), inside torch): missed before. torch.tensor(n) copies n as it is, on the
    device, and host-born scalars in the data are host values."""
    x = torch.arange(6.0)
    n = torch.tensor(2, device="cpu")  # placed on the device (the CPU standing in for it)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        torch.tensor([n, 3])
        torch.tensor([[n, 3], [4, 5]], device="cpu")
        torch.as_tensor([n])
        torch.asarray((n,))
        x.new_tensor([n])
    assert [e.op for e in mode.events] == ["torch.tensor", "torch.tensor", "torch.as_tensor", "torch.asarray",
                                           "Tensor.new_tensor"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(<a tensor>) recommends clone().detach()
        with HostReadMode("cpu", treat_as_device=True) as mode:
            torch.tensor(n)
            torch.as_tensor(n)
            x.new_tensor(n)
            torch.tensor([torch.tensor(2), 3])  # host-born
            torch.tensor([2, 3])
    assert mode.events == []


def test_a_uint8_mask_is_read_like_a_boolean_one():
    """A uint8 index tensor is an old-style (deprecated) boolean mask: torch runs nonzero on it as on a bool mask,
    and reads a 0-dim one with .item(); both were missed (only torch.bool counted)."""
    x = torch.arange(24.0).reshape(4, 6)
    m8 = torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device="cpu")
    b8 = torch.tensor(1, dtype=torch.uint8, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # indexing with uint8 is deprecated
        with HostReadMode("cpu", treat_as_device=True) as mode:
            x[m8]
            x[m8, 0]
            x.clone()[m8] = torch.zeros(2, 6)
            x[b8]
            x.clone()[b8] = 0.0
        assert [e.op for e in mode.events] == ["Tensor.__getitem__", "Tensor.__getitem__", "Tensor.__setitem__",
                                               "Tensor.__getitem__", "Tensor.__setitem__"]
        with HostReadMode("cpu", treat_as_device=True) as mode:
            host = torch.arange(4.0)
            host[torch.tensor([1, 0, 1, 0], dtype=torch.uint8)]  # host mask on host data: no read
            x[torch.tensor([0, 1])]  # an integer index: a gather on the device
        assert mode.events == []


def test_a_list_index_holding_device_scalars_is_a_host_read():
    """x[[n, 1]] is x[n, 1] to torch (a list holding a tensor is taken as a tuple): n is read with .item(); a list
    inside the index (x[[0, n], 1]) becomes an index tensor the way torch.tensor builds one, reading each device
    tensor in it. Both were missed. 1-dim tensors in a list index are gathered on the device, as in a tuple."""
    x = torch.arange(24.0).reshape(4, 6)
    n = torch.tensor(1, device="cpu")  # placed on the device (the CPU standing in for it)
    idx = torch.tensor([0, 1], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a non-tuple sequence as an index is deprecated
        with HostReadMode("cpu", treat_as_device=True) as mode:
            x[[n, 1]]
            x[[0, n], 1]
            x.clone()[[n, 1]] = 0.0
        assert [e.op for e in mode.events] == ["Tensor.__getitem__", "Tensor.__getitem__", "Tensor.__setitem__"]
        with HostReadMode("cpu", treat_as_device=True) as mode:
            x[[n.reshape(1), 1]]
            x[[idx, idx]]
            x[[0, 1], 1]
            x[[torch.tensor(1), 1]]  # host-born
        assert mode.events == []


def test_the_schema_of_an_op_is_looked_up_once(monkeypatch):
    """The mode runs on every torch call: which arguments of an op take numbers is read from its schemas once per
    function, then cached."""
    from vlaperf.profile import syncs

    calls = []
    real = torch._C._jit_get_schemas_for_operator
    monkeypatch.setattr(syncs, "_SLOTS", {})
    monkeypatch.setattr(torch._C, "_jit_get_schemas_for_operator", lambda name: calls.append(name) or real(name))
    x = torch.arange(6.0)
    with HostReadMode("cpu", treat_as_device=True):
        for _ in range(3):
            x.roll(1)
            torch.roll(x, 1)
    assert calls == ["aten::roll", "aten::roll"]  # Tensor.roll, torch.roll


def _local_scalar_reads(fn) -> int:
    """How many times torch read a tensor's value on the host (aten::_local_scalar_dense, what .item() runs) in fn."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


def test_a_0_dim_device_value_of_masked_fill_or_index_fill_is_a_host_read():
    """x.masked_fill(mask, v) and x.index_fill(0, idx, v) with v a 0-dim tensor on the device read v with .item() inside
    the op (CUDA's masked_fill__cuda, and the index_fill_ CPU and CUDA share, fill with a host number), where the mode
    is off: they were missed. A Python number value goes to the Scalar overload and reads nothing; a value on the host
    (host-born) is read from host memory, no sync."""
    x = torch.arange(12.0).reshape(6, 2)
    mask = x > 3
    idx = torch.tensor([1], device="cpu")
    v = torch.tensor(0.5, device="cpu")  # placed on the device (the CPU standing in for it)
    reads = [lambda: x.masked_fill(mask, v), lambda: x.clone().masked_fill_(mask, v),
             lambda: torch.masked_fill(x, mask, value=v), lambda: x.index_fill(0, idx, v),
             lambda: x.clone().index_fill_(0, idx, value=v)]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        for fn in reads:
            fn()
    assert [e.op for e in mode.events] == ["Tensor.masked_fill", "Tensor.masked_fill_", "torch.masked_fill",
                                           "Tensor.index_fill", "Tensor.index_fill_"]
    assert all(e.file == __file__ for e in mode.events)
    assert [_local_scalar_reads(fn) for fn in reads] == [1] * 5  # torch's own count: each reads v once
    with HostReadMode("cpu", treat_as_device=True) as mode:
        x.masked_fill(mask, 0.5)
        x.masked_fill(mask, torch.tensor(0.5))  # host-born
        x.index_fill(0, idx, 1.0)
        torch.where(mask, x, v)  # the way to fill with a device value
    assert mode.events == []
    assert _local_scalar_reads(lambda: x.masked_fill(mask, 0.5)) == 0


def test_one_hot_without_num_classes_is_a_host_read():
    """F.one_hot(t) without num_classes sizes its output from t.max().item(), inside the op, on a GPU too: it was
    missed. With num_classes given a GPU reads nothing (torch's range checks read t on the CPU only, so the CPU's own
    count, 2 reads either way, is no guide here); a device tensor as num_classes is read as any number is."""
    import torch.nn.functional as F

    t = torch.tensor([0, 2, 1], device="cpu")  # placed on the device (the CPU standing in for it)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        F.one_hot(t)
        F.one_hot(t, num_classes=-1)
        torch.nn.functional.one_hot(t, -1)
        F.one_hot(t, t.max() + 1)
    assert [e.op for e in mode.events] == ["one_hot"] * 4
    assert all(e.file == __file__ for e in mode.events)
    with HostReadMode("cpu", treat_as_device=True) as mode:
        F.one_hot(t, 4)
        F.one_hot(t, num_classes=3)
        F.one_hot(torch.tensor([0, 2, 1]))  # host-born
        F.one_hot(t[:0], 4)  # empty: nothing to read
    assert mode.events == []


def test_a_device_tensor_as_interpolates_size_or_scale_factor_is_a_host_read():
    """F.interpolate has no aten op of its name, so the schemas said nothing of it: its size goes on to upsample_*'s
    output_size, where the argument parser reads a device tensor with .item(), and a scale_factor it recomputes is read
    by its own int(size * scale_factor); both inside torch, where the mode is off. They were missed (so were
    nn.Upsample and F.upsample, which call it). Host sizes, and a host-born tensor, read nothing."""
    import torch.nn.functional as F

    img = torch.rand(1, 1, 4, 4)
    n = torch.tensor(3, device="cpu")  # placed on the device (the CPU standing in for it)
    s = torch.tensor(2.0, device="cpu")
    reads = [lambda: F.interpolate(img, size=n), lambda: F.interpolate(img, (n, 4), mode="bilinear"),
             lambda: F.interpolate(img, scale_factor=s, recompute_scale_factor=True),
             lambda: F.interpolate(img, scale_factor=(s, s), mode="area"), lambda: torch.nn.Upsample(size=n)(img)]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        for fn in reads:
            fn()
    assert [e.op for e in mode.events] == ["interpolate"] * 5
    assert [e.file for e in mode.events] == [__file__] * 5  # the user's line, not torch's
    assert [_local_scalar_reads(fn) for fn in reads] == [2, 1, 2, 2, 2]  # torch's own count: one read per size
    with HostReadMode("cpu", treat_as_device=True) as mode:
        F.interpolate(img, size=8)
        F.interpolate(img, size=(img.shape[-1] * 2, 4), mode="bilinear")
        F.interpolate(img, scale_factor=2.0)
        F.interpolate(img, size=torch.tensor(3))  # host-born
    assert mode.events == []


def test_device_numbers_of_normalize_local_response_norm_and_embedding_are_host_reads():
    """F.normalize, F.local_response_norm and F.embedding have no aten op of their name (F.embedding's aten::embedding
    takes none of its max_norm, norm_type), so the schemas said nothing of the numbers they pass on to ops of other
    names, where the argument parser reads a device tensor with .item(), inside torch, where the mode is off. They were
    missed: normalize's p and dim (torch.linalg.vector_norm's ord and dim), local_response_norm's size (F.pad's pad, two
    reads, and avg_pool's kernel, one), embedding's max_norm and, when max_norm is given, norm_type (the floats of
    embedding_renorm_). One flag per call, as for F.interpolate. normalize's eps (clamp_min's Tensor overload) and
    local_response_norm's alpha, beta and k (mul, add and pow with a tensor) are used on the device: they read nothing,
    nor does norm_type without max_norm (F.embedding does not use it then)."""
    import torch.nn.functional as F

    x = torch.rand(2, 3, 4)
    idx = torch.tensor([[0, 2], [1, 3]])
    w = torch.rand(5, 4)
    n = torch.tensor(2, device="cpu")  # placed on the device (the CPU standing in for it)
    v = torch.tensor(3.0, device="cpu")
    lrn, emb = torch.nn.LocalResponseNorm(n), torch.nn.Embedding(5, 4, max_norm=v)
    reads = [lambda: F.normalize(x, p=v), lambda: F.normalize(x, dim=n), lambda: F.normalize(x, 3.0, (1, n)),
             lambda: F.normalize(x, p=v, out=torch.empty_like(x)), lambda: F.local_response_norm(x, n),
             lambda: F.local_response_norm(x[None], size=n, alpha=v), lambda: lrn(x),
             lambda: F.embedding(idx, w, padding_idx=n), lambda: F.embedding(idx, w, max_norm=v),
             lambda: F.embedding(idx, w, max_norm=1.0, norm_type=v),
             lambda: F.embedding(idx, w, max_norm=v, norm_type=v), lambda: emb(idx)]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        for fn in reads:
            fn()
    assert [e.op for e in mode.events] == ["normalize"] * 4 + ["local_response_norm"] * 3 + ["embedding"] * 5
    assert [e.file for e in mode.events] == [__file__] * 12  # the user's line, not torch's
    # torch's own count of reads: one per device number (each of the size's three; padding_idx: F.embedding's two range
    # checks, then aten::embedding's); the CPU's embedding_renorm_ also reads its indices on the host (a GPU's kernel
    # does not), so the count with max_norm is taken above a Python max_norm's
    assert [_local_scalar_reads(fn) for fn in reads[:8]] == [1, 1, 1, 1, 3, 3, 3, 3]
    renorm = _local_scalar_reads(lambda: F.embedding(idx, w, max_norm=1.0))
    assert [_local_scalar_reads(fn) - renorm for fn in reads[8:]] == [1, 1, 2, 1]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        F.normalize(x)
        F.normalize(x, 3.0, 2, 1e-6)
        F.normalize(x, eps=v)  # clamp_min(eps) takes the tensor as it is
        F.normalize(x, eps=v, out=torch.empty_like(x))  # clamp_min_ too
        F.normalize(x, p=torch.tensor(3.0))  # host-born
        F.local_response_norm(x, 2, alpha=v, beta=v, k=v)  # mul, add and pow on the device
        F.local_response_norm(x, size=x.shape[1])
        torch.nn.LocalResponseNorm(2)(x)
        F.embedding(idx, w, max_norm=1.0, norm_type=2.0)
        F.embedding(idx, w, norm_type=v)  # without max_norm nothing reads norm_type
        F.embedding(idx, w, max_norm=torch.tensor(1.0))  # host-born
        torch.nn.Embedding(5, 4, max_norm=1.0)(idx)
    assert mode.events == []
    assert [_local_scalar_reads(fn) for fn in (lambda: F.normalize(x, eps=v), lambda: F.embedding(idx, w, norm_type=v),
                                               lambda: F.local_response_norm(x, 2, alpha=v, beta=v, k=v))] == [0] * 3


def test_a_list_of_device_scalars_where_an_op_takes_a_tensor_or_a_list_of_numbers_is_a_host_read():
    """torch.tensor_split(x, [n, 4]): the op takes a lone tensor (tensor_indices_or_sections) or a list of numbers
    (indices) there, so the schemas hid the slot; but a list matches no lone Tensor, and the parser reads each device
    tensor in it with .item(). It was missed. A tensor given as it is (torch.tensor_split(x, t)) reads nothing on a GPU:
    torch refuses it unless it is on the CPU (host memory), so the CPU's own read of it is no sync, and not counted."""
    x = torch.arange(12.0).reshape(6, 2)
    n = torch.tensor(3, device="cpu")  # placed on the device (the CPU standing in for it)
    reads = [lambda: torch.tensor_split(x, [n, 4]), lambda: x.tensor_split((n,), dim=0)]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        for fn in reads:
            fn()
    assert [e.op for e in mode.events] == ["torch.tensor_split", "Tensor.tensor_split"]
    assert all(e.file == __file__ for e in mode.events)
    assert [_local_scalar_reads(fn) for fn in reads] == [1, 1]
    with HostReadMode("cpu", treat_as_device=True) as mode:
        torch.tensor_split(x, n)
        x.tensor_split(torch.tensor([1, 4], device="cpu"))
        torch.tensor_split(x, [2, 4])
        torch.tensor_split(x, [torch.tensor(2), 4])  # host-born
        torch.cat([x, x])  # a list of tensors where the op takes one
    assert mode.events == []
    with pytest.raises(RuntimeError, match="to be on cpu"):  # a tensor not in host memory is refused, as on a GPU
        torch.tensor_split(x, torch.tensor(3, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: CUDA's sync debug mode is the referee")
def test_the_mode_flags_the_calls_that_cudas_sync_debug_mode_catches():
    """On a GPU, the two counters agree call by call: each call the mode counts as a host read synchronizes (torch's
    sync debug mode warns), and each call it leaves out does not. The CPU tests above stand the CPU in for the device
    and take torch's sources for what a GPU does inside an op (masked_fill's value, one_hot, interpolate's size,
    normalize's eps, local_response_norm's alpha, embedding_renorm_ with a Python max_norm); this
    one runs them on the device. A call is compared as synced or not: an op may sync more than once per call."""
    import torch.nn.functional as F

    d = torch.device("cuda")
    x = torch.arange(12.0, device=d).reshape(6, 2)
    mask, idx = x > 3, torch.tensor([1], device=d)
    n, v, t = torch.tensor(3, device=d), torch.tensor(0.5, device=d), torch.tensor([0, 2, 1], device=d)
    img, w = torch.rand(1, 1, 4, 4, device=d), torch.rand(6, 2, device=d)
    calls = {  # name -> (call, whether it reads the device on the host)
        "item": (lambda: x.sum().item(), True),
        "zeros(n)": (lambda: torch.zeros(n, device=d), True),
        "narrow(n)": (lambda: x.narrow(0, 0, n), True),
        "x[mask]": (lambda: x[mask], True),
        "masked_fill(device value)": (lambda: x.masked_fill(mask, v), True),
        "index_fill(device value)": (lambda: x.index_fill(0, idx, v), True),
        "one_hot(t)": (lambda: F.one_hot(t), True),
        "interpolate(size=n)": (lambda: F.interpolate(img, size=n), True),
        "tensor_split(x, [n, 4])": (lambda: torch.tensor_split(x, [n, 4]), True),
        "normalize(p=v)": (lambda: F.normalize(img, p=v), True),
        "normalize(dim=n)": (lambda: F.normalize(img, dim=n), True),
        "local_response_norm(size=n)": (lambda: F.local_response_norm(img, n), True),
        "embedding(max_norm=v)": (lambda: F.embedding(idx, w, max_norm=v), True),
        "embedding(max_norm=1.0, norm_type=v)": (lambda: F.embedding(idx, w, max_norm=1.0, norm_type=v), True),
        "x + 1": (lambda: x + 1, False),
        "masked_fill(0.5)": (lambda: x.masked_fill(mask, 0.5), False),
        "where(mask, x, v)": (lambda: torch.where(mask, x, v), False),
        "one_hot(t, 4)": (lambda: F.one_hot(t, 4), False),
        "interpolate(size=8)": (lambda: F.interpolate(img, size=8), False),
        "x[n.reshape(1)]": (lambda: x[n.reshape(1)], False),
        "normalize(eps=v)": (lambda: F.normalize(img, eps=v), False),
        "local_response_norm(alpha=v)": (lambda: F.local_response_norm(img, 3, alpha=v, beta=v, k=v), False),
        "embedding(max_norm=1.0)": (lambda: F.embedding(idx, w, max_norm=1.0), False),
        "embedding(norm_type=v)": (lambda: F.embedding(idx, w, norm_type=v), False),
    }
    synced, flagged = {}, {}
    for name, (fn, _) in calls.items():
        fn()  # warm: a first call may load kernels
        torch.cuda.synchronize()
        with CudaSyncCounter() as cuda_counter:
            fn()
        torch.cuda.synchronize()
        with HostReadMode(d) as mode:
            fn()
        synced[name], flagged[name] = bool(cuda_counter.events), bool(mode.events)
    assert synced == {name: expected for name, (_, expected) in calls.items()}  # the referee, as the docstrings say
    assert flagged == synced
