"""`compile`: torch.compile of the prefix and of one denoise step (not the whole call).

Compiling the step once and running it N times keeps first-call compile time to what two
functions cost, instead of tracing N unrolled steps (LeRobot compiles the whole sampler and
its first call takes minutes). `compile_layers` goes one further for the prefix: each repeated
layer block is compiled once and reused by all 27 SigLIP and 18 Gemma layers (prefix.py), so
the compile no longer grows with the depth. `fullgraph=True` turns any graph break into an
error, and `dynamic=False` keeps shapes static: new prompt lengths map to a few buckets.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading

import torch


class CompileUnavailable(RuntimeError):
    pass


# The variables that turn torch.compile off. torch reads each as on only when it is exactly "1" (torch/_dynamo's
# config and eval_frame): "true" or "yes" leave compile running, so only "1" is reported.
COMPILE_DISABLE_VARS = ("TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE")


def compile_disabled_by() -> list[str]:
    """The COMPILE_DISABLE_VARS that turn torch.compile off in this process, as torch reads them."""
    return [var for var in COMPILE_DISABLE_VARS if os.environ.get(var) == "1"]


def compile_switched() -> dict[str, str]:
    """torch's import-time switches that change what a compiled call runs without turning compile off:
    {"backend_override": the TORCH_COMPILE_OVERRIDE_BACKENDS rules (the graphs they name run another backend, eager for
    one), "suppress_errors": the TORCHDYNAMO_SUPPRESS_ERRORS value (torch takes any non-empty value as on, "0"
    included: a frame that fails to compile then runs eager with a log line)}; each only where on. Read from torch's
    dynamo config where this process has loaded it (what it runs with); before that, from the environment as that
    config will read it, without importing torch._dynamo here (a doctor need not load the compiler stack, and a test's
    stand-in Triton makes that import fail). Older torch has no backend override (its config does not name it)."""
    config = sys.modules.get("torch._dynamo.config")
    if config is not None:
        override, suppress = getattr(config, "debug_backend_override", ""), getattr(config, "suppress_errors", False)
    else:
        override = os.environ.get("TORCH_COMPILE_OVERRIDE_BACKENDS", "") if _dynamo_config_reads(
            "TORCH_COMPILE_OVERRIDE_BACKENDS") else ""
        suppress = bool(os.environ.get("TORCHDYNAMO_SUPPRESS_ERRORS"))
    out = {}
    if override:
        out["backend_override"] = override
    if suppress:
        out["suppress_errors"] = os.environ.get("TORCHDYNAMO_SUPPRESS_ERRORS", "(set in torch._dynamo.config)")
    return out


def _dynamo_config_reads(var: str) -> bool:
    """Whether this torch's dynamo config reads the environment variable `var` (its source names it)."""
    try:  # the file by its place in torch's package: find_spec would import torch._dynamo to find it
        with open(os.path.join(os.path.dirname(torch.__file__), "_dynamo", "config.py"), encoding="utf-8") as f:
            return var in f.read()
    except Exception:  # no source to read: say what the environment says
        return True


def _compiler_names(device_type: str) -> list[str]:
    """The names inductor's compile tries on `device_type`, in order (missing_compiler says why these)."""
    if device_type == "cuda":
        return [os.environ["CC"]] if "CC" in os.environ else ["gcc", "clang"]
    cxx = os.environ.get("CXX")
    return [cxx] if cxx is not None else ["clang++" if sys.platform == "darwin" else "g++"]


def inductor_compiler(device_type: str) -> str | None:
    """The path of the compiler inductor runs on `device_type` here, found as it finds it; None where there is none."""
    return next((path for path in map(shutil.which, filter(None, _compiler_names(device_type))) if path), None)


def missing_compiler(device_type: str | None = None) -> str | None:
    """Why inductor cannot build its code on `device_type` here, or None: the compiler is looked for as the code that
    runs it looks for it, not as any compiler on PATH. On a GPU, Triton builds its kernels' launchers with $CC where
    it is set (used as given, even where it names nothing), else gcc, else clang: a bare `cc` is never tried
    (triton/runtime/build.py, 3.2 to 3.9). On the CPU, inductor compiles its kernels as C++ with $CXX where it is set,
    else g++ (clang++ on macOS; torch._inductor.config.cpp.cxx), and gcc alone cannot do that. device_type None: the
    default device, cuda where there is one."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if inductor_compiler(device_type):
        return None
    var = "CC" if device_type == "cuda" else "CXX"
    if var in os.environ:
        where = "Triton builds its kernels' launchers" if var == "CC" else "inductor compiles its CPU kernels"
        return f"{var}={os.environ[var]!r} names no program on PATH, and {where} with ${var} where it is set"
    if device_type == "cuda":
        return "no C compiler (gcc/clang) on PATH: Triton cannot build its kernels' launchers"
    return f"no C++ compiler ({_compiler_names('cpu')[0]}) on PATH: inductor cannot build its CPU kernels"


def inductor_cache_env() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR as given to the process: "" where it was started with an empty one that torch has since
    replaced by the current folder (vlaperf.INDUCTOR_CACHE_AT_START says why), else the variable as it is now. A
    folder set later, by --compile-cache (use_compile_cache) or the caller, is never the bare current folder."""
    from vlaperf import INDUCTOR_CACHE_AT_START

    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if INDUCTOR_CACHE_AT_START == "" and cache == os.path.abspath(""):
        return ""
    return cache


def compile_blockers(backend: str = "inductor", device_type: str | None = None) -> list[str]:
    """Reasons torch.compile would be silently off or fail here (seed 000 lost weeks to the first). device_type:
    where the compiled code runs (missing_compiler; None: the default device)."""
    reasons = [f"{var}=1 disables torch.compile (it would run eager, silently)" for var in compile_disabled_by()]
    override = compile_switched().get("backend_override")
    if override:
        reasons.append(f"TORCH_COMPILE_OVERRIDE_BACKENDS={override!r} runs the graphs it names with another backend "
                       "than the one asked for (silently)")
    missing = missing_compiler(device_type) if backend == "inductor" else None
    if missing:
        reasons.append(missing)
    cache = inductor_cache_env()
    if backend == "inductor" and cache == "":
        # a script's `=$UNSET`: torch 2.11's inductor calls makedirs("") when it is first imported and fails there
        # (FileNotFoundError: ''), 2.13 caches in the current folder; neither is what the empty value meant
        reasons.append("TORCHINDUCTOR_CACHE_DIR is set but empty: unset it, or name a folder (--compile-cache DIR)")
    elif backend == "inductor" and cache is not None:
        try:  # what inductor does with it at import, before anything compiles
            os.makedirs(os.path.abspath(cache), exist_ok=True)
        except OSError as e:
            reasons.append(f"TORCHINDUCTOR_CACHE_DIR={cache}: inductor cannot make its cache folder there "
                           f"({e.strerror or e})")
    return reasons


# Where torch.compile's artifacts live: Triton's compiled kernels (ours, launched by the custom
# ops, and inductor's) and inductor's FX-graph / autotuning caches. A process that finds them
# skips the compiles: on an H200 the first call of `best` takes 9.4-13.6 s with empty caches and
# 3.6-4.0 s with the caches an earlier process wrote (27-35 and 5.3-5.7 s before `compile_layers`
# and the kernel-compile thread; docs/perf-notes.md, sessions 10-12).
CACHE_ENV = {"triton": "TRITON_CACHE_DIR", "inductor": "TORCHINDUCTOR_CACHE_DIR"}


def use_compile_cache(path: str) -> dict[str, str]:
    """Keep the compile caches under `path` (`triton/`, `inductor/`), e.g. a volume that outlives
    a container, so a restarted server finds its kernels. Call before anything compiles: both
    libraries read these variables when they first look for a cached artifact. Returns the
    variables set."""
    root = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(root) and not os.path.isdir(root):
        raise ValueError(f"--compile-cache: {root} is a file; expected a directory (it is created if missing)")
    env = {var: os.path.join(root, sub) for sub, var in CACHE_ENV.items()}
    try:
        for d in env.values():
            os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--compile-cache: cannot create {root}: {e.strerror}") from None
    os.environ.update(env)
    return env


# Inductor's kernels with programmatic dependent launch where the engine asks for it (`pdl`:
# CUDA graphs on a Hopper GPU; kernels/launch.py says what PDL does). Off outside graphs: a PDL
# kernel bypasses inductor's static launcher, which eager launches rely on for their host time.
# benchmarks/change_ab.py --change inductor_pdl measures it (module switch).
INDUCTOR_PDL = True


def wants_pdl(device: torch.device, in_graph: bool) -> bool:
    """PDL for the kernels of an engine on `device` whose calls replay from a CUDA graph."""
    if not in_graph or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def inductor_has_pdl() -> bool:
    """Whether this torch's inductor has the PDL option (older releases reject an unknown option)."""
    import torch._inductor.config as inductor_config

    return "triton.enable_pdl" in inductor_config.get_config_copy()


def compile_fn(fn, mode: str, backend: str = "inductor", pdl: bool = False, device_type: str | None = None):
    blockers = compile_blockers(backend, device_type)
    if blockers:
        raise CompileUnavailable("compile lever cannot apply: " + "; ".join(blockers))
    # Each batch size x image count x prompt bucket is a distinct static shape of the same code
    # (with compile_layers, of each layer block): a finite set, compiled once each as it comes.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if backend != "inductor":
        return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
    if pdl and INDUCTOR_PDL and inductor_has_pdl():  # a mode is a set of inductor options; torch.compile takes one or the other
        options = {**torch._inductor.list_mode_options(mode), "triton.enable_pdl": True}
        return torch.compile(fn, options=options, fullgraph=True, dynamic=False)
    return torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)


def start_inductor_warmup() -> threading.Thread:
    """Do in a thread, now, what inductor does at the start of its first compile: import its
    compiler, start its pool of compile workers, hash torch's sources for its cache keys. On the
    H200's host the first compiled graph took ~2.6 s more than the next ones before its AOT
    tracing began (0.8 s of it the hash: first_call.py), and the engine's construction (4.5 s)
    leaves time to overlap. Join it before the first compile, so the two threads never start
    the pool twice. Failures are ignored: inductor then does the same work itself."""

    def work():
        try:
            import torch._inductor.compile_fx  # noqa: F401
            from torch._inductor.async_compile import maybe_warm_pool
            from torch._inductor.codecache import torch_key

            maybe_warm_pool()
            torch_key()
        except Exception:
            pass

    thread = threading.Thread(target=work, name="vlaperf-inductor-warmup", daemon=True)
    thread.start()
    return thread
