"""`best` (or --levers) with one engine change against the same without it, in one process,
interleaved: the whole call, as `step_config_ab.py` does for the step kernel's tilings.

    python benchmarks/change_ab.py --change siglip_gelu_epilogue --json $OUT/change_ab_gelu.json
    python benchmarks/change_ab.py --change step_attention_kernel --workload libero-pi0-b4

Engine A is compiled and captured with the change undone (a context around its first call:
the CUDA graph keeps what was captured, so undoing it only for that call is enough); B runs
the same levers with the change. Changes:
  siglip_gelu_epilogue   SigLIP's fc1 + GELU(tanh) as one cuBLASLt GEMM with the activation in
                         its epilogue (`_addmm_activation`) instead of a GEMM and an inductor
                         kernel. Also checks, on the GPU, that the epilogue is the tanh GELU.
                         (Session 8's first run wrote its file as command "prefix-ab".)
  step_attention_kernel  the step's torch layers (batches, pi0.5) attend through the split-key
                         Triton kernel instead of the folded matmuls (loop.step_attention_kernel).
  patch_matmul           SigLIP's patch embedding as one float32 matmul of the patches
                         (prefix.patch_embed) instead of cuDNN's convolution.
  patch_tf32             that matmul in TF32 on the tensor cores (bf16 models: EngineWeights.patch_tf32)
                         instead of cuBLAS's float32 FFMA kernel (~39 us in session 21's sequence)
  kv_align               the static cache's keys rounded up to a multiple of 8 (engine.KV_ALIGN),
                         padding masked, against exactly Tp + Ts keys: aligned rows for the
                         folded attention matmuls (the path without triton_kernels: --levers)
  rope_cache_kernel      the prefix's RoPE on q and k and its static-cache write as one kernel a
                         layer (kernels/rope_qkv.py, with triton_kernels) instead of inductor's
                         kernels (which rebuilt the whole cache buffer per layer)
  step_kernel            the denoise step through the step kernel (`megakernel`) against the
                         layers: for pi0.5 (--workload libero-pi05), whose adaptive norms the
                         kernel takes as a per-step table since session 9
  between_steps          the Euler update folded into the action head and the step kernel's op
                         updating its input in place (c38e9b4), against the update written out
                         and the op copying its input; `euler_fold` and `step_in_place` each half
  merge_dims             the split-key attention's merge with its head dim in parts a program
                         (suffix_attention.merge_block_d: at least MERGE_PROGRAMS programs)
                         against one program a row block: the prefix's merge, and the step's at
                         a batch (--workload libero-pi0-b4)
  step_rope_cache_kernel the step's RoPE and cache write as one kernel a layer (loop.step_rope_cache_kernel,
                         the layers' path: batches) instead of two copies into the cache's slices
  step_token_major       the step's attention output written token-major (loop.STEP_TOKEN_MAJOR, ops.step_attention):
                         no transpose copy before the output projection
  wave_splits            the step attention's key splits capped at one wave of programs
                         (suffix_attention.default_splits) against the rounded-up count before
  prefix_splits          the prefix attention's key splits picked for the shape (suffix_attention.prefix_splits: up
                         to 3 in one wave, one pass where a split fills a wave; batches, 712+ prefix rows) against
                         3 at every shape, as before session 36
  step_splits            a candidate, not a change made: the step attention's key splits at a batch (the layers'
                         path) fixed at --step-splits N on the with-side, against today's rule
                         (suffix_attention.default_splits) on the without-side
  inductor_pdl           inductor's kernels with programmatic dependent launch (Hopper: a kernel is launched
                         while the one before drains, and waits in-kernel, `gdc_wait`, only before
                         its first read of what that one wrote; compile.INDUCTOR_PDL, the option
                         triton.enable_pdl) against inductor's default launches. Engine A is built as
                         well as first called without it (the options are bound when the engine is built),
                         and dynamo's caches are reset between the two engines' first calls, so engine B
                         never reuses engine A's compiled code; the probe counts the generated kernels
                         that wait (`gdc_wait`) in this process's inductor cache.
  lt_fc2                 SigLIP's fc2 through cuBLASLt's heuristic's first algorithm at a 32 MiB workspace limit
                         (SiglipLayerW.fc2_lt, kernels/cublaslt.py) against torch's F.linear, which asks under
                         torch's own limit and gets a slower kernel on the H200 (cublaslt_probe.py)
  mask_align             the attention kernels' uint8 masks in rows padded to 16 bytes (suffix_attention.aligned_mask):
                         the prefix's (aligned already at libero-pi0's 544 rows: give --valid 8 for 520) and, since
                         session 31, the step's (600 keys a row at libero-pi0), against rows of exactly Tk bytes
  mask_once              the step's kernel mask made once a call (loop.SuffixContext.kernel_mask) against once a
                         step, as before session 31 (ten cast kernels a call instead of one)
  kernel_pdl             the denoise loop's Triton kernels (launch.DENOISE_LOOP_KERNELS: the step kernel and
                         the heads between its launches) launched with PDL, each waiting for the kernel
                         before it as its first instruction (kernels/launch.py), against none of ours.
                         Session 21's run of it, at 27a3de5, had every kernel of ours (the prefix's
                         attention and RoPE too) on the with-side.
Tried and taken out (docs/perf-notes.md, session 8): siglip_sdpa_flash (SDPA's flash kernel
first for SigLIP's attention, at 1d8a3f5) and siglip_attention_kernel (SigLIP's attention
through the split-key Triton kernel, at 0ccbea4, and with swept tiles at 8a3233d): no gain.
Session 18: input_copy (a replay's inputs copied into the graph's static buffers as one list of
bytes, one multi-tensor kernel, instead of a copy call per input, at d211137): 0.994x.
Session 19: split_gate_up (layers.SPLIT_GATE_UP, off: on for engine B only) Gemma's stacked gate_up as two
GEMMs of its halves, which at the prefix's shape come without cuBLAS's memset node (memset_probe.py).
Session 24: lt_fastest (at 1ea7fbf: SigLIP's fc2 and o and Gemma's down through cuBLASLt, each shape's fastest
zero-workspace algorithm timed at its first call, against best): 0.993x on libero-pi0.
Session 11: fused_loop (the loop around the step kernel with one launch between steps for the
action head, the Euler update and the next tokens, kernels/denoise_loop.py at 38a4931): 0.985x.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from engine_ab import ab_result, finish, interleave  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.check import check_equivalence
from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.timing import require_cuda
from vlaperf.workloads import get_workload


@contextlib.contextmanager
def patched(owner, name: str, value):
    """owner.name = value inside the block (a module switch or function), restored after."""
    real = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, real)


@contextlib.contextmanager
def without_gelu_epilogue(engine: Engine):
    for lw in engine.weights.vision:
        lw.gelu_epilogue = False
    yield


def without_step_attention_kernel(engine: Engine):
    from vlaperf.engine import loop

    return patched(loop, "step_attention_kernel", lambda *a: None)


def gelu_epilogue_check(model) -> dict:
    """`_addmm_activation(use_gelu=True)` against F.gelu tanh / erf on SigLIP's fc1 shape (two
    images' rows), in float32 and in the model's dtype: which GELU the epilogue computes here."""
    fc1 = model.vision.encoder.layers[0].mlp.fc1
    out = {}
    for dtype in (torch.float32, fc1.weight.dtype):
        w, b = fc1.weight.to(dtype), fc1.bias.to(dtype)
        h = torch.randn(512, w.shape[1], device=w.device, dtype=dtype)
        fused = torch._addmm_activation(b, h, w.t(), use_gelu=True).float()
        pre = F.linear(h.float(), w.float(), b.float())
        out[str(dtype).split(".")[-1]] = {
            "max_abs_vs_tanh": (fused - F.gelu(pre, approximate="tanh")).abs().max().item(),
            "max_abs_vs_erf": (fused - F.gelu(pre)).abs().max().item()}
    return out


@contextlib.contextmanager
def without_patch_matmul(engine: Engine):
    engine.weights.patch = None
    yield


@contextlib.contextmanager
def without_patch_tf32(engine: Engine):
    engine.weights.patch_tf32 = False
    yield


def switched(module: str, name: str, value):
    """The undo of a change behind a module switch: `module.name = value` for engine A's first call."""
    import importlib

    return lambda engine: patched(importlib.import_module(module), name, value)


without_kv_align = switched("vlaperf.engine.engine", "KV_ALIGN", 1)
without_split_gate_up = switched("vlaperf.engine.layers", "SPLIT_GATE_UP", False)
without_rope_cache_kernel = switched("vlaperf.engine.prefix", "FUSED_ROPE_CACHE_WRITE", False)
without_merge_dims = switched("vlaperf.engine.kernels.suffix_attention", "MERGE_PROGRAMS", 0)
without_step_rope_cache_kernel = switched("vlaperf.engine.loop", "FUSED_STEP_ROPE_CACHE_WRITE", False)
without_step_token_major = switched("vlaperf.engine.loop", "STEP_TOKEN_MAJOR", False)


def without_prefix_splits(engine: Engine):
    """Before session 36: the prefix attention's keys in 3 splits at every shape."""
    from vlaperf.engine.kernels import suffix_attention

    return patched(suffix_attention, "prefix_splits", lambda blocks: 3)


def without_wave_splits(engine: Engine):
    """Before session 20: at least WAVE_PROGRAMS programs, the splits rounded up."""
    import triton

    from vlaperf.engine.kernels import suffix_attention

    return patched(suffix_attention, "default_splits",
                   lambda Tk, block_n, blocks: max(1, min(triton.cdiv(Tk, 4 * block_n), triton.cdiv(264, blocks))))


def with_today_step_splits(engine: Engine):
    """step_splits' without-side: today's rule (the with-side's fixed count is set for the process in main)."""
    from vlaperf.engine.kernels import suffix_attention

    return patched(suffix_attention, "default_splits", TODAY_DEFAULT_SPLITS)


TODAY_DEFAULT_SPLITS = None  # suffix_attention.default_splits, kept in main before step_splits replaces it


@contextlib.contextmanager
def without_step_kernel(engine: Engine):
    engine.weights.expert_stack = None  # the layers keep their own views of the stacked weights
    yield


@torch.library.custom_op("vlaperf_ab::expert_step_copying", mutates_args=("x",))
def _expert_step_copying(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         mask: torch.Tensor, eps: float, mod: torch.Tensor | None = None) -> None:
    """The step kernel's op with a copy of its input, as before c38e9b4 (which copied x and
    returned the copy): a copy in, the kernel, a copy back (two 104 KB copies where there were
    a copy and a second counter fill, ~1 us apart on the H200)."""
    from vlaperf.engine.kernels import expert_step as S

    y = x.clone()
    S.expert_step(y, wqkv, wo, wgu, wd, k_cache, v_cache, cos, sin, mask, eps, mod=mod, in_place=True)
    x.copy_(y)


@_expert_step_copying.register_fake
def _(x, wqkv, wo, wgu, wd, k_cache, v_cache, cos, sin, mask, eps, mod=None):
    return None


def without_euler_fold(engine: Engine):
    """c38e9b4's first half: the Euler update written out (two eager kernels a step)."""
    from vlaperf.engine import fusion

    return patched(fusion, "euler_tables", lambda model, num_steps: {})


def without_step_in_place(engine: Engine):
    """c38e9b4's second half: the step kernel's op copying its input."""
    from vlaperf.engine.kernels import ops

    return patched(ops, "expert_step", _expert_step_copying)


@contextlib.contextmanager
def without_between_steps_trims(engine: Engine):
    """c38e9b4: both."""
    with without_euler_fold(engine), without_step_in_place(engine):
        yield


@contextlib.contextmanager
def without_lt_fc2(engine: Engine):
    for lw in engine.weights.vision:
        lw.fc2_lt = False
    yield


def lt_fc2_choice(model) -> dict:
    """The algorithm cuBLASLt's heuristic gave each shape the engine sent it (kernels/cublaslt.py)."""
    from vlaperf.engine.kernels import cublaslt

    return {"x".join(map(str, key[:3])): (None if c is None else c[0].config(c[1])) for key, c in cublaslt._chosen.items()}


without_inductor_pdl = switched("vlaperf.engine.compile", "INDUCTOR_PDL", False)
without_kernel_pdl = switched("vlaperf.engine.kernels.launch", "PDL_KERNELS", frozenset())


def pdl_kernel_count(model) -> dict:
    """How many of inductor's generated kernel sources in this process's cache wait in-kernel."""
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    total = waiting = 0
    for root, _, files in os.walk(cache_dir()):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), errors="replace") as f:
                    text = f.read()
                if "@triton.jit" in text:
                    total += 1
                    waiting += "gdc_wait" in text
    return {"inductor_cache": cache_dir(), "triton_sources": total, "with_gdc_wait": waiting}


def without_mask_align(engine: Engine):
    """Before session 30: the attention kernels' uint8 masks with rows of exactly Tk bytes (520 for a prefix with an
    8-token prompt, 600 for libero-pi0's step), which Triton could not prove 16-byte aligned. (Session 30's part e, at
    8d75965, aligned the step kernel's mask inside its op, copying it every step: 0.997x at libero-pi0.)"""
    from vlaperf.engine.kernels import suffix_attention

    return patched(suffix_attention, "aligned_mask", lambda m: m.to(torch.uint8) if m.dtype == torch.bool else m)


def without_mask_once(engine: Engine):
    """Before session 31: the step's kernel mask cast from the bool mask at every step."""
    from vlaperf.engine import loop
    from vlaperf.engine.kernels.suffix_attention import aligned_mask

    return patched(loop.SuffixContext, "kernel_mask", lambda ctx, mask: None if mask is None else aligned_mask(mask))


CHANGES = {"siglip_gelu_epilogue": (without_gelu_epilogue, gelu_epilogue_check),
           "step_attention_kernel": (without_step_attention_kernel, lambda model: {}),
           "patch_matmul": (without_patch_matmul, lambda model: {}),
           "patch_tf32": (without_patch_tf32, lambda model: {}),
           "kv_align": (without_kv_align, lambda model: {}),
           "rope_cache_kernel": (without_rope_cache_kernel, lambda model: {}),
           "step_kernel": (without_step_kernel, lambda model: {}),
           "between_steps": (without_between_steps_trims, lambda model: {}),
           "euler_fold": (without_euler_fold, lambda model: {}),
           "step_in_place": (without_step_in_place, lambda model: {}),
           "split_gate_up": (without_split_gate_up, lambda model: {}),
           "merge_dims": (without_merge_dims, lambda model: {}),
           "step_rope_cache_kernel": (without_step_rope_cache_kernel, lambda model: {}),
           "step_token_major": (without_step_token_major, lambda model: {}),
           "wave_splits": (without_wave_splits, lambda model: {}),
           "prefix_splits": (without_prefix_splits, lambda model: {}),
           "step_splits": (with_today_step_splits, lambda model: {}),
           "inductor_pdl": (without_inductor_pdl, pdl_kernel_count),
           "kernel_pdl": (without_kernel_pdl, lambda model: _pdl_here()),
           "mask_align": (without_mask_align, lambda model: {}),
           "mask_once": (without_mask_once, lambda model: {}),
           "lt_fc2": (without_lt_fc2, lt_fc2_choice)}
# changes whose switch is off in the engine: turned on for this process (engine B), undone for engine A
# (module, name, value; a str value names the module's constant to use)
SWITCH_ON = {"split_gate_up": ("vlaperf.engine.layers", "SPLIT_GATE_UP", True),
             "kernel_pdl": ("vlaperf.engine.kernels.launch", "PDL_KERNELS", "DENOISE_LOOP_KERNELS")}
# changes bound when an engine is built (compile options): engine A is built inside the undo too, and dynamo's
# caches are reset before engine B's first call
AT_CONSTRUCTION = ("inductor_pdl",)


def _pdl_here() -> dict:
    from vlaperf.engine.kernels import launch, small_m_matmul

    return {"pdl_kernels": sorted(launch.PDL_KERNELS), "small_m_with_pdl": launch.pdl_here(small_m_matmul._small_m_kernel)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="libero-pi0")
    p.add_argument("--change", required=True, choices=sorted(CHANGES))
    p.add_argument("--levers", default="best", help="both engines' levers (default best)")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--valid", type=int, default=None,
                   help="valid prompt tokens of every sample (default: the workload's); e.g. 8 for a 520-row prefix")
    p.add_argument("--step-splits", type=int, default=None, help="step_splits: the with-side's fixed key splits")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if (args.change == "step_splits") != (args.step_splits is not None):
        raise SystemExit("--step-splits: give it with --change step_splits, and only then")
    if args.step_splits is not None and args.step_splits < 1:
        raise SystemExit(f"--step-splits: expected a number of key splits >= 1, got {args.step_splits}")
    undo, probe = CHANGES[args.change]
    base = w = get_workload(args.workload)
    if args.valid is not None:
        if args.valid < 1:
            raise SystemExit(f"--valid: expected a number of prompt tokens >= 1, got {args.valid}")
        w = dataclasses.replace(w, prompt_valid=(args.valid,) * len(w.prompt_valid))
    if args.change in SWITCH_ON:
        import importlib

        module, name, value = SWITCH_ON[args.change]
        owner = importlib.import_module(module)
        setattr(owner, name, getattr(owner, value) if isinstance(value, str) else value)  # a str: another of its names
    if args.change == "step_splits":
        global TODAY_DEFAULT_SPLITS
        from vlaperf.engine.kernels import suffix_attention

        TODAY_DEFAULT_SPLITS = suffix_attention.default_splits
        suffix_attention.default_splits = lambda Tk, block_n, blocks: args.step_splits
    model = build_model(w.model_config(), "cuda")
    obs, noise = random_observation(w, model.config, "cuda"), random_noise(w, model.config, "cuda")
    if args.change in AT_CONSTRUCTION:
        with undo(None):
            without = Engine(model, args.levers)
            out_without = without.sample_actions(obs, noise, w.steps)
        torch._dynamo.reset()  # engine A's graph is captured; its compiled code must not serve engine B
    else:
        without = Engine(model, args.levers)
        with undo(without):
            out_without = without.sample_actions(obs, noise, w.steps)  # compiled and captured without the change
    today = Engine(model, args.levers)
    out_today = today.sample_actions(obs, noise, w.steps)
    samples = interleave({"without": lambda: without.sample_actions(obs, noise, w.steps),
                          "with": lambda: today.sample_actions(obs, noise, w.steps)}, args.rounds)
    result = ab_result("change-ab", w, model, today, samples, "without", "with")
    result["workload"]["overrides"] = w.overrides_vs(base)
    result.update(change=args.change, probe={**probe(model), **({"step_splits": args.step_splits} if args.step_splits else {})},
                  rel_l2_with_vs_without=((out_today - out_without).norm() / out_without.norm()).item(),
                  equivalence_with=check_equivalence(model, today, w))
    print("probe:", result["probe"])
    finish(result, "rel_l2_with_vs_without", "equivalence_with", args.json)


if __name__ == "__main__":
    require_cuda(__file__)
    main()
