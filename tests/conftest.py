import os

import pytest
import torch

# Imported before any test runs: it binds vlaperf.cli.setup by name when first imported, and a test that stands in for
# setup (monkeypatch) must not be the one that imports it, or every later command in that process gets the stand-in.
import vlaperf.profile.commands  # noqa: F401
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.workloads import get_workload


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its share of the cores for torch's threads (and its subprocesses, through
    OMP_NUM_THREADS). Left at torch's default, 14 workers on a 16-core machine ran 14 x 16 threads: a 45 s report
    render passed 300 s there and timed out (docs/perf-notes.md, session 33). The README's serial run is unchanged."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and os.environ.get("PYTEST_XDIST_WORKER"):
        share = max(1, (os.cpu_count() or 1) // int(workers))
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


COMPILE_CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


@pytest.fixture(autouse=True)
def compile_caches_stay_put():
    """A test that points the compile caches somewhere (--compile-cache, use_compile_cache) must put them back: a
    folder left in os.environ sent every later compile of the process into a test's deleted tmp folder, and the next
    result file recorded it (a Ray replica test did this and a report test far away failed). What inductor sets
    itself where they were unset is not a test's doing: TORCHINDUCTOR_CACHE_DIR as its default when it first looks,
    and TRITON_CACHE_DIR as <that folder>/triton/<device> when it first loads a Triton kernel (on a GPU)."""
    before = {var: os.environ.get(var) for var in COMPILE_CACHE_VARS}
    yield
    changed = {var: (before[var], os.environ.get(var)) for var in COMPILE_CACHE_VARS if os.environ.get(var) != before[var]}
    if changed:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
        torch_made = {"TORCHINDUCTOR_CACHE_DIR": lambda v: v == default_cache_dir(),
                      "TRITON_CACHE_DIR": lambda v: os.path.dirname(v) == os.path.join(inductor, "triton")
                      and os.path.basename(v).isdigit()}
        changed = {var: (old, new) for var, (old, new) in changed.items()
                   if not (old is None and new is not None and torch_made[var](new))}
    for var, (value, _) in changed.items():  # put back, so one leak fails one test, not every later one
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    assert not changed, f"the test left compile-cache variables changed (before, after): {changed}"


@pytest.fixture(scope="session")
def tiny_workload():
    return get_workload("tiny")


@pytest.fixture(scope="session", params=[False, True], ids=["pi0", "pi05"])
def tiny_model(request):
    """The tiny preset in fp32 on the CPU, as pi0 and as pi0.5 (adaptive norms)."""
    torch.manual_seed(0)
    return build_model(get_config("tiny", pi05=request.param), "cpu", torch.float32, seed=0)


@pytest.fixture
def tiny_inputs(tiny_workload, tiny_model):
    cfg = tiny_model.config
    return random_observation(tiny_workload, cfg, seed=3), random_noise(tiny_workload, cfg, seed=3)
