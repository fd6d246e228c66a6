"""Does asking for fused multiply-add by name (kernels/launch.py, session 41) change what Triton builds?

    python benchmarks/fp_fusion_ab.py run asked   OUT.json    # vlaperf's launches as they are
    python benchmarks/fp_fusion_ab.py run default OUT.json    # the same with the request left out of every launch
    python benchmarks/fp_fusion_ab.py compare CACHE_A CACHE_B

Each `run` is `vlaperf bench` in its own process; give each its own empty TRITON_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR, so that every kernel compiles there. `compare` lists, per kernel name, the
hashes of the cubins in each Triton cache: where the installed Triton's default is fused multiply-add
(Triton 3.6, the H200 machine's), the two runs build the same binaries and `compare` prints no
difference; Triton 3.9 warns its default turns it off in 3.10, and there the two would differ.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def launch_without_the_request(kernel, grid: tuple, *args, **kwargs) -> None:
    """vlaperf.engine.kernels.launch.launch without `enable_fp_fusion`: Triton's default decides."""
    from vlaperf.engine.kernels import launch as L

    if "USE_PDL" in getattr(kernel, "arg_names", ()):
        use = L.pdl_here(kernel)
        kwargs["USE_PDL"] = use
        if use:
            kwargs["launch_pdl"] = True
    if L.compiling_only():
        if L._state.record is not None:
            L._state.record.append((kernel, grid, args, kwargs))
        else:
            kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)


def run(which: str, out: str) -> int:
    import importlib

    from vlaperf.cli import main

    if which == "default":
        for name in ("expert_step", "small_m_matmul", "rope_qkv", "suffix_attention"):
            module = importlib.import_module(f"vlaperf.engine.kernels.{name}")
            assert hasattr(module, "launch"), name
            module.launch = launch_without_the_request
    elif which != "asked":
        raise SystemExit(f"expected 'asked' or 'default', got {which!r}")
    return main(["bench", "--workload", "libero-pi0", "--levers", "best", "--iters", "30", "--warmup", "10",
                 "--no-progress", "--json", out])


def cubins(cache: Path) -> dict[str, set[str]]:
    """kernel name -> sha256 of each of its cubins in a Triton cache."""
    out: dict[str, set[str]] = {}
    for f in sorted(cache.rglob("*.cubin")):
        out.setdefault(f.stem, set()).add(hashlib.sha256(f.read_bytes()).hexdigest()[:16])
    return out


def compare(a: str, b: str) -> int:
    ca, cb = cubins(Path(a)), cubins(Path(b))
    ours = ("_expert_step_kernel", "_mod_prologue_kernel", "_small_m_kernel", "_reduce_kernel", "_rope_qkv_kernel",
            "_partial_kernel", "_merge_kernel")
    differ = 0
    for name in sorted(set(ca) | set(cb)):
        same = ca.get(name) == cb.get(name)
        differ += not same
        if not same or name in ours:
            print(f"{'same   ' if same else 'DIFFER '} {name}: {len(ca.get(name, ()))} vs {len(cb.get(name, ()))} cubins")
    print(f"{len(set(ca) | set(cb))} kernel names, {differ} with different cubins")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"] and len(sys.argv) == 4:
        sys.exit(run(sys.argv[2], sys.argv[3]))
    if sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    raise SystemExit(__doc__)
