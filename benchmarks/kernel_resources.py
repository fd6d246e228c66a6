"""What the step kernel (`megakernel`) compiles to on Hopper, without a GPU.

Compiles vlaperf.engine.kernels.expert_step for sm_90a with Triton's compiler and its bundled
ptxas, on pi0's expert shapes, with the divisibility hints a real launch gets (pointers and
strides multiple of 16), and reports per kernel: registers a thread, spilled bytes, shared
memory, and the global loads and stores by instruction (a `.b16` load is one bf16 element; a
`.v4.b32` load is 16 bytes). The whole kernel first, then each phase compiled alone, which
shows which phase sets the kernel's register count.

    python benchmarks/kernel_resources.py                       # the defaults
    python benchmarks/kernel_resources.py num_warps=16 att_bm=16
    python benchmarks/kernel_resources.py --timeline            # with the clock readings compiled in
    python benchmarks/kernel_resources.py --samples=4           # the whole kernel for 4 samples (256-row block)
    python benchmarks/kernel_resources.py --mod                 # with pi0.5's modulated norms
    python benchmarks/kernel_resources.py --mod --rows=10 --keys=586   # at libero-pi05's shape (10 action rows)

These are compiler facts, not timings, and they depend on the Triton version: Triton 3.9
issued 2-byte loads where 3.6 (the H200 machine's) issued 16-byte ones (docs/perf-notes.md,
version 14). To see what the GPU machine compiles, run this under its version, e.g. from a
scratch virtual environment with `pip install triton==3.6.0` and the project's torch on the path.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from step_kernel_once import parse_config  # benchmarks/ (the script's folder is on sys.path)

from vlaperf.engine.kernels import expert_step as S
from vlaperf.models.pi0 import ATTENTION_MASK_VALUE

L, D, NH, HD, F, M, TK = 18, 1024, 8, 256, 4096, 51, 595
PROGRAMS = 132  # the H200's SMs: the persistent launch's programs, which the fitted fields follow
BLOCK_M = 64
FLOAT_BUFFERS = {"acc_ptr", "ml_ptr", "part_ptr", "mod_ptr", "ssq_ptr"}
INT_BUFFERS = {"tile_ctr_ptr", "counter_ptr", "err_ptr"}
ALIGNED_INTS = {"keys_per_split", "stride_cl", "stride_cb", "stride_ct", "K"}


_LAST_PTX = [""]


def last_ptx() -> str:
    """The PTX of the last `compile_kernel` call (tests look for instructions in it)."""
    return _LAST_PTX[0]


def _ptxas() -> str:
    folder = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    names = [n for n in ("ptxas-blackwell", "ptxas") if os.path.exists(os.path.join(folder, n))]
    if not names:
        raise SystemExit(f"no ptxas under {folder}")
    return os.path.join(folder, names[0])


def compile_kernel(fn, constexprs: dict, num_warps: int, num_stages: int, ptxas: bool = True,
                   fp_fusion: bool = True, weights: str = "*bf16") -> dict:
    """PTX instruction counts, shared memory, and (with `ptxas`) registers and spills; fused multiply-add
    as `launch` asks for it (`fp_fusion`); `weights`: the Triton type of the weight and activation pointers
    ("*fp32" for a float32 model)."""
    names = list(inspect.signature(fn.fn).parameters)
    signature = {}
    for n in names:
        if n in constexprs:
            signature[n] = "constexpr"
        elif n.endswith("_ptr"):
            signature[n] = ("*fp32" if n in FLOAT_BUFFERS else "*i32" if n in INT_BUFFERS else "*i64" if n == "ts_ptr"
                            else "*u8" if n == "mask_ptr" else weights)
        else:
            signature[n] = "fp32" if n in ("eps", "scale") else "i32"
    hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr") or n in ALIGNED_INTS}
    source = triton.compiler.ASTSource(fn=fn, signature=signature,
                                       constexprs={n: constexprs[n] for n in names if n in constexprs}, attrs=hints)
    options = dict(num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=fp_fusion)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    _LAST_PTX[0] = ptx
    counts = {"shared_bytes": compiled.metadata.shared,
              "loads": dict(Counter(re.findall(r"\bld\.global[\w.:]*", ptx))),
              "stores": dict(Counter(re.findall(r"\bst\.global[\w.:]*", ptx))),
              "async_copies": len(re.findall(r"\bcp\.async\.c[ag]\.shared", ptx)),
              "l2_prefetches": len(re.findall(r"\bprefetch\.global\.L2", ptx))}
    if not ptxas:
        return counts
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        done = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    report = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if regs is None or spills is None:
        raise SystemExit(f"ptxas did not report resources:\n{report[-2000:]}")
    return {"registers": int(regs.group(1)), "spill_store_bytes": int(spills.group(1)),
            "spill_load_bytes": int(spills.group(2)), **counts}


# each phase alone, on the same shapes (the kernel's phase functions are plain @triton.jit helpers)
@triton.jit
def _qkv_alone(x_ptr, w_ptr, q_ptr, kv_ptr, cos_ptr, sin_ptr, M, eps, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
               ROTATE: tl.constexpr):
    S._phase_qkv(x_ptr, w_ptr, q_ptr, kv_ptr, cos_ptr, sin_ptr, kv_ptr, M, eps, tl.program_id(0), tl.num_programs(0),
                 1024, 8, 256, 64, BN, BK, STAGES, ROTATE, False)


@triton.jit
def _attention_alone(q_ptr, kv_ptr, kc_ptr, vc_ptr, mask_ptr, acc_ptr, ml_ptr, o_ptr, tile_ctr_ptr, M, Tk, Tp, keys_per_split,
                     scale, stride_cb, stride_ct, stride_mb, stride_mq, ABM: tl.constexpr, ABN: tl.constexpr,
                     SPLITS: tl.constexpr, MD: tl.constexpr, ATT_STAGES: tl.constexpr, EARLY_V: tl.constexpr,
                     ROTATE: tl.constexpr):
    S._phase_attention(q_ptr, kv_ptr, kc_ptr, vc_ptr, mask_ptr, acc_ptr, ml_ptr, o_ptr, tile_ctr_ptr, M, Tk, Tp, keys_per_split,
                       scale, stride_cb, stride_ct, stride_mb, stride_mq, tl.program_id(0), tl.num_programs(0), 8, 256, 64,
                       ABM, ABN, SPLITS, -2.3819763e38, ATT_STAGES, False, MD, EARLY_V, ROTATE, 1, tile_ctr_ptr, tile_ctr_ptr,
                       8, False, 1, False)


@triton.jit
def _merge_alone(acc_ptr, ml_ptr, o_ptr, M, ABM: tl.constexpr, SPLITS: tl.constexpr, MD: tl.constexpr):
    S._phase_merge(acc_ptr, ml_ptr, o_ptr, acc_ptr, acc_ptr, M, tl.program_id(0), tl.num_programs(0), 8, 256, ABM, SPLITS,
                   MD, 1, False, 1, False)


@triton.jit
def _residual_alone(a_ptr, K, w_ptr, x_ptr, part_ptr, tile_ctr_ptr, M, BN: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr,
                    STAGES: tl.constexpr, ROTATE: tl.constexpr):
    S._phase_residual(a_ptr, K, w_ptr, x_ptr, part_ptr, tile_ctr_ptr, M, tl.program_id(0), tl.num_programs(0), 1024, 64,
                      BN, BK, KS, STAGES, ROTATE)


@triton.jit
def _gate_up_alone(x_ptr, w_ptr, h_ptr, part_ptr, tile_ctr_ptr, M, eps, BN: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr,
                   STAGES: tl.constexpr, ROTATE: tl.constexpr):
    S._phase_gate_up(x_ptr, w_ptr, h_ptr, part_ptr, tile_ctr_ptr, M, eps, tl.program_id(0), tl.num_programs(0), 1024, 4096,
                     64, BN, BK, KS, STAGES, ROTATE)


def whole_kernel_constexprs(cfg: S.StepKernelConfig, timeline: bool = False, samples: int = 1, mod: bool = False) -> dict:
    """What the launcher passes for pi0's shapes; `samples` > 1: the batched kernel (one row
    block of all samples' rows, K blocks shallower beyond 64 rows, as expert_step does);
    `mod`: pi0.5's modulated norms and gated residuals (the same shapes). The fitted fields are
    resolved for the H200's 132 programs, as the launch does."""
    cfg = S.fit_config(cfg, M, samples, NH, HD, TK, PROGRAMS)
    splits, _ = S.key_splits(cfg, TK)
    targets = S.split_counter_targets(cfg, M, NH, D, F, TK, samples, HD)
    block_m = S.row_block(samples * M)
    bk = S.k_depths(cfg, block_m)
    ctr_o = samples * triton.cdiv(NH * M, cfg.att_bm)
    ctr_gu = ctr_o + triton.cdiv(D, cfg.bn_o)
    ctr_down = ctr_gu + triton.cdiv(F, cfg.bn_gu)
    return dict(D=D, NH=NH, HD=HD, F=F, BLOCK_M=block_m, BN_QKV=cfg.bn_qkv, BK_QKV=bk["bk_qkv"], BN_O=cfg.bn_o,
                BK_O=bk["bk_o"], BN_GU=cfg.bn_gu, BK_GU=bk["bk_gu"], BN_DOWN=cfg.bn_down, BK_DOWN=bk["bk_down"],
                ABM=cfg.att_bm, ABN=cfg.att_bn,
                SPLITS=splits, MD=min(cfg.merge_bd, HD), MASK_VALUE=ATTENTION_MASK_VALUE, STAGES=cfg.num_stages,
                ATT_STAGES=cfg.att_stages, USE_BARRIER=True, POLL_LOAD=cfg.poll_load, MAX_SPIN=1 << 22,
                **S.prefetch_phases(cfg.prefetch), ELEMS_PER_LINE=64, L=L, KS_O=cfg.ks_o, KS_GU=cfg.ks_gu, KS_DOWN=cfg.ks_down,
                FOLD_MERGE=cfg.fold_merge, BARRIER_ASM=cfg.barrier_asm, POLL_ONE=cfg.poll_one, CTR_O=ctr_o, CTR_GU=ctr_gu, CTR_DOWN=ctr_down,
                CTR_LAYER=len(targets), TIMELINE=timeline, EARLY_V=cfg.att_early_v,
                IDLE_PREFETCH=cfg.idle_prefetch, ROTATE=cfg.k_rotate, NB=samples, DATAFLOW=cfg.dataflow,
                CTR_SLOT=ctr_down + triton.cdiv(D, cfg.bn_down), PREFETCH_OWN=cfg.prefetch_own, MOD=mod,
                EARLY_MOD=cfg.early_mod_loads, SCALE_AFTER_LOOP=cfg.scale_after_loop, MOD_PREFETCH=cfg.mod_prefetch,
                **S.ssq_constexprs(cfg, mod, D), ROPE_AHEAD=cfg.rope_ahead, QKV_PAIRS=cfg.qkv_pairs,
                SSQ_SUM=S.ssq_sum_mode(cfg), POLL_DEPTH=cfg.poll_depth, POLL_GAP=cfg.poll_gap, ONE_DOT=cfg.one_dot,
                ADS=cfg.att_dsplit, SUB_M=S.sub_rows(cfg, block_m))


def main() -> None:
    global M, TK
    timeline, mod = "--timeline" in sys.argv[1:], "--mod" in sys.argv[1:]
    samples = [int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--samples=")] or [1]
    for a in sys.argv[1:]:  # --rows=10 --keys=586: libero-pi05's shape (the whole kernel; the phases alone stay pi0's)
        if a.startswith("--rows="):
            M = int(a.split("=")[1])
        if a.startswith("--keys="):
            TK = int(a.split("=")[1])
    cfg = parse_config([a for a in sys.argv[1:] if a not in ("--timeline", "--mod") and a.split("=")[0] not in
                        ("--samples", "--rows", "--keys")])
    cfg = S.fit_config(cfg, M, samples[0], NH, HD, TK, PROGRAMS)
    splits, _ = S.key_splits(cfg, TK)
    kernels = [(f"whole step kernel ({samples[0]} sample{'s' if samples[0] > 1 else ''})", S._expert_step_kernel,
                whole_kernel_constexprs(cfg, timeline, samples[0], mod)),
               ("qkv", _qkv_alone, dict(BN=cfg.bn_qkv, BK=cfg.bk_qkv, STAGES=cfg.num_stages, ROTATE=cfg.k_rotate)),
               ("attention", _attention_alone, dict(ABM=cfg.att_bm, ABN=cfg.att_bn, SPLITS=splits, MD=min(cfg.merge_bd, HD),
                                                    ATT_STAGES=cfg.att_stages, EARLY_V=cfg.att_early_v, ROTATE=cfg.k_rotate)),
               ("merge", _merge_alone, dict(ABM=cfg.att_bm, SPLITS=splits, MD=min(cfg.merge_bd, HD))),
               ("o_proj", _residual_alone, dict(BN=cfg.bn_o, BK=cfg.bk_o, KS=cfg.ks_o, STAGES=cfg.num_stages, ROTATE=cfg.k_rotate)),
               ("gate_up", _gate_up_alone, dict(BN=cfg.bn_gu, BK=cfg.bk_gu, KS=cfg.ks_gu, STAGES=cfg.num_stages,
                                                ROTATE=cfg.k_rotate)),
               ("down", _residual_alone, dict(BN=cfg.bn_down, BK=cfg.bk_down, KS=cfg.ks_down, STAGES=cfg.num_stages,
                                              ROTATE=cfg.k_rotate))]
    print(f"{cfg}\nsm_90a, Triton {triton.__version__}, {cfg.num_warps} warps")
    for name, fn, constexprs in kernels:
        r = compile_kernel(fn, constexprs, cfg.num_warps, cfg.num_stages)
        print(f"{name:18s} registers {r['registers']:3d}  spills {r['spill_store_bytes']}/{r['spill_load_bytes']} B  "
              f"shared {r['shared_bytes'] // 1024} KiB  async copies {r['async_copies']}  L2 prefetches {r['l2_prefetches']}  "
              f"loads {r['loads']}  stores {r['stores']}")


if __name__ == "__main__":
    main()
