import pytest
import torch

from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.workloads import get_workload


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
