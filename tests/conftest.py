import os

import pytest
import torch

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
