"""CPU tests of vlaperf.profile.doctor: environment findings (monkeypatched), GPU probes with a
fake nvidia-smi, and the model checks on the tiny policy."""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from vlaperf.engine import Engine
from vlaperf.models.pi0 import build_model
from vlaperf.profile import doctor as doctor_mod
from vlaperf.profile.doctor import SEVERITIES, doctor, environment_checks, exit_code
from vlaperf.workloads import get_workload

KEYS = {"id", "severity", "title", "detail", "cost", "cost_note", "fix"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE", "CUDA_LAUNCH_BLOCKING", "CC", "TRITON_FORCE_DISABLE_FP_FUSION",
                "TRITON_INTERPRET", "PYTORCH_NO_CUDA_MEMORY_CACHING"):
        monkeypatch.delenv(var, raising=False)


def by_id(findings):
    return {f["id"]: f for f in findings}


def test_findings_have_the_documented_fields():
    findings = doctor()
    assert findings and all(set(f) == KEYS and f["severity"] in SEVERITIES for f in findings)
    assert "env.versions" in by_id(findings)
    order = [SEVERITIES.index(f["severity"]) for f in findings]
    assert order == sorted(order)  # errors first


@pytest.mark.parametrize("var", ["TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE"])
def test_compile_disabled_is_an_error(monkeypatch, var):
    monkeypatch.setenv(var, "1")
    f = by_id(doctor())["env.compile_disabled"]
    assert f["severity"] == "error" and var in f["title"]
    assert "unset" in f["fix"]
    assert exit_code(doctor()) == 1


def test_zero_does_not_disable_compile(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    assert "env.compile_disabled" not in by_id(doctor())


def test_backend_override_and_suppressed_errors_as_this_torch_read_them(monkeypatch):
    """TORCH_COMPILE_OVERRIDE_BACKENDS runs the graphs it names with another backend (eager, say) and
    TORCHDYNAMO_SUPPRESS_ERRORS lets a failed compile run eager: neither turns compile off, so neither was seen.
    torch reads both at its import, so the doctor reads torch's config, as a process started with them has it
    (set here through the config's own patch, which puts it back)."""
    import torch._dynamo.config as dynamo_config

    from vlaperf.engine.compile import compile_blockers, compile_switched

    has_override = hasattr(dynamo_config, "debug_backend_override")
    with dynamo_config.patch(suppress_errors=False, **({"debug_backend_override": ""} if has_override else {})):
        found = by_id(doctor())
        assert "env.compile_backend_override" not in found and "env.compile_errors_suppressed" not in found
        assert not any("OVERRIDE" in r for r in compile_blockers())
    monkeypatch.setenv("TORCHDYNAMO_SUPPRESS_ERRORS", "0")  # any non-empty value is on for torch
    with dynamo_config.patch(suppress_errors=True):
        f = by_id(doctor())["env.compile_errors_suppressed"]
        assert f["severity"] == "warning" and "TORCHDYNAMO_SUPPRESS_ERRORS=0" in f["title"] and "unset" in f["fix"]
    if not has_override:
        pytest.skip("this torch has no TORCH_COMPILE_OVERRIDE_BACKENDS")
    with dynamo_config.patch(debug_backend_override="0-999:eager"):
        findings = doctor()
        f = by_id(findings)["env.compile_backend_override"]
        assert f["severity"] == "error" and "0-999:eager" in f["title"] and exit_code(findings) == 1
        assert compile_blockers()[0].startswith("TORCH_COMPILE_OVERRIDE_BACKENDS='0-999:eager' runs the graphs")
        assert compile_blockers("eager")  # whatever the backend asked for, it is not the one that runs
    # a process that has not loaded torch's compiler stack yet: read from the environment as its config will read it
    monkeypatch.delitem(sys.modules, "torch._dynamo.config")
    monkeypatch.setenv("TORCH_COMPILE_OVERRIDE_BACKENDS", "0-9:eager")
    assert compile_switched() == {"backend_override": "0-9:eager", "suppress_errors": "0"}
    monkeypatch.setenv("TORCHDYNAMO_SUPPRESS_ERRORS", "")
    monkeypatch.delenv("TORCH_COMPILE_OVERRIDE_BACKENDS")
    assert compile_switched() == {}


def test_the_override_switches_set_before_torch_starts_are_found(tmp_path):
    """The same two switches in the environment of a fresh `vlaperf doctor`: both found, exit 1, and the result's
    environment record lists them."""
    import json
    import subprocess

    env = dict(os.environ, TORCHDYNAMO_SUPPRESS_ERRORS="0", TORCH_COMPILE_OVERRIDE_BACKENDS="0-999:eager")
    out = tmp_path / "d.json"
    run = subprocess.run([sys.executable, "-m", "vlaperf.cli", "doctor", "--json", str(out)], env=env,
                         capture_output=True, text=True, timeout=120)
    r = json.loads(out.read_text())
    ids = {f["id"] for f in r["findings"]}
    assert "env.compile_errors_suppressed" in ids
    variables = r["env"]["env_vars"]
    assert variables["TORCHDYNAMO_SUPPRESS_ERRORS"] == "0"
    assert variables["TORCH_COMPILE_OVERRIDE_BACKENDS"] == "0-999:eager"
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "debug_backend_override"):
        assert "env.compile_backend_override" in ids and run.returncode == 1, run.stdout[-2000:]


@pytest.mark.parametrize("value", ["false", "no", "2"])
def test_compile_disabled_only_where_torch_disables_it(monkeypatch, value):
    """torch turns compile off only for TORCHDYNAMO_DISABLE / TORCH_COMPILE_DISABLE equal to "1". The doctor called
    any other non-empty value but "0" an error and the compile lever refused to start, while torch compiled."""
    from vlaperf.engine.compile import compile_blockers

    monkeypatch.setenv("TORCHDYNAMO_DISABLE", value)
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", value)
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    torch._dynamo.reset()
    assert float(torch.compile(lambda x: x * 2 + 1, backend=backend)(torch.ones(2)).sum()) == 6.0
    torch._dynamo.reset()
    assert compiled, f"TORCHDYNAMO_DISABLE={value} turned compile off after all"
    assert "env.compile_disabled" not in by_id(doctor())
    assert not any("disables torch.compile" in r for r in compile_blockers())
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    assert compile_blockers()[0] == "TORCH_COMPILE_DISABLE=1 disables torch.compile (it would run eager, silently)"


def test_missing_c_compiler_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no cc, gcc or clang
    f = by_id(doctor())["env.no_c_compiler"]
    assert f["severity"] == "error"
    assert "inductor" in f["title"] and "cuda_graph" in f["fix"]


def test_cuda_launch_blocking(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert by_id(doctor())["env.cuda_launch_blocking"]["severity"] == "error"


class _TritonWithout:
    """Stands in for the `triton` module of an older release: knobs without the fp-fusion switch (3.6), or no
    knobs at all (before 3.4)."""

    def __init__(self, knobs):
        self.knobs = knobs


def _installed_triton(monkeypatch, which: str) -> None:
    import importlib
    import types

    if torch.cuda.is_available():
        # torch's lazy CUDA init asks importlib for `triton`'s spec, which a stand-in has not: initialised here first
        torch.cuda.init()
    # the doctor reads inductor's default cache folder, and torch._dynamo imports the real `triton` when it is first
    # loaded (a stand-in has no `language`; None halts the import): a real process has it loaded before any check
    importlib.import_module("torch._inductor.runtime.cache_dir_utils")
    if which == "none":
        monkeypatch.setitem(sys.modules, "triton", None)  # import fails: no Triton, no Triton kernels
    elif which == "3.6":  # knobs, but language has no force_disable_fp_fusion (the variable does nothing there)
        knobs = pytest.importorskip("triton.knobs")
        monkeypatch.setitem(sys.modules, "triton", _TritonWithout(types.SimpleNamespace(
            language=types.SimpleNamespace(default_fp_fusion=True), runtime=knobs.runtime)))
    elif which == "3.2":  # no knobs: its jit compares TRITON_INTERPRET with "1"
        monkeypatch.setitem(sys.modules, "triton", _TritonWithout(None))
    else:
        pytest.importorskip("triton.knobs")


@pytest.mark.parametrize("triton", ["installed", "3.6", "none"])
@pytest.mark.parametrize("value, off", [("1", True), ("yes", True), ("TRUE", True), ("On", True), ("0", False),
                                        ("2", False), (" 1", False), ("", False)])
def test_fp_fusion_forced_off_is_a_warning_where_triton_reads_the_switch_as_on(monkeypatch, value, off, triton):
    """TRITON_FORCE_DISABLE_FP_FUSION takes fused multiply-add out of every Triton kernel, whatever the kernel asks
    for (vlaperf's launches ask for it): a warning with the value and the fix where the installed Triton reads the
    switch as on (its own knob: Triton 3.9 has it); nothing where Triton has no such switch (3.6) or is absent.
    Result files list the variable either way."""
    monkeypatch.setenv("TRITON_FORCE_DISABLE_FP_FUSION", value)
    _installed_triton(monkeypatch, triton)
    if triton == "installed":
        import triton.knobs as knobs

        if not hasattr(knobs.language, "force_disable_fp_fusion"):
            pytest.skip("this Triton has no TRITON_FORCE_DISABLE_FP_FUSION")
        assert bool(knobs.language.force_disable_fp_fusion) == off  # Triton's own reading is the doctor's
    warns = off and triton == "installed"
    found = by_id(environment_checks("cpu"))
    assert ("env.fp_fusion_disabled" in found) == warns
    if warns:
        f = found["env.fp_fusion_disabled"]
        assert f["severity"] == "warning" and f"TRITON_FORCE_DISABLE_FP_FUSION={value}" in f["title"]
        assert "inductor's and vlaperf's" in f["detail"] and f["fix"] == "unset TRITON_FORCE_DISABLE_FP_FUSION"
    assert f"TRITON_FORCE_DISABLE_FP_FUSION={value}" in found["env.variables"]["detail"]


@pytest.mark.parametrize("triton", ["installed", "3.2", "none"])
def test_debug_switches_left_on_a_gpu_machine_are_errors(monkeypatch, triton):
    """TRITON_INTERPRET (as the installed Triton reads it: its knob, or exactly "1" before Triton had knobs) runs
    every Triton kernel in Triton's interpreter on the host, and PYTORCH_NO_CUDA_MEMORY_CACHING=1 (torch reads only
    "1") a synchronizing cudaFree per tensor: errors on a GPU, each with its fix; nothing on the CPU, where the
    interpreter is how the kernels' tests run, or without Triton; listed either way."""
    _installed_triton(monkeypatch, triton)
    assert doctor_mod._cuda_debug_switches() == []
    for value, knob, old in (("1", True, True), ("Yes", True, False), ("true", True, False), ("0", False, False),
                             ("2", False, False)):
        on = {"installed": knob, "3.2": old, "none": False}[triton]
        monkeypatch.setenv("TRITON_INTERPRET", value)
        found = by_id(doctor_mod._cuda_debug_switches())
        assert ("env.triton_interpreter" in found) == on, value
        if on:
            f = found["env.triton_interpreter"]
            assert f["severity"] == "error" and f"TRITON_INTERPRET={value}" in f["title"] and f["fix"] == "unset TRITON_INTERPRET"
    monkeypatch.delenv("TRITON_INTERPRET")
    for value, on in (("1", True), ("0", False), ("true", False)):
        monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", value)
        found = by_id(doctor_mod._cuda_debug_switches())
        assert ("env.uncached_allocator" in found) == on, value
        if on:
            assert found["env.uncached_allocator"]["severity"] == "error" and "cudaFree" in found["env.uncached_allocator"]["detail"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    monkeypatch.setattr(doctor_mod, "nvidia_smi", lambda args: None)  # no GPU needed: the checks read no device
    for device, errors in (("cuda", True), ("cpu", False)):
        found = by_id(environment_checks(device))
        assert ("env.triton_interpreter" in found) == (errors and triton != "none"), device
        assert ("env.uncached_allocator" in found) == errors, device
        assert {"TRITON_INTERPRET=1", "PYTORCH_NO_CUDA_MEMORY_CACHING=1"} <= set(found["env.variables"]["detail"].split(", "))


def test_gemm_workspace_variables_are_listed(monkeypatch):
    """cuBLAS's workspace variables change which GEMM kernels run: the doctor names them."""
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "32768")
    f = by_id(environment_checks("cpu"))["env.variables"]
    assert "CUBLASLT_WORKSPACE_SIZE=32768" in f["detail"]


def test_clean_environment_has_no_errors(monkeypatch):
    from vlaperf.engine.compile import missing_compiler

    if missing_compiler():
        pytest.skip("this machine has no compiler inductor can use: " + missing_compiler())
    assert exit_code(doctor()) == 0


def test_compile_cache_finding_names_the_directories_and_their_size(monkeypatch, tmp_path):
    """The doctor says where the compiled kernels are cached and how much is there; a cache
    in the temporary directory gets the --compile-cache advice, one on lasting storage none."""
    (tmp_path / "triton" / "k").mkdir(parents=True)
    (tmp_path / "triton" / "k" / "kernel.cubin").write_bytes(b"x" * 2_000_000)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # not created yet
    f = by_id(environment_checks("cpu"))["env.compile_cache"]
    assert "(in a temporary directory)" in f["title"]
    assert f["severity"] == "info" and f"triton {tmp_path / 'triton'} (2.0 MB)" in f["detail"]
    assert f"inductor {tmp_path / 'inductor'} (not there yet)" in f["detail"]
    assert "--compile-cache DIR" in f["fix"]  # pytest's tmp_path lies under the temp directory
    assert doctor_mod._dir_bytes(str(tmp_path / "triton"), max_files=1) == (2_000_000, True)  # stops counting
    lasting = {var: str(Path.home() / ".cache" / "vlaperf-test" / sub)
               for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"))}
    for var, path in lasting.items():
        monkeypatch.setenv(var, path)
    f = by_id(environment_checks("cpu"))["env.compile_cache"]
    assert f["title"] == "compile caches" and f["fix"] is None, f


def test_pdl_finding_says_why_it_is_off(monkeypatch):
    """The doctor names the reason inductor's PDL kernels are not used: an older GPU, a torch
    without the option, the switch; and that it is on otherwise. Never an error (a speed note)."""
    from vlaperf.engine import compile as compile_mod

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    f = doctor_mod._pdl_check(cuda)
    assert f["id"] == "env.pdl" and f["severity"] == "info" and "not on this GPU" in f["title"] and "8.0" in f["detail"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(compile_mod, "inductor_has_pdl", lambda: True)
    assert doctor_mod._pdl_check(cuda)["title"].endswith(": on")
    monkeypatch.setattr(compile_mod, "inductor_has_pdl", lambda: False)
    f = doctor_mod._pdl_check(cuda)
    assert "not in this torch" in f["title"] and f["fix"]
    monkeypatch.setattr(compile_mod, "inductor_has_pdl", lambda: True)
    monkeypatch.setattr(compile_mod, "INDUCTOR_PDL", False)
    assert doctor_mod._pdl_check(cuda)["title"].endswith(": off")
    monkeypatch.setenv("TORCHINDUCTOR_ENABLE_PDL", "1")
    assert "static launcher" in doctor_mod._pdl_check(cuda)["detail"]
    # a CPU run has no such finding
    assert "env.pdl" not in by_id(environment_checks("cpu"))


def test_pdl_finding_when_inductor_cannot_be_imported(monkeypatch):
    """Importing inductor makes its cache folder; torch 2.11 raises FileNotFoundError there for
    TORCHINDUCTOR_CACHE_DIR="" (seen on the GPU machine). The doctor crashed with "error: : No such file or
    directory" before showing any finding; the PDL finding is now "unknown" and names the error."""
    from vlaperf.engine import compile as compile_mod

    def no_inductor():
        raise FileNotFoundError(2, "No such file or directory", "")

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(compile_mod, "inductor_has_pdl", no_inductor)
    f = doctor_mod._pdl_check(torch.device("cuda"))
    assert f["severity"] == "info" and f["title"].endswith(": unknown")
    assert f["detail"] == "inductor could not be imported: [Errno 2] No such file or directory: ''"


def test_compile_refuses_an_inductor_cache_it_cannot_use(monkeypatch, tmp_path):
    """An empty TORCHINDUCTOR_CACHE_DIR (torch 2.11 fails at inductor's import, 2.13 takes the current folder) and a
    name under a file are refused before anything compiles, naming the variable; a new folder is made and used."""
    from vlaperf.engine.compile import CompileUnavailable, compile_blockers

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    empty = "TORCHINDUCTOR_CACHE_DIR is set but empty: unset it, or name a folder (--compile-cache DIR)"
    assert empty in compile_blockers() and empty not in compile_blockers("eager")
    with pytest.raises(CompileUnavailable, match=re.escape(empty)):
        Engine(build_model("tiny", seed=0), "for_loop,compile")
    # a name under a file: test_compile_blockers_leave_an_unset_cache_and_another_backend_alone
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert not any("TORCHINDUCTOR_CACHE_DIR" in r for r in compile_blockers())
    assert (tmp_path / "new" / "cache").is_dir()


def test_gpu_probes_with_fake_nvidia_smi(monkeypatch):
    """Only our GPU (by UUID) counts: a job on the host's other GPU is not a tenant of ours."""
    def fake(args):
        q = args[0]
        if q.startswith("--query-compute-apps"):
            return "GPU-aaaa-1, 4242, python3, 30000\nGPU-aaaa-1, 999999, other_job, 512\nGPU-bbbb-2, 777, lane_b, 9000"
        if q.startswith("--query-gpu=uuid"):
            return ("GPU-aaaa-1, 0, NVIDIA H200, 1980, 1980, 3201, 3201, 85, 650.1, 700.0, 0x0000000000000040\n"
                    "GPU-bbbb-2, 1, NVIDIA H200, 1980, 1980, 3201, 3201, 40, 120.0, 700.0, 0x0000000000000000")
        if q.startswith("--query-gpu=driver_version"):
            return "580.159.04"
        return None

    monkeypatch.setattr(doctor_mod, "nvidia_smi", fake)
    checks = doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1")
    found = by_id(checks)
    assert found["env.gpu_processes"]["severity"] == "warning"
    assert "pid 4242 python3" in found["env.gpu_processes"]["detail"] and "lane_b" not in found["env.gpu_processes"]["detail"]
    clocks = [f for f in checks if f["id"] == "env.gpu_clocks"]
    assert len(clocks) == 1 and clocks[0]["severity"] == "warning" and "thermal" in clocks[0]["title"]
    # on the other GPU: the job there is its tenant, ours is not; only its clocks
    other = doctor_mod._gpu_checks(torch.device("cuda"), uuid="bbbb-2")
    assert "lane_b" in by_id(other)["env.gpu_processes"]["detail"] and "4242" not in by_id(other)["env.gpu_processes"]["detail"]
    assert [f["title"] for f in other if f["id"] == "env.gpu_clocks"] == ["GPU 1 clocks"]
    # a UUID nvidia-smi does not list (format mismatch): every GPU is reported, nothing hidden
    unknown = doctor_mod._gpu_checks(torch.device("cuda"), uuid="cccc-3")
    assert len([f for f in unknown if f["id"] == "env.gpu_clocks"]) == 2
    assert "3 other process(es)" in by_id(unknown)["env.gpu_processes"]["title"]
    versions = by_id(environment_checks("cuda"))["env.versions"]
    assert "driver 580.159.04" in versions["detail"]
    if not torch.cuda.is_available():
        assert versions["severity"] == "error"  # cuda asked for, not available


def test_model_checks_on_the_reference_path():
    model = build_model("tiny")
    found = by_id(doctor(model, workload="tiny"))
    syncs = found["model.host_syncs"]
    assert syncs["severity"] == "warning" and syncs["title"].startswith("5 host syncs per call")
    assert "vlaperf/models/pi0.py" in syncs["detail"] and "for_loop" in syncs["fix"]
    assert syncs["cost"] is None  # no device to wait for on the CPU: not measured
    masked = found["model.masked_images_embedded"]
    assert masked["fix"] == "lever skip_masked_images" and masked["cost"] > 0
    assert "embed_image" in masked["cost_note"]
    padded = found["model.padded_prompt"]
    # measured, or (the padding's cost below this machine's noise) said to be unresolved
    assert padded["title"].startswith("10 padded prompt tokens")
    assert padded["cost"] is not None or padded["cost_note"].startswith("not resolved")
    assert found["model.eager_attention"]["fix"] == "lever sdpa"


def test_model_checks_pick_a_workload_of_the_model_s_chunk():
    """Without a workload the checks take the first of the model's preset and chunk (droid-pi0's 10 actions, not
    libero-pi0's 50); a chunk no workload has is run on the preset's first workload with that chunk."""
    from vlaperf.models.pi0 import get_config

    found = by_id(doctor(build_model(get_config("tiny", action_horizon=6))))  # was a ValueError (chunk 10 != 6)
    assert found["model.host_syncs"]["title"].startswith("5 host syncs per call")  # tiny's 4 steps + 1, as above
    assert "model.masked_images_embedded" in found


def test_model_checks_on_the_best_engine():
    model = build_model("tiny")
    found = by_id(doctor(engine=Engine(model, "best"), workload="tiny"))
    assert found["model.host_syncs"]["severity"] == "info"
    assert not {"model.masked_images_embedded", "model.padded_prompt", "model.eager_attention"} & set(found)


@pytest.mark.parametrize("limit,expected", [(None, None), ("100", None), ("50", "error"), ("half", "error")])
def test_megakernel_under_an_mps_thread_limit_is_an_error(monkeypatch, limit, expected):
    from vlaperf.engine.levers import Levers

    if limit is None:
        monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    else:
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", limit)
    f = doctor_mod.megakernel_residency(Levers(megakernel=True))
    assert (f and f["severity"]) == expected
    if f:
        assert f["id"] == "model.megakernel_residency" and limit in f["title"] and "without megakernel" in f["fix"]
    assert doctor_mod.megakernel_residency(Levers()) is None  # the lever off: nothing to say


def _fake_smi(bits, pid):
    def fake(args):
        q = args[0]
        if q.startswith("--query-compute-apps"):
            return f"GPU-aaaa-1, {pid}, python3, 30000"
        if q.startswith("--query-gpu=uuid"):
            return f"GPU-aaaa-1, 0, NVIDIA H200, 1980, 1980, 3201, 3201, 40, 650.1, 700.0, {bits:#018x}"
        return None
    return fake


@pytest.mark.parametrize("bit", [0x8, 0x20, 0x40, 0x80])
def test_each_bad_throttle_bit_warns(monkeypatch, bit):
    """Every bad throttle reason warns (0x80: HW power brake)."""
    import torch
    from vlaperf.profile import doctor as d
    monkeypatch.setattr(d, "nvidia_smi", _fake_smi(bit, 4242))
    clocks = [f for f in d._gpu_checks(torch.device("cuda"), uuid="aaaa-1") if f["id"] == "env.gpu_clocks"]
    assert clocks[0]["severity"] == "warning"


def test_own_process_is_not_a_tenant(monkeypatch):
    """This process is not "another process on the GPU"."""
    import os
    import torch
    from vlaperf.profile import doctor as d
    monkeypatch.setattr(d, "nvidia_smi", _fake_smi(0, os.getpid()))
    assert not [f for f in d._gpu_checks(torch.device("cuda"), uuid="aaaa-1") if f["id"] == "env.gpu_processes"]


def test_padded_prompt_severity_threshold():
    """The padded-prompt finding is a warning once the padding is >= 5% of the prefix."""
    from vlaperf.models.pi0 import build_model
    from vlaperf.profile.doctor import model_checks
    model = build_model("tiny")
    w = get_workload("tiny")
    share = (w.prompt_slots - max(w.prompt_valid)) / (w.prompt_slots + model.config.vision.num_patches * w.image_slots)
    found = {f["id"]: f for f in model_checks(model, workload="tiny", measure=False)}
    assert 0.05 <= share < 0.5, share
    assert found["model.padded_prompt"]["severity"] == "warning"


def test_exit_code_only_errors():
    """Only errors make doctor exit non-zero."""
    from vlaperf.profile.doctor import exit_code, finding
    assert exit_code([finding("x", "warning", "t", "d"), finding("y", "info", "t", "d")]) == 0
    assert exit_code([finding("x", "error", "t", "d")]) == 1


def test_masked_images_cost_counts_every_masked_slot(monkeypatch):
    """The masked-images cost counts every masked slot."""
    import dataclasses
    from vlaperf.models.pi0 import build_model
    from vlaperf.profile import doctor as d
    monkeypatch.setattr(d, "_median_ms", lambda fn, device, iters=5: 1.0)
    w = dataclasses.replace(get_workload("tiny"), image_valid=(True, False, False))
    found = {f["id"]: f for f in d.model_checks(build_model("tiny"), workload=w, measure=True)}
    assert found["model.masked_images_embedded"]["cost"] == pytest.approx(2.0)


def _programs(tmp_path, *names) -> None:
    """Empty executables called `names` in tmp_path (PATH is set to it alone by the caller)."""
    for name in names:
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)


def test_cc_counts_as_a_compiler_only_where_it_exists(monkeypatch, tmp_path):
    """On a GPU Triton builds with $CC where it is set: one PATH has is enough, and one it lacks fails the build even
    with gcc there (Triton never falls back from a $CC that names nothing), so that is an error too."""
    _programs(tmp_path, "my-cc", "gcc")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "my-cc")
    assert "env.no_c_compiler" not in by_id(environment_checks("cuda"))
    monkeypatch.setenv("CC", "no-such-cc")
    f = by_id(environment_checks("cuda"))["env.no_c_compiler"]
    assert f["severity"] == "error" and "CC='no-such-cc' names no program on PATH" in f["detail"]


def test_launch_blocking_zero_and_anomaly_detection(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "0")
    found = by_id(environment_checks("cpu"))
    assert "env.cuda_launch_blocking" not in found and "env.anomaly_detection" not in found
    with torch.autograd.set_detect_anomaly(True):
        f = by_id(environment_checks("cpu"))["env.anomaly_detection"]
    assert f["severity"] == "warning" and f["fix"] == "torch.autograd.set_detect_anomaly(False)"


@pytest.mark.parametrize("device,dtype,severity", [("cuda", torch.float32, "warning"), ("cuda", torch.bfloat16, "info"),
                                                   ("cpu", torch.float32, "info")])
def test_full_precision_float32_matmuls_warn_only_for_a_float32_model_on_a_gpu(monkeypatch, device, dtype, severity):
    monkeypatch.setattr(doctor_mod, "nvidia_smi", lambda args: None)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    f = by_id(environment_checks(device, dtype))["env.matmul_precision"]
    assert f["severity"] == severity
    if severity == "info":
        assert f["title"] == "float32 matmul precision: highest"
        assert f["detail"].endswith(" (matters only for float32 matmuls)") == (device == "cuda")
    else:
        assert "--dtype bfloat16" in f["fix"]


def test_compile_cache_sizes_and_what_counts_as_temporary(monkeypatch, tmp_path):
    """A count that stopped early says "at least"; a cache under the temporary directory (wherever it is) is
    volatile, one beside it whose name only starts like it is not."""
    import tempfile

    monkeypatch.setattr(doctor_mod, "_dir_bytes", lambda path: (3_000_000, True))
    assert doctor_mod._size(str(tmp_path)) == "at least 3.0 MB"
    monkeypatch.setattr(tempfile, "tempdir", "/vlaperf-test-scratch")  # a temporary directory outside /tmp
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        monkeypatch.setenv(var, f"/vlaperf-test-scratch/{sub}")
    assert by_id(environment_checks("cpu"))["env.compile_cache"]["fix"] is not None
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        monkeypatch.setenv(var, f"/tmpvlaperf-test-not-temporary/{sub}")
    f = by_id(environment_checks("cpu"))["env.compile_cache"]
    assert f["title"] == "compile caches" and f["fix"] is None


def test_gpu_rows_match_our_uuid_in_any_case_and_name_each_tenant_s_memory(monkeypatch):
    def fake(args):
        q = args[0]
        if q.startswith("--query-compute-apps"):
            return "GPU-AAAA-1, 4242, python3, 30000\nGPU-AAAA-1, 4243, tool\nGPU-BBBB-2, 777, lane_b, 9000"
        if q.startswith("--query-gpu=uuid"):
            return ("GPU-AAAA-1, 0, NVIDIA H200, 1980, 1980, 3201, 3201, 40, 120.0, 700.0, 0x0000000000000000\n"
                    "GPU-BBBB-2, 1, NVIDIA H200, 1980, 1980, 3201, 3201, 40, 120.0, 700.0, 0x0000000000000000")
        if q.startswith("--query-gpu=driver_version"):
            return "580.159.04\n580.159.04"  # one line a GPU
        return None

    monkeypatch.setattr(doctor_mod, "nvidia_smi", fake)
    checks = doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1")
    assert [f["title"] for f in checks if f["id"] == "env.gpu_clocks"] == ["GPU 0 clocks"]  # GPU-BBBB-2 is not ours
    found = by_id(checks)
    assert found["env.gpu_processes"]["title"] == "2 other process(es) on the GPU"
    assert found["env.gpu_processes"]["detail"].startswith("pid 4242 python3 (30000 MiB); pid 4243 tool. ")
    assert found["env.gpu_clocks"]["title"] == "GPU 0 clocks"
    assert "driver 580.159.04; " in doctor_mod._versions(torch.device("cpu"))["detail"]


def test_one_host_sync_outside_a_loop_gets_the_remove_the_read_fix(monkeypatch):
    """A single sync is a finding already; for_loop is the fix only for a sync in a `while` condition."""
    from vlaperf.profile import syncs
    from vlaperf.profile.doctor import model_checks

    site = {"per_call": 1, "location": "policy.py:7", "op": "Tensor.item", "code": "n = int(t.item())"}
    monkeypatch.setattr(syncs, "count_syncs", lambda fn, **kw: {"per_call": 1, "sites": [site], "note": None})
    f = by_id(model_checks(build_model("tiny"), workload="tiny", measure=False))["model.host_syncs"]
    assert f["severity"] == "warning" and f["title"] == "1 host sync per call (reference sample_actions)"
    assert f["detail"].startswith("1x policy.py:7 Tensor.item: n = int(t.item()). ")
    assert f["fix"].startswith("remove the host reads at the listed lines")
    assert f["cost"] is None and f["cost_note"] == "not measurable on the CPU (no device to wait for)"


def test_world_action_model_checks(monkeypatch):
    """The world-action checks on wam-tiny (4 steps, the video finished after 2): the sync fix names the levers for
    .nonzero() reads and only for them, the context's keys/values cost (steps - 1) computations, and the finished
    video is recomputed in steps - video_steps - 1 forwards (none when the video runs all the steps)."""
    import dataclasses

    from vlaperf.models.wam import build_wam
    from vlaperf.profile import syncs
    from vlaperf.workloads import get_wam_workload

    model, w = build_wam("wam-tiny", seed=0), get_wam_workload("wam-tiny")
    monkeypatch.setattr(doctor_mod, "_median_ms", lambda fn, device, iters=5: 1.0)
    found = by_id(doctor(model, workload=w, measure=True))
    assert found["wam.host_syncs"]["severity"] == "warning" and "cached_keep_index" in found["wam.host_syncs"]["fix"]
    assert found["wam.context_kv_per_step"]["cost"] == pytest.approx(3.0)
    assert found["wam.finished_video_recomputed"]["title"] == "the finished video recomputed in 1 forward"
    assert found["wam.finished_video_recomputed"]["severity"] == "warning"
    assert "wam.sparsity_host_bound" not in found  # no sparsity
    site = {"per_call": 2, "location": "wam.py:9", "op": "Tensor.item", "code": "x.item()"}
    monkeypatch.setattr(syncs, "count_syncs", lambda fn, **kw: {"per_call": 2, "sites": [site], "note": None})
    found = by_id(doctor(model, workload=dataclasses.replace(w, video_steps=4), measure=False))
    assert found["wam.host_syncs"]["fix"] == "remove the host reads at the listed lines"
    assert "wam.finished_video_recomputed" not in found


def test_doctor_refuses_other_models_and_presets_without_a_workload():
    import dataclasses

    from vlaperf.profile.doctor import model_checks

    with pytest.raises(TypeError, match="doctor: the model checks are the pi0 family's and the world-action model's, "
                                        "got Linear"):
        doctor(torch.nn.Linear(2, 2))
    model = build_model("tiny")
    model.config = dataclasses.replace(model.config, name="mine")
    with pytest.raises(ValueError, match="doctor: pass a workload for model preset 'mine'"):
        model_checks(model, measure=False)


def test_padded_prompt_counts_the_longest_prompt_and_leaves_an_unresolved_cost_out(monkeypatch):
    """The padding is what the longest prompt of the batch leaves; a trimmed prefill timed slower than the full one
    is no cost (not a negative time, nor a 0 that reads as "padding is free"), with both times and why; eager
    attention is a note on the CPU."""
    import dataclasses

    from vlaperf.profile.doctor import model_checks

    model = build_model("tiny")
    w = dataclasses.replace(get_workload("tiny"), batch=2, prompt_valid=(2, 6))
    times = iter([5.0, 2.0, 3.0] + [1.0] * 10)  # masked image, then the full and the trimmed prefill
    monkeypatch.setattr(doctor_mod, "_median_ms", lambda fn, device, iters=5: next(times))
    found = by_id(model_checks(model, workload=w, measure=True))
    padded = found["model.padded_prompt"]
    prefix = w.prompt_slots + model.config.vision.num_patches * w.image_slots
    assert padded["title"] == f"{w.prompt_slots - 6} padded prompt tokens computed per sample ({w.prompt_slots} slots, 6 valid)"
    assert f"the prefix holds {prefix} tokens of which {w.prompt_slots - 6} are prompt padding " \
           f"({100 * (w.prompt_slots - 6) / prefix:.1f}%)" in padded["detail"]
    assert padded["cost"] is None and padded["cost_note"].startswith(
        "not resolved: model.prefill over the full prefix 2.000 ms - over the trimmed prefix 3.000 ms, the longer "
        "prefix the faster")
    assert found["model.eager_attention"]["severity"] == "info"


def test_findings_are_sorted_errors_first(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    findings = doctor(build_model("tiny"), workload="tiny", measure=False)
    severities = [f["severity"] for f in findings]
    assert severities[0] == "error" and "warning" in severities and "info" in severities
    assert severities == sorted(severities, key=SEVERITIES.index)


# ----------------------------------------------------------------- audited by mutation: each finding's trigger,
# boundary, severity and the words that name the setting


def test_compile_disabled_names_each_variable_with_its_value_and_the_fix(monkeypatch):
    """Both variables set: one finding each, its title the exact assignment found, its fix unsetting that variable."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    found = [f for f in environment_checks("cpu") if f["id"] == "env.compile_disabled"]
    assert [f["title"] for f in found] == ["torch.compile is silently off: TORCHDYNAMO_DISABLE=1",
                                          "torch.compile is silently off: TORCH_COMPILE_DISABLE=1"]
    assert [f["fix"].split(".")[0] for f in found] == ["unset TORCHDYNAMO_DISABLE", "unset TORCH_COMPILE_DISABLE"]


@pytest.mark.parametrize("names, device, found", [
    (["gcc"], "cuda", True), (["clang"], "cuda", True), (["g++"], "cpu", True),
    (["cc"], "cuda", False),  # Triton looks for $CC, gcc and clang: a bare cc is never tried
    (["cc", "gcc", "clang"], "cpu", False),  # inductor's CPU kernels are C++: $CXX or g++
])
def test_the_compiler_counts_where_inductor_looks_for_it(monkeypatch, tmp_path, names, device, found):
    """The doctor counted any of cc, gcc or clang as a compiler. On the CPU inductor compiles C++ with $CXX or g++ and
    failed with InvalidCxxCompiler on a machine with gcc alone (python:slim plus `apt-get install gcc`, the fix the
    doctor itself gave), while the doctor said nothing; on a GPU Triton never tries a bare cc."""
    _programs(tmp_path, *names)
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    assert ("env.no_c_compiler" not in by_id(environment_checks(device))) == found
    monkeypatch.setenv("CXX", "no-such-c++")
    if device == "cpu":
        f = by_id(environment_checks("cpu"))["env.no_c_compiler"]
        assert "C++ compiler" in f["title"] and "CXX='no-such-c++' names no program" in f["detail"]


def test_cuda_launch_blocking_names_the_value_and_the_fix(monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    f = by_id(environment_checks("cpu"))["env.cuda_launch_blocking"]
    assert f["title"] == "CUDA_LAUNCH_BLOCKING=1" and f["fix"] == "unset CUDA_LAUNCH_BLOCKING"


@pytest.mark.parametrize("dtype,precision", [(None, "highest"), (torch.float32, "high"), (torch.float32, "medium")])
def test_matmul_precision_is_a_note_without_a_float32_model_or_with_tf32(monkeypatch, dtype, precision):
    """The warning needs all three: a GPU, a float32 model and 'highest'. The environment-only doctor (no model,
    so no dtype) and a float32 model already on TF32 ('high', 'medium') get the info note with the precision named."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", lambda args: None)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)
    f = by_id(environment_checks("cuda", dtype))["env.matmul_precision"]
    assert f["severity"] == "info" and f["title"] == f"float32 matmul precision: {precision}"
    assert f["detail"].startswith(f"torch.get_float32_matmul_precision() = {precision!r}, "
                                  f"backends.cuda.matmul.allow_tf32 = {bool(torch.backends.cuda.matmul.allow_tf32)}")


def test_matmul_precision_detail_reports_allow_tf32_as_set():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    try:  # not monkeypatch: allow_tf32 is a property of torch's module object, which setattr's undo cannot restore
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            detail = by_id(environment_checks("cpu"))["env.matmul_precision"]["detail"]
            assert f"backends.cuda.matmul.allow_tf32 = {allowed}" in detail
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def test_environment_variables_are_listed_sorted_by_name(monkeypatch, tmp_path):
    """The list is sorted by name, not in the order timing.ENV_VARS happens to name them (TRITON_CACHE_DIR there
    comes before the CUBLAS prefix)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "32768")
    detail = by_id(environment_checks("cpu"))["env.variables"]["detail"]
    names = [item.split("=")[0] for item in detail.split(", ")]
    assert names == sorted(names) and {"TRITON_CACHE_DIR", "CUBLASLT_WORKSPACE_SIZE"} <= set(names)


def test_cache_size_does_not_follow_symlinks(tmp_path):
    """A link inside a cache (to itself, or to a folder elsewhere) is not walked: no loop, no double count."""
    cache = tmp_path / "cache"
    (cache / "k").mkdir(parents=True)
    (cache / "k" / "a.cubin").write_bytes(b"x" * 1000)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big").write_bytes(b"x" * 5000)
    (cache / "loop").symlink_to(cache)
    (cache / "other").symlink_to(elsewhere)
    (cache / "file_link").symlink_to(elsewhere / "big")
    assert doctor_mod._dir_bytes(str(cache)) == (1000, False)


def test_cache_folders_are_where_torch_puts_them_for_an_empty_or_relative_variable(monkeypatch, tmp_path):
    """TORCHINDUCTOR_CACHE_DIR="" (a script's `=$UNSET`) is not unset to torch: it caches in the current folder,
    as it does for a relative name, which it makes absolute; Triton does the same with TRITON_CACHE_DIR. The doctor
    reported inductor's default folder (its size, and the temporary-directory advice for /tmp/torchinductor_<user>,
    where nothing was written) and '' for Triton; a relative name as given."""
    import os

    monkeypatch.chdir(tmp_path)
    for value in ("", "relative/inductor"):
        monkeypatch.setenv("TRITON_CACHE_DIR", value)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", value)
        dirs = doctor_mod.compile_cache_dirs()
        # Triton joins the name to the current folder when it writes, and so does torch 2.13's cache_dir() (not
        # called here: torch 2.11's raises FileNotFoundError for "", which the finding below warns about)
        expected = os.path.join(os.getcwd(), value) if value else os.getcwd()
        assert dirs == {"triton": expected, "inductor": expected}
        f = by_id(environment_checks("cpu"))["env.compile_cache"]
        if value:
            assert f["severity"] == "info"
        else:
            assert f["severity"] == "warning" and f["title"] == "TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR set but empty"
            assert "torch 2.11's inductor fails when it is first imported" in f["detail"]
            assert f["fix"] == "unset TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR, or name a folder (--compile-cache DIR)"
    monkeypatch.setenv("TRITON_CACHE_DIR", "t")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    assert by_id(environment_checks("cpu"))["env.compile_cache"]["title"] == "TORCHINDUCTOR_CACHE_DIR set but empty"


def test_one_cache_in_a_temporary_directory_is_enough_for_the_advice(monkeypatch, tmp_path):
    """/tmp counts as temporary even where tempfile's directory is elsewhere; one volatile cache of the two is
    enough for the --compile-cache advice."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", "/vlaperf-test-scratch")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/vlaperf-test-cache/triton")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "vlaperf-test" / "inductor"))
    f = by_id(environment_checks("cpu"))["env.compile_cache"]
    assert f["title"] == "compile caches (in a temporary directory)" and "--compile-cache DIR" in f["fix"]


def _smi(gpu_rows, apps="", fails=()):
    """A fake nvidia-smi: the --query-gpu answer (None for any query naming a field in `fails`), the apps list."""
    def fake(args):
        q = args[0]
        if any(field in q for field in fails):
            return None
        if q.startswith("--query-compute-apps"):
            return apps
        if q.startswith("--query-gpu=uuid"):
            return gpu_rows
        return None
    return fake


ROW = "GPU-aaaa-1, 0, NVIDIA H200, 1755, 1980, 3201, 3201, 83, 650.1, 700.0, {}"


def test_gpu_checks_are_for_cuda_runs_only(monkeypatch):
    """A CPU run reports neither the GPU's tenants nor its clocks, however busy nvidia-smi says it is."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format("0x40"), "GPU-aaaa-1, 4242, python3, 30000"))
    found = by_id(environment_checks("cpu"))
    assert not {"env.gpu_processes", "env.gpu_clocks"} & set(found)


@pytest.mark.parametrize("fails", ["clocks_throttle_reasons", "clocks_event_reasons"])
def test_clocks_are_read_with_either_name_of_the_reasons_field(monkeypatch, fails):
    """nvidia-smi renamed clocks_throttle_reasons to clocks_event_reasons; whichever one this version knows answers."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format("0x40"), fails=(fails,)))
    clocks = [f for f in doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1") if f["id"] == "env.gpu_clocks"]
    assert [f["title"] for f in clocks] == ["GPU 0 is throttled: hardware thermal slowdown"]


def test_clock_finding_detail_and_every_bad_reason_named(monkeypatch):
    """The detail carries each field in its place; several bad reasons at once are all named, in bit order."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format("0x0000000000000048")))
    (f,) = [f for f in doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1") if f["id"] == "env.gpu_clocks"]
    assert f["severity"] == "warning"
    assert f["title"] == "GPU 0 is throttled: hardware slowdown, hardware thermal slowdown"
    assert f["detail"].startswith("GPU 0 NVIDIA H200: SM 1755/1980 MHz, memory 3201/3201 MHz, 83 C, 650.1/700.0 W, "
                                  "throttle reasons 0x0000000000000048")


@pytest.mark.parametrize("reasons", ["0x0000000000000001", "0x0000000000000004", "0x0000000000000005", "[N/A]"])
def test_idle_power_cap_or_unreadable_reasons_are_not_throttling(monkeypatch, reasons):
    """Idle (0x1) and the software power cap (0x4, a GPU at its power limit under load) are not heat or hardware
    slowdowns; a field nvidia-smi cannot fill is no evidence of one either."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format(reasons)))
    (f,) = [f for f in doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1") if f["id"] == "env.gpu_clocks"]
    assert f["severity"] == "info" and f["title"] == "GPU 0 clocks" and f["fix"] is None


def test_gpu_processes_unknown_or_unreadable_rows(monkeypatch):
    """No nvidia-smi answer for the apps: an info that tenants cannot be ruled out (never a warning or silence);
    a row whose pid nvidia-smi cannot show ("[N/A]") is skipped, not a crash."""
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format("0x0"), apps=None))
    f = by_id(doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1"))["env.gpu_processes"]
    assert f["severity"] == "info" and f["title"] == "could not list GPU processes"
    apps = "GPU-aaaa-1, [N/A], python3, 30000\nGPU-aaaa-1, 4242, tool, 10"
    monkeypatch.setattr(doctor_mod, "nvidia_smi", _smi(ROW.format("0x0"), apps=apps))
    f = by_id(doctor_mod._gpu_checks(torch.device("cuda"), uuid="aaaa-1"))["env.gpu_processes"]
    assert f["title"] == "1 other process(es) on the GPU" and f["detail"].startswith("pid 4242 tool (10 MiB). ")


def test_versions_name_the_torch_threads():
    assert f"{torch.get_num_threads()} CPU threads" in by_id(environment_checks("cpu"))["env.versions"]["detail"]


def _sites(n, code="x = int(t.item())"):
    return [{"per_call": 1, "location": f"policy.py:{i}", "op": "Tensor.item", "code": code} for i in range(n)]


def test_host_sync_cost_is_the_measured_round_trip_times_the_syncs(monkeypatch):
    """On a device: cost = syncs per call x one measured round trip, the note saying so; --no-measure does not
    measure (the round trip is not even timed). The detail lists the first five sites."""
    from vlaperf.profile import syncs
    from vlaperf.profile.doctor import model_checks

    timed = []
    monkeypatch.setattr(syncs, "measure_sync_cost_ms", lambda device: timed.append(device) or 0.25)
    monkeypatch.setattr(syncs, "count_syncs", lambda fn, **kw: {"per_call": 6, "sites": _sites(6), "note": None})
    model = build_model("tiny")
    f = by_id(model_checks(model, workload="tiny", measure=True))["model.host_syncs"]
    assert f["cost"] == pytest.approx(1.5) and f["cost_note"].startswith("estimate: 6 syncs x 0.2500 ms measured round trip")
    assert f["detail"].count("Tensor.item") == 5 and "policy.py:4 " in f["detail"] and "policy.py:5 " not in f["detail"]
    timed.clear()
    f = by_id(model_checks(model, workload="tiny", measure=False))["model.host_syncs"]
    assert not timed and f["cost"] is None


def test_a_sync_in_a_while_loop_gets_for_loop_only_where_the_path_lacks_it(monkeypatch):
    from vlaperf.profile import syncs
    from vlaperf.profile.doctor import model_checks

    monkeypatch.setattr(syncs, "count_syncs", lambda fn, **kw: {
        "per_call": 1, "sites": _sites(1, "while time >= -dt / 2:"), "note": None})
    model = build_model("tiny")
    assert by_id(model_checks(model, workload="tiny", measure=False))["model.host_syncs"]["fix"].startswith("lever for_loop")
    f = by_id(model_checks(model, Engine(model, "for_loop"), workload="tiny", measure=False))["model.host_syncs"]
    assert f["fix"].startswith("remove the host reads at the listed lines")


def test_masked_images_finding_names_every_slot_and_warns():
    import dataclasses

    from vlaperf.profile.doctor import model_checks

    w = dataclasses.replace(get_workload("tiny"), image_valid=(True, False, False))
    f = by_id(model_checks(build_model("tiny"), workload=w, measure=False))["model.masked_images_embedded"]
    assert f["severity"] == "warning" and f["title"] == "2 masked image slot(s) embedded anyway (slot 1, 2)"
    assert f["cost"] is None and f["cost_note"] is None


@pytest.mark.parametrize("prompt_slots,valid,expected", [
    (32, 28, "warning"),  # 4 of 32 + 3 x 16 = 80 prefix tokens: exactly 5%
    (32, 29, "info"),  # 3 / 80 = 3.75%
    (16, 16, None),  # no padding: no finding
])
def test_padded_prompt_severity_boundary(prompt_slots, valid, expected):
    """The padded-prompt finding warns from 5% of the prefix on (>=), is a note below, and is absent without padding;
    --no-measure leaves it unmeasured."""
    import dataclasses

    from vlaperf.profile.doctor import model_checks

    model = build_model("tiny")
    w = dataclasses.replace(get_workload("tiny"), prompt_slots=prompt_slots, prompt_valid=(valid,))
    assert prompt_slots + model.config.vision.num_patches * len(w.image_valid) == (80 if prompt_slots == 32 else 64)
    f = by_id(model_checks(model, workload=w, measure=False)).get("model.padded_prompt")
    assert (f and f["severity"]) == expected
    if f:
        assert f["cost"] is None and f["cost_note"] is None


def test_no_launch_overhead_finding_on_the_cpu():
    """Launch overhead (and the float32-on-GPU warning) are GPU findings."""
    found = by_id(doctor(build_model("tiny", dtype=torch.float32), workload="tiny", measure=False))
    assert not {"model.launch_overhead", "model.fp32_on_gpu"} & set(found)


def test_world_action_checks_severities_sparsity_and_what_the_exact_levers_remove(monkeypatch):
    """wam-tiny on the CPU: frame sparsity without a CUDA graph warns; a video finished one step before the end
    wastes 0 forwards (a note); eager attention and unfused projections are notes on the CPU, and no launch
    overhead is claimed there. The exact levers remove every finding they name as their fix."""
    import dataclasses

    from vlaperf.engine.wam import WamEngine
    from vlaperf.models.wam import build_wam
    from vlaperf.workloads import get_wam_workload

    model, w = build_wam("wam-tiny", seed=0), get_wam_workload("wam-tiny")
    found = by_id(doctor(model, workload=dataclasses.replace(w, sparsity="drop_middle", video_steps=3), measure=False))
    sparse = found["wam.sparsity_host_bound"]
    assert sparse["severity"] == "warning" and "(drop_middle)" in sparse["title"] and sparse["fix"].startswith("lever cuda_graph")
    video = found["wam.finished_video_recomputed"]
    assert video["severity"] == "info" and video["title"] == "the finished video recomputed in 0 forwards"
    assert found["wam.eager_attention"]["severity"] == found["wam.unfused_projections"]["severity"] == "info"
    assert found["wam.scheduler_on_device"]["fix"] == "lever host_schedule"
    assert "wam.launch_overhead" not in found and "wam.fp32_on_gpu" not in found
    # a CUDA graph (an engine with the lever: only on a GPU, so its levers stand in here) takes the warning away
    from types import SimpleNamespace

    from vlaperf.engine.wam import WamLevers

    graph = SimpleNamespace(name="graph", model=model, generate=model.generate,
                            levers=WamLevers(cuda_graph=True, host_schedule=True, cached_keep_index=True))
    found = by_id(doctor_mod.wam_model_checks(model, graph, dataclasses.replace(w, sparsity="drop_middle"), measure=False))
    assert "wam.sparsity_host_bound" not in found and "wam.scheduler_on_device" not in found
    exact = by_id(doctor(engine=WamEngine(model, "exact"), workload=w, measure=False))
    assert not {"wam.context_kv_per_step", "wam.finished_video_recomputed", "wam.scheduler_on_device",
                "wam.eager_attention", "wam.unfused_projections"} & set(exact), sorted(exact)


def test_pdl_finding_without_a_readable_capability_and_the_forced_note_in_every_case(monkeypatch):
    """Where the compute capability cannot be read the finding says "unknown" and why; TORCHINDUCTOR_ENABLE_PDL
    set is noted whatever the rest says."""
    from vlaperf.engine import compile as compile_mod

    cuda = torch.device("cuda")

    def no_capability(device=None):
        raise RuntimeError("no CUDA runtime in this build")

    monkeypatch.setattr(torch.cuda, "get_device_capability", no_capability)
    f = doctor_mod._pdl_check(cuda)
    assert f["title"].endswith(": unknown") and f["severity"] == "info"
    assert f["detail"] == "could not read the GPU's compute capability: no CUDA runtime in this build"
    monkeypatch.setenv("TORCHINDUCTOR_ENABLE_PDL", "1")
    cases = [(no_capability, True, True), (lambda device=None: (8, 0), True, True),
             (lambda device=None: (9, 0), False, True), (lambda device=None: (9, 0), True, False),
             (lambda device=None: (9, 0), True, True)]
    for capability, has_pdl, switch in cases:
        monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
        monkeypatch.setattr(compile_mod, "inductor_has_pdl", lambda has_pdl=has_pdl: has_pdl)
        monkeypatch.setattr(compile_mod, "INDUCTOR_PDL", switch)
        f = doctor_mod._pdl_check(cuda)
        assert "; TORCHINDUCTOR_ENABLE_PDL is set: every compiled call gets it" in f["detail"], f["title"]


# ---- compile.py audited by mutation: compile_blockers, use_compile_cache and compile_fn's choices, called directly


@pytest.mark.parametrize("name, device", [("gcc", "cuda"), ("clang", "cuda"), ("g++", "cpu")])
def test_compile_blockers_ask_for_the_devices_compiler_for_inductor_only(monkeypatch, tmp_path, name, device):
    """The compile lever's own check (not the doctor's): with PATH empty inductor is blocked, naming the compiler it
    looks for on that device; another backend builds nothing and is not; gcc or clang (a GPU), g++ (the CPU) is
    enough, and gcc is not enough on the CPU."""
    from vlaperf.engine.compile import compile_blockers

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    for var in ("CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    none = {"cuda": "no C compiler (gcc/clang) on PATH: Triton cannot build its kernels' launchers",
            "cpu": "no C++ compiler (g++) on PATH: inductor cannot build its CPU kernels"}[device]
    assert compile_blockers("inductor", device) == [none] and compile_blockers("eager", device) == []
    _programs(tmp_path, "gcc" if device == "cpu" else "cc")
    assert compile_blockers("inductor", device) == [none]
    _programs(tmp_path, name)
    assert compile_blockers("inductor", device) == []


def test_compile_blockers_leave_an_unset_cache_and_another_backend_alone(monkeypatch, tmp_path):
    """TORCHINDUCTOR_CACHE_DIR unset is inductor's default, not an empty value; and a cache folder that cannot be
    made blocks inductor only (the eager backend never reads it). The reason names the variable, the path and the
    OS's words for the failure."""
    from vlaperf.engine.compile import compile_blockers, missing_compiler

    if missing_compiler():
        pytest.skip("this machine has no compiler inductor can use")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_blockers() == []
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "sub"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(bad))
    assert compile_blockers("eager") == []
    assert compile_blockers() == [f"TORCHINDUCTOR_CACHE_DIR={bad}: inductor cannot make its cache folder there "
                                  f"({os.strerror(errno.ENOTDIR)})"]


def test_use_compile_cache_expands_the_home_folder_and_names_a_folder_it_cannot_make(monkeypatch, tmp_path):
    """`--compile-cache ~/cache` is the user's home, not a folder named '~' in the current one; a path under a file
    is a ValueError naming the option, the path and why, and sets no variable."""
    from vlaperf.engine.compile import use_compile_cache

    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):  # restored after the test
        monkeypatch.setenv(var, "unset-by-test")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    env = use_compile_cache("~/cache")
    root = tmp_path / "home" / "cache"
    assert env == {"TRITON_CACHE_DIR": str(root / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
    assert all(os.environ[k] == v for k, v in env.items()) and not (tmp_path / "~").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError) as e:
        use_compile_cache(str(tmp_path / "afile" / "sub"))
    assert str(e.value) == f"--compile-cache: cannot create {tmp_path / 'afile' / 'sub'}: {os.strerror(errno.ENOTDIR)}"
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton")


def test_compile_fn_names_every_blocker_and_compiles_static_full_graphs(monkeypatch):
    """compile_fn refuses with all the reasons, joined (the user fixes them in one go); otherwise every backend gets
    fullgraph=True (a graph break is an error) and dynamic=False (the prompt buckets are static shapes), and the
    recompile limit is raised to 256 shapes, never lowered."""
    from vlaperf.engine import compile as C

    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    with pytest.raises(C.CompileUnavailable) as e:
        C.compile_fn(len, "default", backend="eager")
    assert str(e.value) == ("compile lever cannot apply: TORCHDYNAMO_DISABLE=1 disables torch.compile (it would run "
                            "eager, silently); TORCH_COMPILE_DISABLE=1 disables torch.compile (it would run eager, "
                            "silently)")
    monkeypatch.delenv("TORCHDYNAMO_DISABLE")
    monkeypatch.delenv("TORCH_COMPILE_DISABLE")
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    # set and restored by hand: monkeypatch's undo deletes an aliased dynamo config entry (cache_size_limit is an
    # alias of recompile_limit), which broke every later compile in the process
    config, saved = torch._dynamo.config, torch._dynamo.config.cache_size_limit
    try:
        config.cache_size_limit = 8
        C.compile_fn(len, "default", backend="eager")
        assert seen[-1] == {"backend": "eager", "fullgraph": True, "dynamic": False}
        assert config.cache_size_limit == 256
        config.cache_size_limit = 1000
        C.compile_fn(len, "default", backend="eager")
        assert config.cache_size_limit == 1000
    finally:
        config.cache_size_limit = saved
    # this machine's compiler aside
    monkeypatch.setattr(C, "compile_blockers", lambda backend="inductor", device_type=None: [])
    C.compile_fn(len, "max-autotune", pdl=False)
    assert seen[-1] == {"mode": "max-autotune", "fullgraph": True, "dynamic": False}
    monkeypatch.setattr(C, "inductor_has_pdl", lambda: True)
    C.compile_fn(len, "max-autotune", pdl=True)
    assert seen[-1] == {"options": {**torch._inductor.list_mode_options("max-autotune"), "triton.enable_pdl": True},
                        "fullgraph": True, "dynamic": False}


@pytest.mark.parametrize("power,title,fix", [
    (None, "CPU frequency governor and idle states: not readable here", False),
    ({"frequency_governors": ["powersave"], "idle_governor": "menu", "idle_states": ["POLL", "C1", "C6"]},
     "CPU frequency governor powersave: cores may slow down between calls", True),
    ({"frequency_governors": ["performance"], "idle_governor": None, "idle_states": None},
     "CPU frequency governor performance", False),
    ({"frequency_governors": None, "idle_governor": "haltpoll", "idle_states": ["POLL"]},
     "CPU frequency governor not exposed", True),
])
def test_cpu_power_is_reported_with_how_to_measure_its_cost(monkeypatch, power, title, fix):
    """The governors and idle states as info, never an error: what a control loop's wait costs is measured with
    bench --idle-ms, and the fix (a performance governor, fewer deep idle states) comes only where one applies."""
    monkeypatch.setattr(doctor_mod, "cpu_power", lambda: power)
    f = by_id(environment_checks("cpu"))["env.cpu_power"]
    assert f["severity"] == "info" and f["title"] == title
    assert "--idle-ms" in f["detail"] and "--idle-spin" in f["detail"] and "idle_decay_probe.py" in f["detail"]
    assert "vlaperf serve --keep-warm-ms" in f["detail"]  # what a server can do about it whatever the governor
    assert "rollout --client-keep-warm-ms" in f["detail"]  # and the client, for the request's way there
    # a table cell, not the lab notes: it named four development sessions in 30 lines of a 120-column terminal
    assert "session" not in f["detail"] and len(f["detail"]) < 800, f["detail"]
    assert (f["fix"] is not None) == fix
    if fix:  # the clock's fix is offered only for a cost that spinning takes away
        assert "--idle-spin takes the cost away" in f["fix"] and "cpupower" in f["fix"]
    if power and power["idle_states"]:
        assert "idle states enabled: " + ", ".join(power["idle_states"]) in f["detail"]


@pytest.mark.parametrize("load, cpus, severity", [(0.4, 2, "info"), (1.9, 2, "info"), (2.0, 2, "warning"),
                                                  (9.0, 16, "warning"), (8.9, 16, "info")])
def test_a_busy_host_is_a_warning_before_anything_is_measured(monkeypatch, load, cpus, severity):
    """Other processes keeping half the CPUs or more busy (the load average less this process's own 1) make host-bound
    timings and doctor's own measured costs read high: a warning that says so, with what to do."""
    monkeypatch.setattr(doctor_mod.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(doctor_mod.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    f = by_id(environment_checks("cpu"))["env.host_load"]
    assert f["severity"] == severity and f"1-minute load average {load:.2f} on {cpus} CPUs" in f["title"]
    assert (f["fix"] is not None) == (severity == "warning")
    if severity == "warning":
        assert f"other processes keep about {load - 1:.1f} of the CPUs busy" in f["detail"]
    monkeypatch.setattr(doctor_mod.os, "getloadavg", lambda: (_ for _ in ()).throw(OSError("no load average")))
    assert "env.host_load" not in by_id(environment_checks("cpu"))
