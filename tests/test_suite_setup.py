"""The test suite's own setup (tests/conftest.py), checked where it applies."""
import os

import pytest
import torch


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="runs only under pytest-xdist (-n N)")
def test_each_xdist_worker_gets_its_share_of_the_cores():
    # 14 workers at torch's default thread count oversubscribed a 16-core machine until a 45 s test passed 300 s.
    share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    assert torch.get_num_threads() == share
    assert "OMP_NUM_THREADS" in os.environ  # ours, or one the caller set (setdefault keeps it)
