"""A user's own policy (not pi0) through the bring-your-own API: timed with time_calls, broken
down with stage markers, sync-checked, traced. This is the example of docs/profiling.md."""

from __future__ import annotations

import json

import torch
from torch import nn

from vlaperf.profile.breakdown import breakdown_fn
from vlaperf.profile.markers import UNMARKED, StageRecorder, mark, stage
from vlaperf.profile.syncs import count_syncs
from vlaperf.profile.trace import trace
from vlaperf.timing import time_calls


class ToyWorldActionPolicy(nn.Module):
    """Two stages: encode the observation once, then denoise action tokens for N steps.
    `early_stop` mimics a data-dependent check on the device (a host sync per step)."""

    def __init__(self, dim: int = 32, steps: int = 4, early_stop: bool = False):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.denoiser = nn.Sequential(nn.Linear(2 * dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.steps, self.early_stop = steps, early_stop

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        with stage("encode"):  # no-op unless a StageRecorder is active
            ctx = self.encoder(obs)
        x = torch.zeros_like(ctx)
        for i in range(self.steps):
            mark(f"denoise_step_{i}")
            x = x + 0.1 * self.denoiser(torch.cat([x, ctx], dim=-1))
            if self.early_stop and x.abs().max() > 1e6:  # a host read of device data
                break
        mark("end")
        return x


def test_byo_policy_is_timed_broken_down_and_sync_checked(tmp_path):
    torch.manual_seed(0)
    policy = ToyWorldActionPolicy().eval()
    obs = torch.randn(2, 32)

    # timed: the same timer every vlaperf number goes through
    t = time_calls(lambda: policy(obs), device="cpu", warmup=2, iters=5, progress=False)
    assert t["timers"]["wall_ms"]["count"] == 5

    # broken down: the markers inside forward() report to the active recorder
    bd = breakdown_fn(lambda rec: policy(obs), device="cpu", warmup=1, iters=5)
    names = [s["name"] for s in bd["stages"]]
    assert names == ["encode", "denoise_step", UNMARKED]
    steps = bd["stages"][1]
    assert steps["per_call"] == 4 and len(steps["occurrence"]["by_index_median_ms"]) == 4
    assert bd["coverage"] > 0 and "% of the untimed call" in bd["statement"]

    # sync-checked: clean policy has none, the early-stop variant reads once per step
    assert count_syncs(lambda: policy(obs), device="cpu")["total"] == 0
    leaky = ToyWorldActionPolicy(early_stop=True).eval()
    rep = count_syncs(lambda: leaky(obs), device="cpu", calls=2)
    assert rep["per_call"] == 4
    assert rep["sites"][0]["code"].startswith("if self.early_stop and x.abs().max() > 1e6")
    assert rep["sites"][0]["function"] == "forward"

    # traced: stage names show up as ranges in the Chrome trace
    rec = StageRecorder("cpu")

    def one():
        with rec.activate(), rec.call():
            policy(obs)

    info = trace(one, tmp_path / "toy.json", device="cpu")
    assert {"encode", "denoise_step_0", "denoise_step_3"} <= set(info["stages"])
    names_in_file = {e.get("name") for e in json.loads((tmp_path / "toy.json").read_text())["traceEvents"]}
    assert "encode" in names_in_file and "policy_call_0" in names_in_file


def test_explicit_recorder_argument_style():
    """The other BYO style: the policy takes a recorder (NULL_RECORDER by default)."""
    from vlaperf.profile.markers import NULL_RECORDER

    net = nn.Linear(8, 8)

    def policy(x, rec=NULL_RECORDER):
        with rec.stage("a"):
            y = net(x)
        rec.mark("b")
        y = net(y)
        rec.mark("end")
        return y

    x = torch.randn(1, 8)
    policy(x)  # runs without a profiler
    bd = breakdown_fn(lambda rec: policy(x, rec), warmup=1, iters=3, untimed=lambda: policy(x))
    assert [s["name"] for s in bd["stages"]] == ["a", "b", UNMARKED]


def test_a_breakdown_whose_stage_medians_do_not_add_up_says_so():
    """Each stage's median is of its own calls: where the calls vary (here the 20 ms moves between three stages from
    call to call) the medians stop adding up to the call's, and the statement says how far (the share column's total),
    instead of leaving shares that sum to ~0% unexplained."""
    import time

    calls = [0]

    def policy(rec):
        for i, name in enumerate(("a", "b", "c")):
            with rec.stage(name):
                if calls[0] % 3 == i:
                    time.sleep(0.02)
        calls[0] += 1

    bd = breakdown_fn(policy, warmup=1, iters=3, untimed=lambda: time.sleep(0.02))
    added = bd["stage_sum_of_medians_ms"] / bd["span_ms"]["median"]
    assert added < 0.1
    assert f"the stages' medians add to only {100 * added:.1f}% of the staged call's median" in bd["statement"]
    steady = breakdown_fn(lambda rec: time.sleep(0.02), warmup=1, iters=3, untimed=lambda: time.sleep(0.02))
    assert "medians add to" not in steady["statement"]
