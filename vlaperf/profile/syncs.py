"""Hidden host-device synchronizations per policy call, with the source line of each.

A policy call should queue its whole computation on the device and synchronize once, when
the caller reads the actions. Every other host read of device data (bool() of a device
tensor in a `while`, .item(), .tolist(), .cpu(), a boolean-mask index, .nonzero(), ...)
stalls the host until the device has drained its queue, then leaves the device idle while
the host launches the next kernels. seed 004's `while time >= -dt / 2` did that N + 1
times per call; seed 000 suspected a per-forward `.nonzero()`.

Two counters, one interface (`SyncCounter`: a context manager collecting `SyncEvent`s):

- `HostReadMode` (any device): a `torch.overrides.TorchFunctionMode` that sees every torch
  call made from Python and records those that read tensor data on the host when the
  tensor lives on the watched device. On the CPU such reads are not syncs, so
  `treat_as_device=True` pretends the CPU is the device: tensors the code explicitly puts
  on the device (factory calls with a device argument, and everything computed from
  those and from the inputs) count, while tensors created on the host without a device
  argument (e.g. `torch.tensor(x).item()` of a Python constant) and their descendants do
  not, as on a GPU. With the CPU standing in for the device, `.to(<cpu device>)` is taken
  as placing data on the device and only `.cpu()` as reading it back. It sees only what
  Python calls; a sync inside a C++ op is invisible.
- `CudaSyncCounter` (CUDA): `torch.cuda.set_sync_debug_mode("warn")` makes every
  synchronizing CUDA call warn; the counter catches the warnings as they are raised and
  walks the Python stack to the first frame outside torch. It sees every sync, from C++
  too. Its mode setter/getter are injectable, so the warning handling is testable on CPU.

Attribution: the first stack frame outside torch, outside this module and outside the
`warnings` machinery: file, line, function and the code of that line.
"""

from __future__ import annotations

import linecache
import os
import sys
import time
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

CUDA_SYNC_MESSAGE = "called a synchronizing CUDA operation"

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_SKIP_FILES = {os.path.abspath(warnings.__file__), _THIS_FILE}


@dataclass(frozen=True)
class SyncEvent:
    op: str  # the torch call (e.g. "Tensor.__bool__") or "cuda sync" for the CUDA counter
    kind: str  # "host_read" | "cuda_sync" | "host_to_device"
    file: str | None
    line: int | None
    function: str | None
    code: str | None


def per_call_phrase(n: float) -> str:
    """'1 host sync per call', '3 host syncs per call', '0.5 host syncs per call'."""
    return f"{n:g} host sync{'' if n == 1 else 's'} per call"


def user_frame(skip_files: set[str] | None = None):
    """The innermost Python frame that is not torch, this module or the warnings module."""
    skip = _SKIP_FILES | (skip_files or set())
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not (fn.startswith(_TORCH_DIR) or fn in skip or fn.startswith("<frozen")):
            return f
        f = f.f_back
    return None


def _event(op: str, kind: str) -> SyncEvent:
    f = user_frame()
    if f is None:
        return SyncEvent(op, kind, None, None, None, None)
    fn, line = f.f_code.co_filename, f.f_lineno
    return SyncEvent(op, kind, fn, line, f.f_code.co_name, linecache.getline(fn, line).strip() or None)


# ----------------------------------------------------------------- host reads (TorchFunctionMode)


def _name(func) -> str:
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    return qual.replace("TensorBase.", "Tensor.").replace("_VariableFunctionsClass.", "torch.")


# Methods that hand tensor data to Python.
# (.numpy() / __array__ are absent: on a GPU tensor they raise, so working code reads
# through .cpu() first, and that is where the sync is counted.)
# __contains__ (`x in t`) reads through .item() inside torch's Python method, which the mode cannot see: the mode is
# off while its own handler runs, so the read is counted at the `in`.
_READ_METHODS = {"__bool__", "__int__", "__float__", "__index__", "__complex__", "item", "tolist",
                 "__repr__", "__str__", "__format__", "__contains__"}
# Ops whose output size depends on the data (the host must read it to allocate the output).
_DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "_unique", "_unique2",
                   "equal", "allclose", "is_nonzero", "bincount"}
_INDEX_OPS = {"__getitem__", "__setitem__", "index_put", "index_put_", "index"}
_COPY_OPS = {"to", "cpu", "copy_", "cuda", "type"}
# Ops that take host numbers where code may pass a one-element tensor (torch.zeros(n), x.view(n, -1), x.select(0, n),
# x.topk(n), torch.cat(xs, dim=n), F.pad(x, (0, n)), torch.full((2,), v), x.add(y, alpha=v) with n, v on the device):
# torch's argument parser reads such a tensor with .item(), in C++, where this mode is off. Which arguments take
# numbers comes from the op's schemas (see _number_slots); these few take a tensor in one overload and still read it
# with .item() there, in C++ (op -> the names of those arguments). narrow's start, linspace's ends: the overload exists
# for tracing, and the op needs the number on the host to size its output. masked_fill's and index_fill's 0-dim value:
# the kernel fills with a host number (CUDA's masked_fill__cuda, like the CPU's, and the index_fill_ both share call
# value.item(); pytorch/pytorch#190512, open in 2026-07, would read masked_fill's on the device instead).
_ITEM_TENSOR_ARGS = {"narrow": {"start"}, "linspace": {"start", "end"}, "logspace": {"start", "end"},
                     "masked_fill": {"value"}, "masked_fill_": {"value"}, "index_fill": {"value"},
                     "index_fill_": {"value"}}
# Python functions without an aten op of their name that pass numbers on to ops of other names, where the parser reads
# a device tensor as it reads one given to the op itself: F.interpolate's size goes to upsample_*'s output_size (x, n
# and (n, n) alike; nn.Upsample and F.upsample call it), and a scale_factor it recomputes (recompute_scale_factor, or
# mode="area") is read by its own int(size * scale_factor) (a tensor scale_factor it passes on is refused).
# F.normalize's p and dim go to torch.linalg.vector_norm's ord and dim; its eps goes to clamp_min, whose Tensor
# overload takes a tensor as it is (not read). F.local_response_norm's size goes to F.pad's pad (size // 2 and
# (size - 1) // 2, computed on the device, then read) and to avg_pool2d/3d's kernel_size (nn.LocalResponseNorm calls
# it); its alpha, beta and k go to mul, add and pow, which take a tensor as it is (not read). F.embedding has an aten
# op of its name, but aten::embedding takes only its padding_idx: its max_norm goes to embedding_renorm_'s float (and
# so does norm_type, but only with max_norm given: _embedding_norm_type). Each: (positions in a call's args, keyword
# names), as _number_slots gives them.
_PY_NUMBER_ARGS: dict[Any, tuple[tuple[int, ...], frozenset]] = {
    torch.nn.functional.interpolate: ((1, 2), frozenset({"size", "scale_factor"})),
    torch.nn.functional.normalize: ((1, 2), frozenset({"p", "dim"})),
    torch.nn.functional.local_response_norm: ((1,), frozenset({"size"})),
    torch.nn.functional.embedding: ((2, 3), frozenset({"padding_idx", "max_norm"}))}
# Factories that build a tensor from Python data: a device tensor inside a list or tuple of that data is converted to
# a Python number, one .item() each (torch.tensor([n, m])); a tensor given as the data itself is copied as it is.
_DATA_FACTORIES = {"tensor", "as_tensor", "asarray", "new_tensor"}
_FACTORIES = {"tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "empty", "full", "arange", "range", "linspace",
              "logspace", "eye", "rand", "randn", "randint", "randperm", "from_numpy", "empty_strided", "tril_indices",
              "triu_indices", "normal", "frombuffer"}


def _tensors(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def _slice_bounds(index) -> list:
    """The tensors among the start, stop and step of the slices in an index (a slice, or a tuple or list of them)."""
    out = []
    for x in index if isinstance(index, (list, tuple)) else (index,):
        if isinstance(x, slice):
            out += [b for b in (x.start, x.stop, x.step) if isinstance(b, torch.Tensor)]
        elif isinstance(x, (list, tuple)):
            out += _slice_bounds(x)
    return out


def _index_reads(index) -> list:
    """The tensors of an index that torch reads with .item() while slicing: a 0-dim integer or bool (or old-style
    uint8) tensor among the index's entries (x[n] selects row n, as x[int(n)] does; x[b] with b 0-dim adds a dimension
    of size 1 or 0), and every tensor inside a list or tuple among them (x[[0, n], 1]: torch builds an index tensor
    from that list as torch.tensor would, one .item() per tensor). A list index is taken as a tuple of entries, as
    torch takes it when it holds a tensor (x[[n, 1]] is x[n, 1]; a 1-dim tensor in it is gathered on the device)."""
    out = []
    for x in index if isinstance(index, (tuple, list)) else (index,):
        if isinstance(x, torch.Tensor):
            if x.dim() == 0 and not (x.is_floating_point() or x.is_complex()):
                out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x, [])
    return out


def _kind(op: str, arg) -> str:
    """'tensor' if the argument takes a tensor as it is, 'tensors' if it takes a list of them (or Any), 'number' if it
    takes a host number (int, SymInt, float, Scalar, or an optional one), 'numbers' a list of them, 'other' (bool,
    dtype, str, device, ...: a tensor there is refused)."""
    t = str(getattr(arg, "real_type", arg.type))  # real_type tells a dtype from an int
    listed = t.startswith(("List[", "Optional[List["))
    while t.startswith(("Optional[", "List[")):
        t = t[t.index("[") + 1:-1]
    if t == "Tensor" and arg.name in _ITEM_TENSOR_ARGS.get(op, ()):
        return "number"
    if t in ("Tensor", "Any"):
        return "tensors" if listed or t == "Any" else "tensor"
    if t in ("int", "SymInt", "float", "number", "complex"):
        return "numbers" if listed else "number"
    return "other"


# func -> _number_slots of its op, computed once per function (torch.select and Tensor.select each once): the mode asks
# on every torch call. Keyed by the function, not its name: its __qualname__ (a Tensor method or not) costs more to
# build than this lookup.
_SLOTS: dict[Any, tuple[tuple[int, ...], int | None, frozenset, tuple[int, ...], frozenset]] = {}


def _number_slots(func, name: str) -> tuple[tuple[int, ...], int | None, frozenset, tuple[int, ...], frozenset]:
    """Where the op `name` takes host numbers: (the positions in a call's args, the position from which every further
    one is a number too (x.view(4, n) is x.view((4, n))) or None, the keyword names, then the positions and keyword
    names that take numbers only when given a list), from the schemas of aten::<name>. A slot counts only if no
    overload takes a tensor there: torch's argument parser tries the overloads in turn, and a tensor matching a Tensor
    argument of one of them is not read (x.add(v) vs x.add(y, alpha=v)). A list or tuple matches no lone Tensor,
    though: where the overloads taking a tensor there take a lone one and another takes a list of numbers, a list
    there holds numbers (torch.tensor_split(x, [n, 4]), not torch.tensor_split(x, t)). A Python function
    (Tensor.split, F.pad, F.softmax) is matched the same way: each passes its arguments on to the op of its name. An
    op without a dispatcher schema (torch.tensor, __getitem__, a custom Python function) takes no numbers here, but
    for the Python functions of _PY_NUMBER_ARGS."""
    if func in _PY_NUMBER_ARGS:
        positions, keywords = _PY_NUMBER_ARGS[func]
        _SLOTS[func] = slots = (positions, None, keywords, (), frozenset())
        return slots
    method = (getattr(func, "__qualname__", None) or "").startswith(("TensorBase.", "Tensor."))
    pos: dict[int, set] = {}
    kw: dict[str, set] = {}
    varargs = set()
    try:
        schemas = torch._C._jit_get_schemas_for_operator("aten::" + name)
    except (AttributeError, RuntimeError):
        schemas = []
    for sch in schemas:
        try:  # TorchScript's own overloads (aten::add.int(int a, int b)) are no op a Python call can reach
            torch._C._dispatch_find_schema_or_throw(sch.name, sch.overload_name)
        except (AttributeError, RuntimeError):
            continue
        args = sch.arguments
        if method:  # x.op(...) passes x as self; the Python arguments follow without it
            if not any(a.name == "self" for a in args):
                continue
            args = [a for a in args if a.name != "self"]
        positional = [a for a in args if not a.kwarg_only]
        for i, a in enumerate(positional):
            pos.setdefault(i, set()).add(_kind(name, a))
        for a in args:
            kw.setdefault(a.name, set()).add(_kind(name, a))
        # the parser takes a lone list argument as varargs too: x.view(4, n) is x.view((4, n))
        if len(positional) == 1 and str(positional[0].type).startswith("List["):
            varargs.add(_kind(name, positional[0]))
    first = 1 if method else 0  # a method's args hold self first
    n = max(pos, default=-1) + 1
    positions = tuple(first + i for i in range(n) if _numbers(pos[i] | (varargs if i > 0 else set())))
    slots = (positions, first + n if _numbers(varargs) else None,
             frozenset(k for k, kinds in kw.items() if _numbers(kinds)),
             tuple(first + i for i in range(n) if _listed_numbers(pos[i])),
             frozenset(k for k, kinds in kw.items() if _listed_numbers(kinds)))
    _SLOTS[func] = slots
    return slots


def _numbers(kinds: set) -> bool:
    return ("number" in kinds or "numbers" in kinds) and "tensor" not in kinds and "tensors" not in kinds


def _listed_numbers(kinds: set) -> bool:
    """A slot that takes a lone tensor as it is, and a list only as numbers (no overload takes a list of tensors)."""
    return "numbers" in kinds and "tensor" in kinds and "tensors" not in kinds


def _number_args(func, name, args, kwargs) -> list:
    """The one-element tensors a call passes where its op takes host numbers (_number_slots), or inside the Python
    data of a factory (torch.tensor([n, m]), _DATA_FACTORIES)."""
    if name in _DATA_FACTORIES:
        data = args[1:2] if name == "new_tensor" else args[:1]  # x.new_tensor(data): the method's args hold x first
        data = data or [kwargs.get("data"), kwargs.get("obj")]
        return [t for x in data if isinstance(x, (list, tuple)) for t in _tensors(x, [])]
    positions, varargs_from, keywords, listed, listed_keywords = _SLOTS.get(func) or _number_slots(func, name)
    # plain loops: this runs on every torch call
    given = []
    for i in positions:
        if i < len(args):
            given.append(args[i])
    for i in listed:
        if i < len(args) and isinstance(args[i], (list, tuple)):
            given.append(args[i])
    if varargs_from is not None:
        given += args[varargs_from:]
    if kwargs and (keywords or listed_keywords):
        for k in kwargs:
            if k in keywords or (k in listed_keywords and isinstance(kwargs[k], (list, tuple))):
                given.append(kwargs[k])
    out = []
    for x in given:  # a number, or a list of them (a size): no deeper; a number slot takes a one-element tensor only
        if isinstance(x, torch.Tensor):
            if x.numel() == 1:
                out.append(x)
        elif isinstance(x, (list, tuple)):
            for t in x:
                if isinstance(t, torch.Tensor) and t.numel() == 1:
                    out.append(t)
    return out


def _embedding_norm_type(args, kwargs) -> torch.Tensor | None:
    """F.embedding's norm_type if it is a one-element tensor that the call reads: F.embedding uses norm_type only to
    renormalize, i.e. when max_norm is given (embedding_renorm_'s float); without max_norm it passes it nowhere."""
    max_norm = args[3] if len(args) > 3 else kwargs.get("max_norm")
    norm_type = args[4] if len(args) > 4 else kwargs.get("norm_type")
    if max_norm is None or not isinstance(norm_type, torch.Tensor) or norm_type.numel() != 1:
        return None
    return norm_type


def _target_device(args, kwargs) -> torch.device | None:
    """Destination device of Tensor.to(...) / .cuda(...) arguments, if one is named."""
    cand = kwargs.get("device")
    if cand is None:
        for a in args:
            if isinstance(a, (str, torch.device)) and not isinstance(a, torch.dtype):
                cand = a
                break
            if isinstance(a, torch.Tensor):
                cand = a.device
                break
    if cand is None:
        return None
    try:
        return torch.device(cand)
    except (RuntimeError, TypeError):
        return None


class HostReadMode(TorchFunctionMode):
    """Records host reads of data on `device` (see the module docstring).

    device: the device whose tensors count ("cuda" matches any cuda:N).
    treat_as_device: count CPU tensors as device tensors (tests and CPU runs); host-born
                     tensors (created without a device argument) still do not count.
    """

    kind = "host_read"

    def __init__(self, device: torch.device | str = "cuda", treat_as_device: bool = False):
        super().__init__()
        self.device = torch.device(device)
        self.treat_as_device = treat_as_device
        if self.device.type == "cpu" and not treat_as_device:
            self.watch = None  # CPU tensors are host memory: nothing to watch
        else:
            self.watch = self.device.type
        self.events: list[SyncEvent] = []
        self._host: dict[int, weakref.ref] = {}

    # -- host-born bookkeeping (only matters when the watched device is the CPU)

    def _is_host_born(self, t: torch.Tensor) -> bool:
        r = self._host.get(id(t))
        return r is not None and r() is t

    def _tag_host(self, t: torch.Tensor) -> None:
        key = id(t)

        def drop(ref, key=key, table=self._host):
            if table.get(key) is ref:
                del table[key]

        try:
            self._host[key] = weakref.ref(t, drop)
        except TypeError:
            pass

    def _untag(self, t: torch.Tensor) -> None:
        self._host.pop(id(t), None)

    def on_device(self, t: torch.Tensor) -> bool:
        if self.watch is None or t.device.type != self.watch:
            return False
        return not (self.watch == "cpu" and self._is_host_born(t))

    # -- the mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        ins = _tensors(args, []) + _tensors(kwargs, [])
        read = self._classify(func, name, args, kwargs, ins)
        if read is not None:
            self.events.append(_event(_name(func), read))
        out = func(*args, **kwargs)
        if self.watch == "cpu":
            self._propagate(name, args, kwargs, ins, out)
        return out

    def _classify(self, func, name, args, kwargs, ins) -> str | None:
        if self.watch is None:
            return None
        dev_in = [t for t in ins if self.on_device(t)]
        if name in _READ_METHODS or name in _DATA_DEPENDENT:
            return "host_read" if dev_in else None
        if name == "where" and len(args) == 1 and not kwargs:  # torch.where(cond) == nonzero
            return "host_read" if dev_in else None
        if name == "repeat_interleave" and len(ins) >= 2 and kwargs.get("output_size") is None:
            return "host_read" if dev_in else None  # tensor repeats: output size read on the host
        if name == "one_hot" and dev_in:
            # F.one_hot(t) without num_classes sizes its output from t.max().item(), inside the op, on every device;
            # with num_classes given only the CPU reads t (its range checks), so a GPU reads nothing
            classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            if isinstance(classes, int) and classes == -1 and ins[0].numel() > 0:  # (an empty t is refused)
                return "host_read"
        if func is torch.nn.functional.embedding and dev_in:
            norm_type = _embedding_norm_type(args, kwargs)
            if norm_type is not None and self.on_device(norm_type):
                return "host_read"
        if dev_in and any(self.on_device(t) for t in _number_args(func, name, args, kwargs)):
            return "host_read"  # a device tensor as a number (torch.zeros(n)): read inside torch, as x[:n]'s bound is
        if name in _INDEX_OPS:
            # a slice bounded by a device tensor (x[:n]): the op reads the bound on the host through its __index__,
            # inside torch, where this mode is off and does not see it
            if name in ("__getitem__", "__setitem__") and any(self.on_device(t) for t in _slice_bounds(args[1:2])):
                return "host_read"
            # so is a 0-dim integer or bool device tensor in it (x[n], x[:, n], x[b] = 0.0, x[[n, 1]]), and one in a
            # list in it (x[[0, n], 1]): read with .item(), not gathered on the device (a bool one writing a host
            # value is no masked_fill either)
            if name in ("__getitem__", "__setitem__") and len(args) > 1 and \
                    any(self.on_device(t) for t in _index_reads(args[1])):
                return "host_read"
            idx = _tensors(args[1:2], [])
            # a uint8 index tensor is an old-style boolean mask (deprecated): torch runs nonzero on it too
            if any(t.dtype in (torch.bool, torch.uint8) for t in idx) and dev_in:
                if self._masked_fill(name, args, kwargs, idx):
                    return None
                return "host_read"  # boolean-mask indexing runs nonzero on the mask
            return None
        if name in _COPY_OPS and ins and self.on_device(ins[0]) and name != "copy_":
            if name == "cpu":
                return "host_read"
            target = _target_device(args[1:], kwargs)
            # With the CPU standing in for the device, .to(cpu) is how code places data on
            # "the device" (e.g. .to(self.device)); only .cpu() reads it back.
            if target is not None and target.type == "cpu" and self.watch != "cpu":
                return "host_read"
            return None
        if name == "copy_" and len(ins) >= 2:
            dst, src = ins[0], ins[1]
            if self.on_device(src) and dst.device.type == "cpu" and not self.on_device(dst):
                return "host_read"
        return None

    def _masked_fill(self, name, args, kwargs, idx) -> bool:
        """Whether torch runs this boolean-mask write as masked_fill_, which reads nothing: one mask and a single
        host value (a Python number, or a one-element tensor on the host), not accumulated (index_put_'s
        canDispatchToMaskedFill; `scores[~mask] = float("-inf")` is such a write). Any other write, and every
        boolean-mask read, runs nonzero on the mask."""
        if name not in ("__setitem__", "index_put", "index_put_") or len(idx) != 1 or idx[0].dtype != torch.bool:
            return False  # (masked_fill_ refuses a uint8 mask)
        value = args[2] if len(args) > 2 else kwargs.get("values")
        if name != "__setitem__" and (args[3] if len(args) > 3 else kwargs.get("accumulate", False)):
            return False
        if isinstance(value, torch.Tensor):
            return value.numel() == 1 and value.device.type == "cpu" and not self.on_device(value)
        return isinstance(value, (bool, int, float, complex))

    def _propagate(self, name, args, kwargs, ins, out) -> None:
        """CPU-as-device bookkeeping: which outputs are host-born."""
        outs = _tensors(out, [])
        if not outs:
            return
        fresh = [t for t in outs if not any(t is x for x in ins)]
        if name in ("cpu", "numpy"):
            for t in fresh:
                self._tag_host(t)  # host copies of device data
            return
        if name in ("to", "cuda"):
            target = _target_device(args[1:], kwargs) if name == "to" else torch.device("cuda")
            if target is not None:
                for t in fresh:
                    self._untag(t)  # explicitly placed on the device (.to(cpu) too: the CPU stands in for it)
                return
        if name in _FACTORIES:
            host = kwargs.get("device") is None
            if name == "tensor" or name == "as_tensor":
                host = host and not _tensors(args[:1], [])
        elif name.endswith("_like") or ins:
            host = bool(ins) and all(self._is_host_born(t) for t in ins)
        else:
            host = kwargs.get("device") is None
        if host:
            for t in fresh:
                self._tag_host(t)


# ----------------------------------------------------------------- CUDA sync debug mode


class CudaSyncCounter:
    """Counts synchronizing CUDA calls via torch.cuda.set_sync_debug_mode("warn").

    `set_mode` / `get_mode` default to torch.cuda's; pass fakes to exercise the warning
    handling without a GPU (the fake emits warnings.warn(CUDA_SYNC_MESSAGE))."""

    kind = "cuda_sync"

    def __init__(self, set_mode: Callable | None = None, get_mode: Callable | None = None):
        self._set = set_mode or torch.cuda.set_sync_debug_mode
        self._get = get_mode or torch.cuda.get_sync_debug_mode
        self.events: list[SyncEvent] = []
        self._cw = None

    def __enter__(self) -> "CudaSyncCounter":
        self._prev_mode = self._get()
        self._cw = warnings.catch_warnings()
        self._cw.__enter__()
        warnings.filterwarnings("always", message=".*" + CUDA_SYNC_MESSAGE)
        self._prev_show = warnings.showwarning
        warnings.showwarning = self._on_warning
        self._set("warn")
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._set(self._prev_mode)
        finally:
            self._cw.__exit__(*exc)
            self._cw = None

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if CUDA_SYNC_MESSAGE in str(message):
            self.events.append(_event("cuda sync", "cuda_sync"))
        else:
            self._prev_show(message, category, filename, lineno, file, line)


# ----------------------------------------------------------------- reports


def group_events(events: list[SyncEvent], calls: int = 1) -> list[dict[str, Any]]:
    """Events grouped by (file, line, op), most frequent first, with counts per call."""
    counts = Counter((e.file, e.line, e.function, e.code, e.op, e.kind) for e in events)
    sites = []
    for (file, line, function, code, op, kind), n in counts.most_common():
        sites.append({"file": file, "line": line, "location": _short(file, line), "function": function, "code": code,
                      "op": op, "kind": kind, "count": n, "per_call": n / calls})
    return sites


def _short(file: str | None, line: int | None) -> str:
    if file is None:
        return "<unknown>"
    path = os.path.abspath(file)
    # vlaperf's own files (and the packages installed beside it) by their package path wherever the command runs,
    # as the docs name them (vlaperf/models/pi0.py:786); other files relative to the working directory
    for root in (os.path.dirname(os.path.dirname(_THIS_FILE)) + "/..", os.getcwd()):
        root = os.path.abspath(root) + os.sep
        if path.startswith(root):
            path = path[len(root):]
            break
    return f"{path}:{line}"


def make_counter(source: str, device: torch.device, treat_as_device: bool):
    if source == "cuda":
        return CudaSyncCounter()
    if source == "mode":
        return HostReadMode(device, treat_as_device=treat_as_device)
    raise ValueError(f"unknown sync source {source!r}; expected 'cuda' or 'mode'")


def count_syncs(fn: Callable[[], Any], *, device: torch.device | str = "cuda", calls: int = 1, warmup: int = 1,
                source: str = "auto", treat_as_device: bool | None = None, counter=None,
                expected_per_call: int = 0) -> dict[str, Any]:
    """Run `fn` (one policy call) `calls` times after `warmup` unwatched calls; count the
    synchronizations and group them by source line.

    source: "auto" (CUDA device -> the sync debug mode; otherwise the host-read mode),
    "cuda", or "mode". treat_as_device (host-read mode): default True on the CPU (else
    nothing could count) and False elsewhere. `counter`: any SyncCounter to use instead.
    expected_per_call: syncs the call needs by design (policy mode: 1, reading the actions).
    Returns {"source", "device", "treat_as_device", "calls", "total", "per_call",
    "expected_per_call", "hidden_per_call", "sites", "note"}; per_call = total / calls.
    """
    from vlaperf.timing import _check_counts

    _check_counts("count_syncs", warmup, calls, iters_name="calls")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"count_syncs: device {device} but this torch has no CUDA device (use device='cpu')")
    if source == "auto":
        source = "cuda" if device.type == "cuda" else "mode"
    if treat_as_device is None:
        treat_as_device = device.type == "cpu"
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    counter = counter or make_counter(source, device, treat_as_device)
    with counter:
        for _ in range(calls):
            fn()
    events = [e for e in counter.events if e.kind != "host_to_device"]
    sites = group_events(events, calls)
    note = None
    if isinstance(counter, HostReadMode) and counter.watch is None:
        # the CPU without treat_as_device: the mode watched nothing, so its 0 is no measurement, and the C++ note
        # below would send the reader to source='cuda', which a CPU run cannot use
        note = ("nothing was watched: without treat_as_device the CPU is host memory, so no read can count and 0 "
                "says nothing (treat_as_device=True, `--treat-as-device yes`, the CPU's default, counts them)")
    elif source == "mode" and treat_as_device and device.type == "cpu":
        note = ("counted on the CPU as if it were the device: each host read listed here would be a "
                "host-device sync on a GPU (tensors created on the host without a device argument excluded)")
    elif source == "mode":
        note = "host reads made from Python only; syncs inside C++ ops are not seen (use source='cuda')"
    return {"source": getattr(counter, "kind", source), "device": str(device), "treat_as_device": treat_as_device,
            "calls": calls, "total": len(events), "per_call": len(events) / calls,
            "expected_per_call": expected_per_call, "hidden_per_call": max(len(events) / calls - expected_per_call, 0),
            "sites": sites, "note": note}


def measure_sync_cost_ms(device: torch.device | str, iters: int = 50) -> float | None:
    """Round trip of one tiny kernel plus a 1-element device-to-host read, median ms.

    This is the idle time one sync inside a call adds, about (the device drains, the host
    wakes up, the next launch reaches the device). None on the CPU (no device to wait for).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    x = torch.zeros(1, device=device)
    samples = []
    for i in range(iters + 5):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        (x + 1).item()
        t1 = time.perf_counter()
        if i >= 5:
            samples.append((t1 - t0) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def format_syncs(report: dict[str, Any], limit: int = 12) -> str:
    lines = [f"{per_call_phrase(report['per_call'])} ({report['source']}, {report['device']}, "
             f"{report['calls']} call{'s' if report['calls'] != 1 else ''})"]
    if report.get("expected_per_call"):
        lines[0] += f"; {report['expected_per_call']} expected (reading the actions), {report['hidden_per_call']:g} hidden"
    for s in report["sites"][:limit]:
        lines.append(f"  {s['per_call']:6g}/call  {s['location']}  {s['op']}  | {s['code'] or ''}")
    more = len(report["sites"]) - limit
    if more > 0:  # never cut without a word: the result file's syncs.sites holds every site
        lines.append(f"  ({more} more site{'s' if more != 1 else ''} not listed; --json writes them all)")
    if report.get("note"):
        lines.append("  note: " + report["note"])
    return "\n".join(lines)
