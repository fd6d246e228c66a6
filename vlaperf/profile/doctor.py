"""`doctor`: what in this environment or this policy costs latency, and how to fix it.

    findings = doctor()                                   # environment only
    findings = doctor(model, workload="libero-pi0")       # + checks of the reference path
    findings = doctor(model, engine=Engine(model, "for_loop"), workload="libero-pi0")

Each finding is {id, severity, title, detail, cost, cost_note, fix}:
  severity  "error" (a measurement or optimization is silently wrong or will fail),
            "warning" (latency left on the table), "info" (context worth recording)
  cost      milliseconds per policy call, measured on this device where possible (how is
            said in cost_note); None where it cannot be measured in isolation
  fix       a vlaperf lever / switch, or what to change

Environment checks need no model: torch.compile disabled by TORCHDYNAMO_DISABLE /
TORCH_COMPILE_DISABLE (seed 000 lost 2-3x to this for weeks), no compiler inductor can use on PATH
(inductor fails at the first compiled call: better to know before waiting for it),
CUDA_LAUNCH_BLOCKING, anomaly detection, the float32 matmul precision / TF32, other
processes on the GPU and the GPU clocks (nvidia-smi, best effort), the CPUs' frequency
governors and idle states (sysfs: a control loop's call after its wait pays for them),
torch/CUDA versions.
Model checks run the actual policy: host syncs per call (vlaperf.profile.syncs), masked
image slots that are still embedded, padded prompt tokens computed, eager attention where
SDPA exists, float32 weights on a GPU, per-kernel launch overhead without a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from typing import Any

import torch

from vlaperf.gpu_state import CLOCK_EVENT_REASONS
from vlaperf.timing import behaviour_env_vars, cpu_power, device_uuid

SEVERITIES = ("error", "warning", "info")

# Throttle reasons that mean the GPU is slowed down by heat or the hardware (not merely idle
# or at its power limit under load), from nvidia-smi's clocks_throttle_reasons bitmask.
_BAD_THROTTLE = {bit: CLOCK_EVENT_REASONS[bit] for bit in (0x8, 0x20, 0x40, 0x80)}


def finding(id: str, severity: str, title: str, detail: str, cost: float | None = None, fix: str | None = None,
            cost_note: str | None = None) -> dict[str, Any]:
    assert severity in SEVERITIES, severity
    return {"id": id, "severity": severity, "title": title, "detail": detail, "cost": cost, "cost_note": cost_note,
            "fix": fix}


def nvidia_smi(args: list[str]) -> str | None:
    """stdout of `nvidia-smi <args>`, or None when it is missing or fails (tests replace this)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=True)
    except Exception:
        return None
    return out.stdout.strip()


def _on(var: str) -> bool:
    """A switch variable as torch and CUDA read it: on only when exactly "1" ("true" or "2" leave it off)."""
    return os.environ.get(var) == "1"


# ----------------------------------------------------------------- environment


def _cuda_debug_switches() -> list[dict]:
    """Debugging switches that, left set on a GPU machine, slow every call without an error: Triton's interpreter
    (read as Triton reads it) and the caching allocator turned off (torch reads only "1")."""
    out = []
    if _triton_interpreter_on():
        out.append(finding(
            "env.triton_interpreter", "error", f"Triton's interpreter is on: TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}",
            "every Triton kernel a process defines with it set, vlaperf's hand-written ones included (the triton_kernels and "
            "megakernel levers, in best on Hopper for bfloat16 models), runs in Triton's Python interpreter: each launch "
            "copies its tensors to the host, runs the kernel's program there, and copies them back. A switch for debugging "
            "kernels on a CPU.",
            fix="unset TRITON_INTERPRET"))
    if _on("PYTORCH_NO_CUDA_MEMORY_CACHING"):
        out.append(finding(
            "env.uncached_allocator", "error", "PYTORCH_NO_CUDA_MEMORY_CACHING=1: torch's caching allocator is off",
            "every CUDA tensor is allocated with cudaMalloc and freed with cudaFree, which synchronizes the device: "
            "the host waits for the GPU at each freed temporary inside a call. A switch for compute-sanitizer runs.",
            fix="unset PYTORCH_NO_CUDA_MEMORY_CACHING"))
    return out


def _triton_knobs():
    """Triton's knobs module (Triton 3.4+), None before it, or False where Triton is not installed."""
    try:
        import triton
    except ImportError:
        return False
    return getattr(triton, "knobs", None)


def _triton_interpreter_on() -> bool:
    """TRITON_INTERPRET as the installed Triton reads it: its knob ("1", "true", "on" or "yes" in any case), or,
    before Triton had knobs, exactly "1" (3.2's jit). No Triton, no interpreter."""
    knobs = _triton_knobs()
    if knobs is False:
        return False
    if knobs is None or not hasattr(knobs, "runtime"):
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def _fp_fusion_forced_off() -> bool:
    """TRITON_FORCE_DISABLE_FP_FUSION as the installed Triton reads it: its knob, which Triton 3.9 has and 3.6 does
    not (there the variable does nothing, and an explicit enable_fp_fusion wins over TRITON_DEFAULT_FP_FUSION)."""
    knobs = _triton_knobs()
    return bool(knobs and getattr(getattr(knobs, "language", None), "force_disable_fp_fusion", False))


def environment_checks(device: torch.device | str | None = None, model_dtype: torch.dtype | None = None) -> list[dict]:
    from vlaperf.engine.compile import compile_disabled_by, compile_switched, missing_compiler

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = []
    for var in compile_disabled_by():  # as torch reads them: only "1" turns compile off
        out.append(finding(
            "env.compile_disabled", "error", f"torch.compile is silently off: {var}={os.environ[var]}",
            f"{var} makes torch.compile return the function unchanged, with no error: every 'compiled' "
            "variant runs eager. seed 000's policy server ran 767 ms per call for weeks because of it "
            "(355 ms with compile, 256 ms with reduce-overhead).",
            fix=f"unset {var}. If it was set because the machine has no C compiler, install one "
                "(e.g. apt-get install gcc) or use the cuda_graph lever, which needs no compiler."))
    switched = compile_switched()  # read by torch at its import; neither turns compile off, both change what runs
    if "backend_override" in switched:
        out.append(finding(
            "env.compile_backend_override", "error",
            f"torch.compile runs another backend: TORCH_COMPILE_OVERRIDE_BACKENDS={switched['backend_override']}",
            "torch's bisecting switch: the graphs its rules name (e.g. '0-999:eager') run with that backend instead of "
            "the one torch.compile was given, with no error, so a 'compiled' variant may be running eager.",
            fix="unset TORCH_COMPILE_OVERRIDE_BACKENDS (it is a debugging switch)"))
    if "suppress_errors" in switched:
        out.append(finding(
            "env.compile_errors_suppressed", "warning",
            f"compile errors fall back to eager: TORCHDYNAMO_SUPPRESS_ERRORS={switched['suppress_errors']}",
            "torch takes any non-empty value as on, '0' included: a frame that fails to compile then runs eager with "
            "only a log line, so a broken compile looks like a slow one.",
            fix="unset TORCHDYNAMO_SUPPRESS_ERRORS"))
    # the compiler this device's inductor runs, looked for as it looks for it: Triton's C compiler ($CC, else gcc or
    # clang: a bare cc is not tried, and a $CC that names nothing is used anyway) on a GPU, a C++ one ($CXX, else g++)
    # on the CPU, which a machine with gcc alone lacks
    missing = missing_compiler(device.type)
    if missing:
        kind = "C" if device.type == "cuda" else "C++"
        out.append(finding(
            "env.no_c_compiler", "error", f"no usable {kind} compiler: torch.compile (inductor) will fail",
            f"{missing}. Inductor builds a C launcher for its kernels with Triton on a GPU, and compiles the kernels "
            "themselves as C++ on the CPU; without the compiler it looks for, the first compiled call fails after "
            "tracing, i.e. after you have waited for it. vlaperf's compile lever refuses to start here "
            "(vlaperf.engine.compile.compile_blockers).",
            fix="install a compiler (apt-get install build-essential: gcc and g++) or set "
                + ("CC" if device.type == "cuda" else "CXX") + " to one on PATH; or use the cuda_graph lever (CUDA "
                "graphs need no compiler). Do not 'fix' it with TORCHDYNAMO_DISABLE=1."))
    if _on("CUDA_LAUNCH_BLOCKING"):
        out.append(finding(
            "env.cuda_launch_blocking", "error", f"CUDA_LAUNCH_BLOCKING={os.environ['CUDA_LAUNCH_BLOCKING']}",
            "every kernel launch waits for the kernel to finish: the host never runs ahead of the GPU, "
            "so each launch adds its full latency. A debugging switch, never for timing.",
            fix="unset CUDA_LAUNCH_BLOCKING"))
    if _fp_fusion_forced_off():
        out.append(finding(
            "env.fp_fusion_disabled", "warning",
            f"Triton's fused multiply-add is off: TRITON_FORCE_DISABLE_FP_FUSION={os.environ['TRITON_FORCE_DISABLE_FP_FUSION']}",
            "every Triton kernel compiles each multiply-add as two instructions that round twice, inductor's and "
            "vlaperf's hand-written ones included, whatever they ask for (compiled for sm_90, the attention merge "
            "kernel's 17 fma became 18 multiplies and their adds): more instructions, not measured here, and actions "
            "that differ from the ones checked and measured with it. A switch for matching another backend bit for bit.",
            fix="unset TRITON_FORCE_DISABLE_FP_FUSION"))
    if device.type == "cuda":
        out += _cuda_debug_switches()
    if torch.is_anomaly_enabled():
        out.append(finding("env.anomaly_detection", "warning", "autograd anomaly detection is on",
                           "torch.autograd.set_detect_anomaly(True) adds checks to every op.",
                           fix="torch.autograd.set_detect_anomaly(False)"))
    precision = torch.get_float32_matmul_precision()
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    detail = f"torch.get_float32_matmul_precision() = {precision!r}, backends.cuda.matmul.allow_tf32 = {tf32}"
    if device.type == "cuda" and model_dtype == torch.float32 and precision == "highest":
        out.append(finding("env.matmul_precision", "warning", "float32 matmuls without TF32 on a GPU",
                           detail + "; the model is float32, so its matmuls run at the full-precision FP32 rate.",
                           fix="run the model in bfloat16 (--dtype bfloat16), or accept TF32 numerics with "
                               "torch.set_float32_matmul_precision('high') (check equivalence first)"))
    else:
        out.append(finding("env.matmul_precision", "info", f"float32 matmul precision: {precision}",
                           detail + (" (matters only for float32 matmuls)" if device.type == "cuda" else "")))
    out.append(_compile_cache_check())
    out.append(_cpu_power_check())
    load = _host_load_check()
    if load is not None:
        out.append(load)
    if device.type == "cuda":
        out.append(_pdl_check(device))
    out += _gpu_checks(device)
    out.append(_versions(device))
    relevant = behaviour_env_vars()  # the result files' list: one place says which variables matter
    if relevant:
        out.append(finding("env.variables", "info", "environment variables that change torch's behaviour",
                           ", ".join(f"{k}={v}" for k, v in sorted(relevant.items()))))
    return out


def _cpu_power_check() -> dict:
    """The CPUs' frequency governors and idle states: a policy called once per control period waits in between, and
    its host work after the wait can run slower (a core that lowered its clock or left a deep idle state, or the
    call's own state gone cold in the caches meanwhile); `bench --idle-ms` measures it, `--idle-spin` tells the
    sleep's part from the rest."""
    power = cpu_power()
    # what a user does about it, and where the measurements are: the narrative is docs/profiling.md's, not a cell's
    measure = ("A robot calls once per control period and waits in between; the call after the wait can run slower. "
               "Measure it here: `vlaperf bench --mode policy --levers best --idle-ms 85` against back to back, and "
               "with --idle-spin (the same wait, the core kept busy); benchmarks/idle_decay_probe.py draws the cost "
               "against the wait's length. Where it costs, `vlaperf serve --keep-warm-ms 5` and the client's pings "
               "(`vlaperf rollout --client-keep-warm-ms 5`, `Client(keep_warm_ms=5)`) keep the path warm: a 10 Hz "
               "loop on an H100 at 1.002-1.015x its back-to-back call (docs/profiling.md, \"The call after an "
               "idle\").")
    if power is None:
        return finding("env.cpu_power", "info", "CPU frequency governor and idle states: not readable here",
                       "/sys/devices/system/cpu says nothing in this environment (not Linux, or a container "
                       "without it). " + measure)
    governors = power["frequency_governors"]
    parts = [f"frequency governor{'s' if governors and len(governors) > 1 else ''}: "
             + (", ".join(governors) if governors else "not exposed (no cpufreq: a VM, or the firmware's own)"),
             f"idle governor: {power['idle_governor'] or 'not exposed'}",
             "idle states enabled: " + (", ".join(power["idle_states"]) if power["idle_states"] else "not exposed")]
    slow = [g for g in governors or [] if g != "performance"]
    return finding("env.cpu_power", "info",
                   "CPU frequency governor " + (", ".join(governors) if governors else "not exposed")
                   + (": cores may slow down between calls" if slow else ""),
                   "; ".join(parts) + ". " + measure,
                   fix=("where the idle costs and --idle-spin takes the cost away, on a machine you control: "
                        "`cpupower frequency-set -g performance` and fewer deep idle states (`cpupower idle-set -D "
                        "10`); measure again with --idle-ms. Where spinning does not help, the clock and the idle "
                        "states are not the cause" if slow or power["idle_states"] else None))


# Other processes keep this many of the CPUs this process may use busy, or more (the 1-minute load average less this
# process's own 1): host-bound timings come out slower and spread wider than on a quiet machine
BUSY_HOST_SHARE = 0.5


def _host_load_check() -> dict | None:
    """The host's 1-minute load average against the CPUs this process may use: a warning where other processes keep
    half of them or more busy, as the costs measured below (5 calls each) and any host-bound timing then read high
    and spread wide. None where the load average is not readable (not Unix)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    others = max(load - 1.0, 0.0)  # this process keeps about one busy while it measures
    words = f"1-minute load average {load:.2f} on {cpus} CPU{'s' * (cpus != 1)}"
    if others < BUSY_HOST_SHARE * cpus:
        return finding("env.host_load", "info", f"host load: {words}", "no other process keeps half the CPUs busy")
    return finding(
        "env.host_load", "warning", f"the host is busy: {words}",
        f"other processes keep about {others:.1f} of the CPUs busy (averaged over the last minute). The policy's host "
        "path shares them: host-bound timings (the reference path, policy mode, the costs measured here over 5 calls) "
        "come out slower and spread wider than on a quiet machine.",
        fix="time on a quiet machine; `vlaperf bench --processes N` shows how far a figure moves between processes")


def _pdl_check(device: torch.device) -> dict:
    """Whether inductor's kernels in vlaperf's CUDA-graph calls use programmatic dependent launch
    here (engine/compile.py): it needs a Hopper or newer GPU and a torch whose inductor has the
    option; the H200 figures include it (libero-pi0 1.002-1.008x)."""
    from vlaperf.engine.compile import INDUCTOR_PDL, inductor_has_pdl

    title = "programmatic dependent launch (inductor's kernels in CUDA-graph calls)"
    forced = ("; TORCHINDUCTOR_ENABLE_PDL is set: every compiled call gets it, eager launches too, where a PDL "
              "kernel loses inductor's static launcher" if _on("TORCHINDUCTOR_ENABLE_PDL") else "")
    try:
        major, minor = torch.cuda.get_device_capability(device)
    except Exception as e:  # no CUDA runtime here (a CPU build of torch asked about cuda)
        return finding("env.pdl", "info", title + ": unknown", f"could not read the GPU's compute capability: {e}" + forced)
    if major < 9:
        return finding("env.pdl", "info", title + ": not on this GPU",
                       f"compute capability {major}.{minor}; PDL needs 9.0 or newer (Hopper), so the H200 figures' "
                       "0.2-0.8% from it do not carry over" + forced)
    try:
        has_pdl = inductor_has_pdl()
    except OSError as e:  # inductor makes its cache folder at import: torch 2.11 fails there on TORCHINDUCTOR_CACHE_DIR=""
        return finding("env.pdl", "info", title + ": unknown", f"inductor could not be imported: {e}" + forced)
    if not has_pdl:
        return finding("env.pdl", "info", title + ": not in this torch",
                       f"torch {torch.__version__}'s inductor has no triton.enable_pdl option: compiled calls replayed "
                       "from the CUDA graph run without it (H200 libero-pi0: 1.002-1.008x with it)" + forced,
                       fix="a newer torch (2.11 has the option)")
    if not INDUCTOR_PDL:
        return finding("env.pdl", "info", title + ": off", "vlaperf.engine.compile.INDUCTOR_PDL is False" + forced)
    return finding("env.pdl", "info", title + ": on",
                   f"compute capability {major}.{minor}; engines with compile and cuda_graph compile with "
                   "triton.enable_pdl" + forced)


def _dir_bytes(path: str, max_files: int = 20_000) -> tuple[int, bool]:
    """Bytes of the files under `path`, and whether the count stopped at `max_files` (a big
    cache should not make the doctor slow)."""
    total, seen, stack = 0, 0, [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # removed or unreadable while walking
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
                    seen += 1
                    if seen >= max_files:
                        return total, True
            except OSError:
                pass
    return total, False


def _size(path: str) -> str:
    if not os.path.isdir(path):
        return "not there yet"
    total, capped = _dir_bytes(path)
    return f"{'at least ' if capped else ''}{total / 1e6:.1f} MB"


def compile_cache_dirs() -> dict[str, str]:
    """Where Triton and inductor keep compiled kernels in this process (env or their defaults)."""
    from vlaperf.engine.compile import CACHE_ENV

    # a variable set, even to "", is what torch and Triton use: a relative name made absolute, "" the current folder
    # (torch 2.13; 2.11's inductor fails on "", which _compile_cache_check warns about)
    dirs = {name: os.path.abspath(os.environ[var]) for name, var in CACHE_ENV.items() if var in os.environ}
    if "triton" not in dirs:
        try:
            from triton import knobs

            dirs["triton"] = knobs.cache.dir
        except Exception:  # no Triton, or one without knobs
            dirs["triton"] = os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if "inductor" not in dirs:  # its default, read without cache_dir(), which would also set the variable
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        dirs["inductor"] = default_cache_dir()
    return dirs


def _compile_cache_check() -> dict:
    """Where the compile caches are and how full: a warm cache makes a compiled variant's first
    call seconds instead of tens of seconds, and one in a temporary directory may not outlive a
    container."""
    from vlaperf.engine.compile import CACHE_ENV, inductor_cache_env

    dirs = compile_cache_dirs()
    parts = [f"{name} {path} ({_size(path)})" for name, path in dirs.items()]
    detail = ("compiled kernels are cached at: " + "; ".join(parts) + ". A process that finds them skips the compiles "
              "(H200, libero-pi0 best: first call 9-14 s with empty caches, 3.6-4 s warm).")
    # `VAR=$UNSET` in a script sets the variable to "", which is not unset (compile_blockers refuses it for inductor)
    # inductor's as given, not as torch rewrote it once a model was built (an empty one becomes the current folder)
    given = {var: inductor_cache_env() if var == "TORCHINDUCTOR_CACHE_DIR" else os.environ.get(var)
             for var in CACHE_ENV.values()}
    empty = [var for var, value in given.items() if value == ""]
    if empty:
        names = " and ".join(empty)
        return finding("env.compile_cache", "warning", f"{names} set but empty",
                       detail + f" An empty {names} is not the default: Triton and torch 2.13 cache in the current "
                       "folder, and torch 2.11's inductor fails when it is first imported (FileNotFoundError: '').",
                       fix=f"unset {names}, or name a folder (--compile-cache DIR)")
    temp_roots = {os.path.abspath(tempfile.gettempdir()), "/tmp"}
    volatile = [p for p in dirs.values() if any(os.path.abspath(p).startswith(r + os.sep) for r in temp_roots)]
    return finding("env.compile_cache", "info", "compile caches" + (" (in a temporary directory)" if volatile else ""), detail,
                   fix=("keep them on storage that outlives the process's machine or container: --compile-cache DIR"
                        if volatile else None))


def _ours(uuid_field: str, mine: str | None) -> bool:
    """Is an nvidia-smi row about our GPU? Without our UUID every GPU counts."""
    return mine is None or uuid_field.strip().lower().removeprefix("gpu-") == mine


def _gpu_checks(device: torch.device, uuid: str | None = None) -> list[dict]:
    """Other processes on, and the clocks of, the GPU this run uses (by UUID: nvidia-smi lists
    every GPU of the host, and CUDA_VISIBLE_DEVICES renumbers them for torch). If no GPU that
    nvidia-smi lists has our UUID (or torch cannot tell it), every GPU is reported."""
    if device.type != "cuda":
        return []
    for field in ("clocks_throttle_reasons.active", "clocks_event_reasons.active"):
        q = nvidia_smi([f"--query-gpu=uuid,index,name,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,temperature.gpu,"
                        f"power.draw,power.limit,{field}", "--format=csv,noheader,nounits"])
        if q:
            break
    gpus = [[x.strip() for x in line.split(",")] for line in (q or "").splitlines()]
    gpus = [g for g in gpus if len(g) >= 11]
    mine = uuid or device_uuid(device)
    if mine is not None and not any(_ours(g[0], mine) for g in gpus):
        mine = None
    out = []
    apps = nvidia_smi(["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"])
    if apps is None:
        out.append(finding("env.gpu_processes", "info", "could not list GPU processes",
                           "nvidia-smi is missing or failed; other tenants on the GPU cannot be ruled out."))
    else:
        others = []
        for line in apps.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) != os.getpid() and _ours(parts[0], mine):
                others.append(f"pid {parts[1]} {parts[2]}" + (f" ({parts[3]} MiB)" if len(parts) > 3 else ""))
        if others:
            out.append(finding("env.gpu_processes", "warning", f"{len(others)} other process(es) on the GPU",
                               "; ".join(others) + ". They compete for SMs and memory bandwidth: numbers will be "
                               "slower and noisier than on an idle GPU.",
                               fix="time on an idle GPU (or say in the report that it was shared)"))
    for u, *p in gpus:
        if not _ours(u, mine):
            continue
        detail = (f"GPU {p[0]} {p[1]}: SM {p[2]}/{p[3]} MHz, memory {p[4]}/{p[5]} MHz, {p[6]} C, "
                  f"{p[7]}/{p[8]} W, throttle reasons {p[9]} (clocks are low while idle; read under load)")
        try:
            bits = int(p[9], 16)
        except ValueError:
            bits = 0
        bad = [name for bit, name in _BAD_THROTTLE.items() if bits & bit]
        if bad:
            out.append(finding("env.gpu_clocks", "warning", f"GPU {p[0]} is throttled: {', '.join(bad)}", detail,
                               fix="cool the GPU / check power; numbers taken now are slower than the hardware"))
        else:
            out.append(finding("env.gpu_clocks", "info", f"GPU {p[0]} clocks", detail))
    return out


def _versions(device: torch.device) -> dict:
    cuda = torch.version.cuda
    parts = [f"torch {torch.__version__}", f"CUDA {cuda or 'none (CPU build)'}"]
    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:
        cudnn = None
    if cudnn:
        parts.append(f"cuDNN {cudnn}")
    driver = nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    if driver:
        parts.append(f"driver {driver.splitlines()[0].strip()}")
    if torch.cuda.is_available():
        parts.append("GPUs: " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
    parts.append(f"{torch.get_num_threads()} CPU threads")
    if device.type == "cuda" and not torch.cuda.is_available():
        return finding("env.versions", "error", "CUDA requested but not available", "; ".join(parts),
                       fix="install a CUDA build of torch matching the driver, or run on the CPU")
    return finding("env.versions", "info", "versions", "; ".join(parts))


# ----------------------------------------------------------------- model


def _median_ms(fn, device, iters: int = 5) -> float:
    from vlaperf.timing import time_calls

    return float(time_calls(fn, device=device, warmup=2, iters=iters, progress=False)["timers"]["wall_ms"]["median"])


@torch.no_grad()
def model_checks(model, engine=None, workload=None, measure: bool = True, seed: int = 0) -> list[dict]:
    """Checks of one pi0 policy path (the reference `model.sample_actions`, or `engine`)."""
    from vlaperf.engine.levers import Levers
    from vlaperf.inputs import Observation, random_noise, random_observation
    from vlaperf.profile.syncs import count_syncs, measure_sync_cost_ms, per_call_phrase
    from vlaperf.workloads import WORKLOADS, get_workload

    device = model.action_in_proj.weight.device
    if workload is None:
        cfg = model.config
        matches = [w for w in WORKLOADS.values() if w.preset == cfg.name]
        if not matches:
            raise ValueError(f"doctor: pass a workload for model preset {cfg.name!r}")
        # the first workload of the model's chunk (droid-pi0's 10 actions, not libero-pi0's 50), else the first
        # of its preset with the model's chunk
        same = [w for w in matches if (w.horizon, w.action_dim) == (cfg.action_horizon, cfg.action_dim)]
        workload = same[0] if same else dataclasses.replace(matches[0], horizon=cfg.action_horizon,
                                                            action_dim=cfg.action_dim)
    elif isinstance(workload, str):
        workload = get_workload(workload)
    levers = engine.levers if engine is not None else Levers()
    path = f"engine {engine.name}" if engine is not None else "reference sample_actions"
    sample = engine.sample_actions if engine is not None else model.sample_actions
    obs = random_observation(workload, model.config, device, seed=seed)
    noise = random_noise(workload, model.config, device, seed=seed)
    steps = workload.steps
    out = []

    # host syncs
    rep = count_syncs(lambda: sample(obs, noise, steps), device=device, calls=1, warmup=1)
    if rep["per_call"] > 0:
        per_sync = measure_sync_cost_ms(device) if measure else None
        cost = per_sync * rep["per_call"] if per_sync is not None else None
        sites = "; ".join(f"{s['per_call']:g}x {s['location']} {s['op']}: {s['code']}" for s in rep["sites"][:5])
        in_loop = any("while" in (s["code"] or "") for s in rep["sites"])
        out.append(finding(
            "model.host_syncs", "warning", f"{per_call_phrase(rep['per_call'])} ({path})",
            f"{sites}. " + (rep["note"] or ""),
            cost=cost,
            cost_note=(f"estimate: {rep['per_call']:g} syncs x {per_sync:.4f} ms measured round trip of a tiny kernel "
                       "+ 1-element read on this GPU") if cost is not None else "not measurable on the CPU (no device to wait for)",
            fix=("lever for_loop (a Python for over the precomputed schedule)" if in_loop and not levers.for_loop
                 else "remove the host reads at the listed lines (keep decisions on the host, e.g. host metadata)")))
    else:
        out.append(finding("model.host_syncs", "info", f"no host syncs inside the call ({path})", rep["note"] or ""))

    # masked image slots still embedded
    masked = [s for s, v in enumerate(workload.image_valid) if not v]
    if masked and not levers.skip_masked_images:
        cost = None
        if measure:
            s0 = masked[0]
            cost = _median_ms(lambda: model.embed_image(obs.images[:, s0]), device) * len(masked)
        out.append(finding(
            "model.masked_images_embedded", "warning",
            f"{len(masked)} masked image slot(s) embedded anyway (slot {', '.join(map(str, masked))})",
            f"workload {workload.id}: image_mask is False for slot(s) {masked} in every sample, yet {path} runs the "
            f"vision tower on them ({model.config.vision.num_patches} tokens each) and keeps their tokens in the "
            "prefix, where every valid token then skips them.",
            cost=cost, cost_note="measured: median of one model.embed_image call on the masked slot, x slots" if cost is not None else None,
            fix="lever skip_masked_images"))

    # padded prompt tokens
    valid = max(workload.prompt_valid)
    padded = workload.prompt_slots - valid
    if padded > 0 and not levers.trim_prompt_padding:
        cost, note = None, None
        if measure:
            prefix, pad, att = model.embed_prefix(obs)
            trimmed = Observation(obs.images, obs.image_mask, obs.tokens[:, :valid], obs.token_mask[:, :valid], obs.state)
            tp, tpad, tatt = model.embed_prefix(trimmed)
            full_ms = _median_ms(lambda: model.prefill(prefix, pad, att), device)
            trim_ms = _median_ms(lambda: model.prefill(tp, tpad, tatt), device)
            measured = (f"model.prefill over the full prefix {full_ms:.3f} ms - over the trimmed prefix {trim_ms:.3f} "
                        "ms")
            if full_ms >= trim_ms:
                cost = full_ms - trim_ms
                note = f"measured: {measured} (denoise steps also attend to the padding: not included)"
            else:  # the padding's cost is below this machine's noise over 5 calls: no cost, rather than a cost of 0
                note = (f"not resolved: {measured}, the longer prefix the faster, so the noise of 5 calls each exceeds "
                        "the padding's cost here (vlaperf matrix times trim_prompt_padding interleaved)")
        share = padded / (prefix_len := workload.prompt_slots + model.config.vision.num_patches * workload.image_slots)
        out.append(finding(
            "model.padded_prompt", "warning" if share >= 0.05 else "info",
            f"{padded} padded prompt tokens computed per sample ({workload.prompt_slots} slots, {valid} valid)",
            f"the prefix holds {prefix_len} tokens of which {padded} are prompt padding ({100 * share:.1f}%); they go "
            "through every backbone layer and every denoise step attends over them.",
            cost=cost, cost_note=note, fix="lever trim_prompt_padding"))

    # eager attention
    if not levers.sdpa and hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        out.append(finding(
            "model.eager_attention", "warning" if device.type == "cuda" else "info",
            "eager softmax attention while SDPA is available",
            f"{path} materialises the (T x T) scores in float32 and soft-maxes them; "
            "torch.nn.functional.scaled_dot_product_attention has fused flash / memory-efficient kernels.",
            fix="lever sdpa"))

    # float32 weights on a GPU
    if device.type == "cuda" and model.dtype == torch.float32:
        out.append(finding(
            "model.fp32_on_gpu", "warning", "float32 transformer weights on a GPU",
            "openpi and LeRobot run the transformers in bfloat16 on GPUs; float32 halves the tensor-core rate "
            "and doubles the weight traffic of every memory-bound denoise step.",
            fix="--dtype bfloat16 (vlaperf.models.pi0.build_model's default on cuda)"))

    residency = megakernel_residency(levers)
    if residency is not None:
        out.append(residency)

    # launch overhead
    if device.type == "cuda" and not levers.cuda_graph and not levers.compile:
        out.append(finding(
            "model.launch_overhead", "info", "every kernel is launched from Python",
            "without a CUDA graph each of the call's kernels pays host launch latency; small denoise steps are "
            "often launch-bound.",
            fix="lever cuda_graph (needs for_loop), or compile=reduce-overhead"))
    return out


@torch.no_grad()
def wam_model_checks(model, engine=None, workload=None, measure: bool = True, seed: int = 0) -> list[dict]:
    """Checks of one world-action policy path (the reference `model.generate`, or a WamEngine):
    seed 000's runner overheads, each with the lever that removes it."""
    from vlaperf.engine.wam import WamLevers
    from vlaperf.models.wam import kept_frame_tokens, random_wam_inputs
    from vlaperf.profile.syncs import count_syncs, measure_sync_cost_ms, per_call_phrase
    from vlaperf.workloads import WAM_WORKLOADS, get_wam_workload

    device = model.device
    if workload is None:
        workload = next(w for w in WAM_WORKLOADS.values() if w.preset == model.config.name)
    elif isinstance(workload, str):
        workload = get_wam_workload(workload)
    levers = engine.levers if engine is not None else WamLevers()
    path = f"engine {engine.name}" if engine is not None else "reference generate"
    generate = engine.generate if engine is not None else model.generate
    obs, noise = random_wam_inputs(model.config, workload.batch, device, model.dtype, seed=seed)
    kw = workload.sampling()
    out = []

    rep = count_syncs(lambda: generate(obs, noise, **kw), device=device, calls=1, warmup=1)
    if rep["per_call"] > 0:
        per_sync = measure_sync_cost_ms(device) if measure else None
        cost = per_sync * rep["per_call"] if per_sync is not None else None
        sites = "; ".join(f"{s['per_call']:g}x {s['location']} {s['op']}: {s['code']}" for s in rep["sites"][:5])
        nonzero = any(s["op"].endswith("nonzero") for s in rep["sites"])
        out.append(finding(
            "wam.host_syncs", "warning", f"{per_call_phrase(rep['per_call'])} ({path})", f"{sites}. " + (rep["note"] or ""),
            cost=cost, cost_note=(f"estimate: {rep['per_call']:g} syncs x {per_sync:.4f} ms measured round trip"
                                  if cost is not None else "not measurable on the CPU (no device to wait for)"),
            fix="levers cached_keep_index (the keep index built once, not with .nonzero() per forward) and host_schedule "
                "(the sampler's coefficients on the host: on a GPU its per-step linear solve and tensor uploads sync too, "
                "which the CPU counter does not see)" if nonzero
            else "remove the host reads at the listed lines"))
    else:
        out.append(finding("wam.host_syncs", "info", f"no host syncs inside the call ({path})", rep["note"] or ""))

    if workload.sparsity != "none" and not levers.cuda_graph:
        out.append(finding(
            "wam.sparsity_host_bound", "warning", f"frame sparsity ({workload.sparsity}) on a host-bound call",
            "while the call's kernels are launched from Python the GPU waits for the host, and fewer tokens shorten "
            "only the GPU's part: on the H200 (wam-761, benchmarks/results/h200/matrix_wam-761_grid.json) drop_middle "
            "gave 0.88x-1.06x (within noise) without a CUDA graph, 1.15x and 1.11x with one (graph, best).",
            fix="lever cuda_graph (preset graph or best), then measure the sparsity again"))

    if not levers.context_kv_cache:
        cost = None
        if measure:
            text = torch.cat([obs.text, obs.text]) if workload.cfg_scale > 0 else obs.text

            def context_kv():
                ctx = model.embed_context(text)
                return [block.cross_attn.context_kv(ctx) for block in model.blocks]

            cost = _median_ms(context_kv, device) * (workload.steps - 1)
        out.append(finding(
            "wam.context_kv_per_step", "warning",
            f"the text context's cross-attention keys/values recomputed at every step ({workload.steps} a call)",
            f"the instruction does not change during a call, yet {path} runs the text embedding and {len(model.blocks)} "
            f"blocks' key/value projections over {model.config.text_tokens} text tokens in every forward.",
            cost=cost, cost_note="measured: one computation, x (steps - 1)" if cost is not None else None,
            fix="lever context_kv_cache"))

    if workload.video_steps < workload.steps and not levers.video_kv_cache:
        wasted = workload.steps - workload.video_steps - 1
        out.append(finding(
            "wam.finished_video_recomputed", "warning" if wasted > 0 else "info",
            f"the finished video recomputed in {max(wasted, 0)} forward{'' if wasted == 1 else 's'}",
            f"the video is finished after {workload.video_steps} of {workload.steps} steps; its tokens never attend to "
            f"the actions, so their keys and values are constants from then on, yet {path} runs all "
            f"{model.config.seq_len - model.config.frame_tokens + kept_frame_tokens(model.config, workload.sparsity)} "
            "tokens through every block in each later step.",
            fix="lever video_kv_cache (the action tokens alone against the cached keys and values)"))

    if not levers.host_schedule:
        out.append(finding(
            "wam.scheduler_on_device", "info", "UniPC's coefficients rebuilt as device tensors at every step",
            "a dozen small kernels and a linear solve per step; on the H200 they were within noise of the call "
            "(host_schedule 0.99x in matrix_wam-761_cumulative_drop.json), but they block a CUDA graph.",
            fix="lever host_schedule"))

    if not levers.sdpa:
        out.append(finding(
            "wam.eager_attention", "warning" if device.type == "cuda" else "info",
            "eager softmax attention with a mask while SDPA is available",
            f"{path} materialises the (T x T) scores; the attention rule (video side never sees the actions) splits "
            "into two unmasked fused calls.", fix="lever sdpa"))

    if not levers.fuse_projections:
        out.append(finding(
            "wam.unfused_projections", "warning" if device.type == "cuda" else "info",
            "q, k and v as three matmuls a block, and fc1's GELU as a kernel of its own",
            f"{path} runs {len(model.blocks)} blocks x 3 projections of width {model.config.width} where one stacked "
            "matmul does the same work at a better tile shape, and writes fc1's output only for a GELU kernel to read "
            "it back; on the H200 fusing them gave 1.10x over best without them (wam-761, "
            "benchmarks/results/h200/matrix_wam-761_levers_s18.json).",
            fix="lever fuse_projections"))

    if device.type == "cuda" and model.dtype == torch.float32:
        out.append(finding("wam.fp32_on_gpu", "warning", "float32 transformer weights on a GPU",
                           "bfloat16 doubles the tensor-core rate and halves the weight traffic.",
                           fix="--dtype bfloat16 (build_wam's default on cuda)"))

    if device.type == "cuda" and not levers.cuda_graph and levers.compile != "reduce-overhead":
        out.append(finding(
            "wam.launch_overhead", "warning", "every kernel is launched from Python",
            "on the H200 one CUDA graph around the exact levers made wam-761's call 3.3x faster (367 -> 110 ms, "
            "matrix_wam-761_grid.json): the call was host-bound.",
            fix="lever cuda_graph (preset graph), or best (graph + compile)"))
    return out


def megakernel_residency(levers) -> dict | None:
    """The `megakernel` step kernel runs one program per SM and waits at grid barriers for all
    of them: under an MPS thread limit below 100% not all can be resident, every barrier waits
    until it gives up, and the call's actions are wrong (a server answers with an error)."""
    limit = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if not levers.megakernel or limit is None:
        return None
    try:
        below = float(limit) < 100
    except ValueError:
        below = True
    if not below:
        return None
    return finding("model.megakernel_residency", "error", f"megakernel under an MPS thread limit ({limit}%)",
                   "the step kernel launches one program per SM and synchronises them with grid barriers; with "
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE below 100 some programs cannot be resident, the barriers time "
                   "out after seconds, and the actions of those calls are wrong (the policy path raises on them).",
                   fix="unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (or 100), or run without megakernel")


def doctor(model=None, engine=None, workload=None, device: torch.device | str | None = None, *,
           measure: bool = True) -> list[dict]:
    """Environment checks, plus model checks when a model (or an engine) is given.
    Findings are sorted errors first. See the module docstring for the fields."""
    from vlaperf.models.pi0 import Pi0Model
    from vlaperf.models.wam import WorldActionModel

    if engine is not None and model is None:
        model = engine.model
    if model is not None and not isinstance(model, (Pi0Model, WorldActionModel)):
        raise TypeError(f"doctor: the model checks are the pi0 family's and the world-action model's, got "
                        f"{type(model).__name__}; for your own policy run doctor(device=...) (the environment) and "
                        "count_syncs / breakdown_fn on its call (docs/profiling.md, bring your own policy)")
    if model is not None:
        device = model.action_in_proj.weight.device
    out = environment_checks(device, model.dtype if model is not None else None)
    if model is not None:
        checks = wam_model_checks if isinstance(model, WorldActionModel) else model_checks
        out += checks(model, engine, workload, measure=measure)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda f: order[f["severity"]])


def exit_code(findings: list[dict]) -> int:
    """The CLI's exit status: 1 if any finding is an error, else 0."""
    return 1 if any(f["severity"] == "error" for f in findings) else 0
