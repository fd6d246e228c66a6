"""The speed levers: names, one-line descriptions, parsing and applicability checks.

A variant of the engine is a set of levers. Each lever is an explicit, composable transform
of the reference model's inference path and is checked for equivalence against it
(`vlaperf.check`). `vlaperf levers` prints this table.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, fields

import torch

# name -> what it does, one line each (`vlaperf levers`; the order is the cumulative order of `vlaperf matrix`)
LEVERS: dict[str, str] = {
    "for_loop": "a Python for over a precomputed schedule: no while on a device tensor, no host sync a step",
    "skip_masked_images": "image slots masked off for the whole batch are not embedded; their tokens leave the prefix",
    "trim_prompt_padding": "prompt padding past the longest valid prompt dropped, to a static bucket (8, 16, 32, ...)",
    "static_kv_cache": "preallocated KV buffers written in place; the suffix's mask and RoPE built once a call",
    "sdpa": "torch scaled_dot_product_attention (flash / memory-efficient) instead of eager softmax",
    "fuse_projections": "QKV and gate/up as one matmul each, RMSNorm scales folded in, per-step tables precomputed",
    "cuda_graph": "sample_actions (prefix + all steps) as one CUDA graph per input shape, replayed per call",
    "compile": "torch.compile the prefix and the denoise step (=MODE: default, reduce-overhead, ...)",
    "compile_layers": "with compile: each prefix layer compiled once and reused (regional): a shorter first call",
    "triton_kernels": "the denoise step's matmuls and attention, and the prefix attention, as Triton kernels",
    "megakernel": "a denoise step's expert layers in one persistent Triton kernel (batch 1; =batched: 256 rows)",
}
# name -> the rest of what a lever does, where it applies and what it measured: `vlaperf levers NAME`
LEVER_NOTES: dict[str, str] = {
    "for_loop": "openpi's reference loop runs `while time >= -dt / 2` on a CUDA tensor, which waits for the GPU at "
                "every step; the schedule is the same, computed on the host once.",
    "skip_masked_images": "openpi's LIBERO transform fills the third camera with zeros and masks it off; the reference "
                          "still runs SigLIP on it. Positions and masks of the kept tokens stay identical.",
    "trim_prompt_padding": "A batch trims to its longest valid prompt. The buckets keep a new instruction length from "
                           "recompiling or recapturing a graph; positions and masks stay identical.",
    "fuse_projections": "Also: the Euler update folded into the action head, SigLIP's patch conv as one matmul (TF32 "
                        "for bf16 models), and on CUDA SigLIP's fc2 in bf16 through cuBLASLt's algorithm for a 32 MiB "
                        "workspace limit (H200: libero-pi0 1.003x, aloha-pi0 1.007x, batch 4 1.000x).",
    "cuda_graph": "Static input buffers; a new input shape (bucket) captures once more, then replays.",
    "compile": "Modes: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs; the first call's compile "
               "time is reported apart. With cuda_graph on Hopper GPUs inductor's kernels use programmatic dependent "
               "launch (H200 libero-pi0: 1.002-1.008x).",
    "compile_layers": "Each SigLIP and Gemma prefix layer is compiled once and reused for every layer, instead of the "
                      "whole prefix as one graph; the few ops between the layers run eager.",
    "triton_kernels": "In `best` on Hopper GPUs for bfloat16 models, else opt-in. A float32 model's products run in "
                      "full float32 on FMA units: libero-pi0 in float32 with them was 4.4x slower than `best` (H100). "
                      "The denoise step's matmuls (RMSNorm/GEGLU/residual fused) and attention (pi0 and shallow6, "
                      "batch 1; H200: 1.2-1.3x over graph, 1.07x over compile + graph); the step's attention at any "
                      "batch and for pi0.5 (H200 batch 4: 1.24x, batch 8: 1.15x); its float32 heads as TF32x3 "
                      "products (1.02x on libero-pi0); the prefix attention (one K/V head: 24 vs 50 us a layer for "
                      "SDPA) with RoPE and the static-cache write as one kernel a layer (1.02x on libero-pi0 and at "
                      "batch 4; in the batched step too: 1.09x at batch 4, where inductor had copied the whole cache "
                      "for 8 of 18 layers).",
    "megakernel": "In `best` on Hopper GPUs for bfloat16 models, else opt-in. Grid barriers between its phases; pi0, "
                  "pi0.5 and shallow6 at batch 1 (H200: 1.28x over compile + graph + triton_kernels at 10 steps, "
                  "1.52x on a step). pi0.5 takes its adaptive norms from a per-step table (1.10-1.11x on libero-pi05, "
                  "then 1.17x from loading the norm statistics ahead of the K loops, then 1.03x from key splits "
                  "fitted to its 10 rows: the tiles' shape-dependent fields are fitted per launch). pi0 at up to 16 "
                  "rows, e.g. droid-pi0's 11, takes the norm statistics from the writers as pi0.5 does (1.08x). "
                  "`megakernel=batched` also sends batches of up to 256 suffix rows (pi0: 4 samples) to it in one "
                  "launch (checked; at batch 4 slower than the layers on the H200: 2.10 against 1.53 ms a step).",
}

# Levers outside the cumulative table and the CPU/`graph` presets. The kernels' tiles are
# tuned and measured on an H200 only (they may not fit smaller GPUs' shared memory), so `best`
# adds them on Hopper (compute capability 9.x) alone, for a bfloat16 model; elsewhere they are opt-in.
EXPERIMENTAL = ("triton_kernels", "megakernel")
TUNED_FOR = {"triton_kernels": (9,), "megakernel": (9,)}  # lever -> compute-capability majors where `best` uses it
# ... and the weights' dtypes they were tuned and measured for. In float32 the megakernel's tiles need 384 KiB of
# shared memory a block on libero-pi0, above a Hopper SM's 227 KiB (an H100, session 65); the step's other kernels fit
# but multiply float32 in IEEE float32 on FMA units, and graph + compile + triton_kernels took 401.8 ms a call on
# libero-pi0 in float32 against `best`'s 91.6 (an H100, session 67): `best` of a float32 model is compile + graph.
TUNED_DTYPES = (torch.bfloat16,)
# Levers that change how another applies: not in the cumulative table on their own, only
# after what they modify where `best` has them.
MODIFIERS = ("compile_layers",)
# What a lever needs beside it (`vlaperf check` adds these when it checks a lever alone).
REQUIRES = {"cuda_graph": ("for_loop",), "compile_layers": ("compile",), "triton_kernels": ("fuse_projections",),
            "megakernel": ("fuse_projections", "static_kv_cache")}

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Everything that is exact up to floating-point reordering ...
EXACT = ("for_loop", "skip_masked_images", "trim_prompt_padding", "static_kv_cache", "sdpa", "fuse_projections")
# ... plus one CUDA graph: ready in about a second ("graph"), and with inductor's fused
# kernels inside that graph, the fastest on an H200 but with a compile on the first call
# ("best"; falls back to "graph" where compile cannot run, e.g. no C compiler). The prefix is
# compiled layer block by layer block: as fast a call as the whole prefix in one graph, and a
# first call of 15.5 s instead of 35 on an H200 with empty caches (9.4 s with the engine's Triton
# kernels compiled in a thread meanwhile; docs/perf-notes.md, session 11).
GRAPH_GPU = EXACT + ("cuda_graph",)
BEST_GPU = GRAPH_GPU + ("compile=default", "compile_layers")
BEST_CPU = EXACT
PRESETS = {"best": "fastest variant for the device and dtype",
           "graph": "exact levers + one CUDA graph, no compile (GPU)",
           "exact": "every lever that needs neither graphs nor compile", "reference": "no levers (openpi semantics)"}


class LeverError(ValueError):
    """A lever that does not exist, or cannot apply here; the message says why."""


def refuse_second_value(kwargs: dict, name: str, value) -> None:
    """A lever given twice with two values ('compile=default,compile=max-autotune'): refused, where the last one
    would silently win."""
    if name in kwargs and kwargs[name] != value:
        show = lambda v: f"{name}={v}" if isinstance(v, str) else name  # noqa: E731
        raise LeverError(f"{name} given twice with different values: {show(kwargs[name])!r} and {show(value)!r}; "
                         "give one")


def lever_items(spec: "str | list[str] | tuple[str, ...]") -> list[str]:
    """A lever list's items, stripped. An empty item among others ('for_loop,,sdpa', 'for_loop,'), or a list of
    commas alone (',': '$A,$B' with neither set), is an error: a name was lost there; an empty list is no levers."""
    if not isinstance(spec, (str, list, tuple)) or not all(isinstance(s, str) for s in spec):
        raise LeverError(f"levers: expected a comma-separated string, a list of names or a Levers, got {spec!r}")
    raw = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    items = [s for s in raw if s]
    if len(items) != len(raw) and (items or len(raw) > 1):
        raise LeverError(f"empty lever name in {spec!r} (two commas in a row, or one at an end); "
                         f"expected comma-separated names such as 'for_loop,sdpa'")
    return items


def unknown_lever(spec: str) -> str | None:
    """The first name in a lever list that `Levers.parse` would refuse as no lever (a preset only as the whole
    list), or None: a typo, where a lever that cannot apply on this device is a row a matrix skips. An empty
    name among others raises LeverError, as `Levers.parse` does."""
    items = lever_items(spec)
    if len(items) == 1 and (items[0] in PRESETS or items[0] == "none"):
        return None
    return next((name for name in (item.partition("=")[0] for item in items) if name not in LEVERS), None)


def _capability_major(device: torch.device | str) -> int | None:
    """The CUDA compute-capability major of `device` (9 for H100/H200), None if unknown."""
    try:
        return torch.cuda.get_device_capability(torch.device(device))[0]
    except Exception:
        return None


def several_variants(spec) -> str:
    """The error for a ';' list where one variant is taken."""
    spec = spec if isinstance(spec, str) else ",".join(spec)
    return (f"{spec!r} holds several variants (';'); this command runs one: give one, or compare them with "
            f"`vlaperf matrix --variants '{spec}'`")


@dataclass(frozen=True)
class Levers:
    for_loop: bool = False
    skip_masked_images: bool = False
    trim_prompt_padding: bool = False
    static_kv_cache: bool = False
    sdpa: bool = False
    fuse_projections: bool = False
    cuda_graph: bool = False
    compile: str | None = None  # one of COMPILE_MODES, or None
    compile_layers: bool = False  # compile the prefix layer by layer (needs compile)
    triton_kernels: bool = False
    megakernel: bool | str = False  # True: batch 1; "batched": up to 256 suffix rows of several samples (slower at batch 4)

    @classmethod
    def parse(cls, spec: "str | list[str] | tuple[str, ...] | Levers | None", device: torch.device | str = "cpu",
              dtype: torch.dtype | None = None) -> "Levers":
        """'none' / 'reference' / '' -> no levers; 'best', 'graph', 'exact' -> PRESETS;
        otherwise a comma-separated list, e.g. 'for_loop,sdpa,compile=reduce-overhead'. `dtype`: the model's, where
        known: `best` adds the kernels only for the dtypes they were tuned for (TUNED_DTYPES); None takes bfloat16,
        the GPU's default."""
        if isinstance(spec, Levers):
            return spec
        if spec is None:
            return cls()
        items = lever_items(spec)
        if items in ([], ["none"], ["reference"]):
            return cls()
        on_gpu = torch.device(device).type == "cuda"
        if items == ["best"]:
            from vlaperf.engine.compile import compile_blockers

            compiles = on_gpu and not compile_blockers("inductor", "cuda")
            items = list(BEST_GPU if compiles else GRAPH_GPU if on_gpu else BEST_CPU)
            if on_gpu and (dtype is None or dtype in TUNED_DTYPES):
                items += [name for name, majors in TUNED_FOR.items() if _capability_major(device) in majors]
        elif items == ["graph"]:
            items = list(GRAPH_GPU)
        elif items == ["exact"]:
            items = list(EXACT)
        kwargs: dict = {}
        for item in items:
            name, _, value = item.partition("=")
            if name in PRESETS and name not in LEVERS:
                raise LeverError(f"{name!r} is a preset: give it alone (--levers {name}), or list the levers it holds "
                                 f"with the others (`vlaperf levers` shows them)")
            if ";" in item:  # several variants where one is taken (bench, breakdown, syncs, doctor, serve)
                raise LeverError(several_variants(spec))
            if name not in LEVERS:
                near = difflib.get_close_matches(name.lower(), [*LEVERS, *PRESETS], n=1, cutoff=0.75)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise LeverError(f"unknown lever {name!r}{hint}; expected one of: {', '.join(LEVERS)} (or, as the "
                                 f"whole list, a preset: {', '.join(p for p in PRESETS if p != 'reference')}, or "
                                 "'reference' / 'none')")
            if name == "compile":
                refuse_empty_mode(item)
                mode = value or "default"
                if mode not in COMPILE_MODES:
                    raise LeverError(f"compile mode {mode!r} is not one of: {', '.join(COMPILE_MODES)}")
                setting = mode
            elif name == "megakernel" and value:
                if value != "batched":
                    raise LeverError(f"megakernel takes no value or 'batched' (several samples in one launch), got {item!r}")
                setting = "batched"
            elif value:
                raise LeverError(f"lever {name!r} takes no value, got {item!r}")
            else:
                setting = True
            refuse_second_value(kwargs, name, setting)
            kwargs[name] = setting
        return cls(**kwargs)

    def names(self) -> list[str]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "compile":
                if value:
                    out.append(f"compile={value}")
            elif f.name == "megakernel" and isinstance(value, str):
                out.append(f"megakernel={value}")
            elif value:
                out.append(f.name)
        return out

    def label(self) -> str:
        return "+".join(self.names()) or "reference"

    def check(self, device: torch.device | str) -> None:
        """Raise LeverError if a lever cannot apply on `device` or with the others."""
        device = torch.device(device)
        if self.compile is not None and self.compile not in COMPILE_MODES:  # a Levers built directly, not parsed
            raise LeverError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.cuda_graph:
            if device.type != "cuda":
                raise LeverError("cuda_graph needs a CUDA device; this run is on " + device.type)
            if not self.for_loop:
                raise LeverError("cuda_graph needs for_loop: the reference while-loop reads a device tensor on the host, which cannot be captured")
            if self.compile in ("reduce-overhead", "max-autotune"):
                raise LeverError(f"cuda_graph and compile={self.compile} both capture CUDA graphs; use compile=default or max-autotune-no-cudagraphs with cuda_graph")
        if self.compile_layers and not self.compile:
            raise LeverError("compile_layers needs compile: it changes how the prefix is compiled (add compile, "
                             "e.g. compile=default)")
        if self.compile in ("reduce-overhead", "max-autotune") and device.type != "cuda":
            raise LeverError(f"compile={self.compile} uses CUDA graphs and needs a CUDA device")
        if self.triton_kernels:  # the device first: on a CPU, adding the other levers would not help
            _triton_device(device, "triton_kernels")
            if not self.fuse_projections:
                raise LeverError("triton_kernels needs fuse_projections: its kernels take the RMSNorm scales folded "
                                 "into the weights (e.g. --levers fuse_projections,triton_kernels, or take best)")
        if self.megakernel:
            _triton_device(device, "megakernel")
            missing = [needed for needed in REQUIRES["megakernel"] if not getattr(self, needed)]
            if missing:  # all of them at once, and the spelling that runs (only `check --levers all` adds them)
                raise LeverError(f"megakernel needs {' and '.join(missing)}: its kernel takes folded RMSNorm scales "
                                 "and reads the prefix keys from the static cache (name them beside it, e.g. --levers "
                                 f"{','.join(REQUIRES['megakernel'])},megakernel, or take best)")


def refuse_empty_mode(item: str) -> None:
    """'compile=' (an unset shell variable after the '='?) is not 'compile': refused, not run as the default mode."""
    if item.endswith("="):
        raise LeverError(f"{item!r}: no compile mode after '='; expected one of: {', '.join(COMPILE_MODES)} (or "
                         "'compile' alone for default)")


def _triton_device(device: torch.device, lever: str) -> None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise LeverError(f"{lever} needs a CUDA device (or TRITON_INTERPRET=1, Triton's slow CPU interpreter, for tests)")
