"""Where the GPU time of one call goes: torch.profiler kernel table for one engine variant.

    python benchmarks/profile_kernels.py --workload libero-pi0 --levers <levers>
    python benchmarks/profile_kernels.py --workload wam-761 --levers best [--sparsity drop_middle]
    python benchmarks/profile_kernels.py --workload wam-761 --levers best --mode forward --batch 8

With cuda_graph the profiled call is a graph replay: CUPTI still reports each kernel node.
--also "<levers>[;<levers>...]": build and run these engines in the same process first (and
check equivalence for each, as `vlaperf matrix` does), then profile --levers: what another
engine in the process changes about this one's kernels (docs/perf-notes.md, session 7, 22b:
the layer path at batch 4 timed ~42 ms only in matrices that also held the batched engine).
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.timing import require_cuda
from vlaperf.workloads import get_workload

p = argparse.ArgumentParser()
p.add_argument("--workload", default="libero-pi0")
p.add_argument("--levers", default="for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections")
p.add_argument("--rows", type=int, default=30)
p.add_argument("--trace", default=None, help="also write the Chrome trace here")
p.add_argument("--also", default="", help="engines to build, run and check in this process before the profiled one")
p.add_argument("--kv-align", type=int, default=None, help="engine.KV_ALIGN for this run (1: the static cache "
                                                            "holds exactly Tp + Ts keys)")
p.add_argument("--sparsity", default="none", help="world-action workloads: frame sparsity")
p.add_argument("--mode", default="model", choices=("model", "forward"),
               help="world-action workloads: the whole generate call, or one full forward (not graph-captured)")
p.add_argument("--batch", type=int, default=None, help="world-action workloads: batch size instead of the workload's")
p.add_argument("--sequence", default=None, help="also write every kernel of the call in launch order (start, duration, "
                                               "gap to the previous kernel's end, name) to this file")
p.add_argument("--kernel-pdl", default=None, choices=("all", "loop", "none"), help="the engine's own Triton kernels "
               "launched with programmatic dependent launch: all of them, the denoise loop's (launch.DENOISE_LOOP_KERNELS) "
               "or none (default: launch.PDL_KERNELS)")
args = p.parse_args()
require_cuda(__file__)
if args.kernel_pdl:
    import vlaperf.engine.kernels.launch as launch_module

    launch_module.PDL_KERNELS = {"none": frozenset(), "loop": launch_module.DENOISE_LOOP_KERNELS,
                                 "all": launch_module.DENOISE_LOOP_KERNELS | {"_rope_qkv_kernel", "_partial_kernel",
                                                                             "_merge_kernel"}}[args.kernel_pdl]
if args.kv_align is not None:
    import vlaperf.engine.engine as engine_module

    engine_module.KV_ALIGN = args.kv_align
from vlaperf.workloads import get_wam_workload, is_wam_workload  # noqa: E402

if is_wam_workload(args.workload):  # the world-action model: one generate call
    from vlaperf.engine.wam import WamEngine
    from vlaperf.models.wam import build_wam, random_wam_inputs

    w = get_wam_workload(args.workload).with_overrides(sparsity=args.sparsity, **({"batch": args.batch} if args.batch else {}))
    model = build_wam(w.preset, "cuda")
    obs, noise = random_wam_inputs(model.config, w.batch, "cuda", model.dtype)
    if args.also:
        raise SystemExit("--also: pi0 workloads only")
    engine = WamEngine(model, args.levers)

    def call():
        if args.mode == "forward":
            return engine.forward_once(obs, noise, w.sparsity)
        return engine.generate(obs, noise, **w.sampling())
else:
    w = get_workload(args.workload)
    model = build_model(w.model_config(), "cuda")
    obs = random_observation(w, model.config, "cuda")
    noise = random_noise(w, model.config, "cuda")
    others = []
    for spec in filter(None, (s.strip() for s in args.also.split(";"))):
        from vlaperf.check import check_equivalence

        other = Engine(model, spec)
        other.sample_actions(obs, noise, w.steps)
        print(f"also built {spec}: equivalence {check_equivalence(model, other, w)['passed']}")
        others.append(other)  # kept alive, as the matrix keeps every variant
    engine = Engine(model, args.levers)

    def call():
        return engine.sample_actions(obs, noise, w.steps)
for _ in range(3):
    call()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    call()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


def kernel_class(name: str) -> str:
    """Coarse classes for the per-call summary (names as the profiler reports them)."""
    n = name.lower()
    if any(k in n for k in ("_small_m_kernel", "_reduce_kernel")):
        return "vlaperf small-M matmul kernels"
    if "_expert_step_kernel" in n:
        return "vlaperf step kernel (megakernel)"
    if any(k in n for k in ("_partial_kernel", "_merge_kernel")):
        return "vlaperf attention kernels"
    if n.startswith("triton_"):  # before the keywords below: inductor names kernels after the ops they fuse
        return "inductor triton (fused elementwise/reductions)"
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "splitk", "cublas")):
        return "cuBLAS/CUTLASS GEMM (incl. split-K reduce)"
    if any(k in n for k in ("flash", "fmha", "cudnn", "attention")):
        return "fused attention (SDPA)"
    return "other (eager elementwise, copies)"


totals, counts = {}, {}
for e in prof.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA and getattr(e, "device_time_total", 0) > 0:
        c = kernel_class(e.key)
        totals[c] = totals.get(c, 0.0) + e.device_time_total / 1e3
        counts[c] = counts.get(c, 0) + e.count
print(f"per call, {args.levers}:")
for c, t in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"  {c:48s} {t:8.3f} ms  {counts[c]:6d} kernels")
print(f"  {'sum':48s} {sum(totals.values()):8.3f} ms  {sum(counts.values()):6d} kernels")
if args.trace:
    prof.export_chrome_trace(args.trace)
if args.sequence:
    # One line per kernel in the order the GPU ran them: where the prefix's time goes layer by
    # layer, and the idle gaps between dependent kernels of the graph (kernel sum vs wall).
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    with open(args.sequence, "w") as f:
        t0 = kernels[0].time_range.start if kernels else 0
        prev_end, gaps = t0, 0.0
        f.write("#    start_us      dur_us    gap_us  name\n")
        for i, e in enumerate(kernels):
            gap = max(0.0, e.time_range.start - prev_end)
            gaps += gap
            f.write(f"{i:5d} {e.time_range.start - t0:10.1f} {e.time_range.elapsed_us():9.2f} {gap:8.2f}  {e.name}\n")
            prev_end = max(prev_end, e.time_range.end)
        f.write(f"# {len(kernels)} kernels, span {prev_end - t0:.1f} us, idle gaps {gaps:.1f} us\n")
    print(f"kernel sequence: {len(kernels)} kernels -> {args.sequence}")
