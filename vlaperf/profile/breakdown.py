"""Where one policy call spends its time: per-stage median / p95.

    result = breakdown(model, "libero-pi0")                          # the reference path
    result = breakdown(model, "libero-pi0", levers="for_loop,sdpa")   # an engine variant
    result = breakdown(model, "libero-pi0", mode="policy")           # + transform, copies
    result = breakdown_fn(lambda rec: my_policy(obs, rec), device="cuda")   # any policy

Reference path. `Pi0Model.sample_actions` has no hooks, so `reference_sample_staged` runs
the same call sequence step by step through the model's own public functions, with a
boundary mark between stages (CUDA events on a GPU: no sync is added):

    image_<s>_embed      model.embed_image on slot s (masked slots too, as the reference does)
    lang_embed           backbone.embed_tokens(tokens) * sqrt(width)
    prefix_concat        torch.cat of the embeddings and of the pad masks, zero att mask
    mask_position_build  make_attention_mask_2d + positions + rope_cos_sin. In the model API
                         these are the first lines of `Pi0Model.prefill`; the breakdown
                         calls the same module functions prefill calls (make_attention_mask_2d,
                         rope_cos_sin, joint_layer), in the same order, so the mask/position
                         build is timed on its own instead of hidden inside prefix_prefill.
    prefix_prefill       joint_layer per backbone layer -> the KV cache
    loop_setup           dt / time / x_t tensors and the loop's first `while` read
    denoise_step_<i>     model.denoise_step + the Euler update, and the `while` read that
                         follows it. The loop is kept as the reference writes it,
                         `while time >= -dt / 2` on a device tensor, so on CUDA every step
                         still ends in a host sync (N + 1 per call): the breakdown measures
                         the path users run, syncs included. Reported together as
                         denoise_step: per-call total, mean and max per step, per-step medians.
    output               the final x_t handed back (nothing but the return in model mode)

Every result records whether the staged sequence reproduced the untimed call's output
exactly (`matches_reference`); the tests assert it bit for bit in float32.

Engine variants are broken down as requested, levers and all: `Engine.stage_hook` marks
embed_prefix, prefill, denoise_step_<i> (and "setup": checks, planning and input copies
before the prefix). Under compile the marks fall between compiled functions, never inside one;
where compile makes the whole prefix one function (compile without compile_layers) it is one
stage, "prefix". Under cuda_graph nothing runs on the host during the call, so the engine
replays a second capture of the same call that holds a timing-event node at each boundary
(engine/graphs.py); the events that replay recorded are handed to the recorder after it. The
untimed call replays the graph without them, so the honesty check below also bounds what the
event nodes cost.

Policy mode adds the stages of `vlaperf.policy.Policy.infer`: input_transform (validate,
tokenize, pad the state on the host), host_to_device (raw uint8 images, masks, tokens and
state), image_preprocess (resize with pad and normalise, on the device as vlaperf's
transform does), the model stages, device_to_host (.cpu().numpy() of the whole chunk, unpad,
the finite check).

Honesty check: the stage times of a call add up to the call's instrumented span ("(unmarked)"
holds what no stage covers), and that span is compared with the median of the same call run
without any marks, timed separately by `vlaperf.timing.time_calls`. The result states it:
"stages sum to X% of the untimed call".
"""

from __future__ import annotations

import gc
import math
import re
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

import numpy as np
import torch

from vlaperf.inputs import (
    Observation,
    ObservationTransform,
    random_noise,
    random_observation,
)
from vlaperf.models.pi0 import (Pi0Model, check_num_steps, check_sample_inputs, joint_layer, make_attention_mask_2d,
                               rope_cos_sin)
from vlaperf.policy import finite_actions
from vlaperf.profile.markers import END, NULL_RECORDER, UNMARKED, CallRecord, StageRecorder
from vlaperf.timing import Timer, summarize, synchronize, time_calls, wait_idle
from vlaperf.workloads import WORKLOADS, Workload, get_workload

_STEP = re.compile(r"^(.*denoise_step)_(\d+)$")

# the staged call's median over the untimed call's within which the stages read as the call's own times; outside it
# the statement says so (a 2-core machine under load gave 372%)
COVERAGE_FAIR = (0.8, 1.25)


def _noop(name: str, token=None) -> None:
    return None


# ----------------------------------------------------------------- staged reference


@torch.no_grad()
def reference_sample_staged(model: Pi0Model, obs: Observation, noise: torch.Tensor | None = None,
                            num_steps: int = 10, mark: Callable[[str], None] = _noop) -> torch.Tensor:
    """`model.sample_actions(obs, noise, num_steps)` with a `mark(stage)` call between its
    stages (see the module docstring). Same operations, same order, same result; the same checks of its
    arguments first (a negative num_steps would make the loop below run forever)."""
    cfg = model.config
    check_sample_inputs(cfg, obs, noise, num_steps, model.action_in_proj.weight.device)
    B = obs.state.shape[0]
    device = obs.state.device
    if noise is None:
        noise = torch.randn(B, cfg.action_horizon, cfg.action_dim, device=device)
    # embed_prefix, slot by slot
    embs, pads = [], []
    for s in range(obs.images.shape[1]):
        mark(f"image_{s}_embed")
        img = model.embed_image(obs.images[:, s])
        embs.append(img)
        pads.append(obs.image_mask[:, s, None].expand(B, img.shape[1]))
    mark("lang_embed")
    lang = model.backbone.embed_tokens(obs.tokens)
    embs.append(lang * math.sqrt(lang.shape[-1]))
    pads.append(obs.token_mask)
    mark("prefix_concat")
    prefix = torch.cat(embs, dim=1)
    pad = torch.cat(pads, dim=1)
    att = torch.zeros_like(pad)
    # prefill, split into its mask/position build and the layers
    mark("mask_position_build")
    mask = make_attention_mask_2d(pad, att)
    positions = torch.cumsum(pad.long(), dim=1) - 1
    cos, sin = rope_cos_sin(positions, cfg.backbone.head_dim, cfg.backbone.rope_base, prefix.dtype)
    mark("prefix_prefill")
    cache = []
    x = prefix
    for layer in model.backbone.layers:
        (x, _), kv = joint_layer([layer, None], [x, None], cos, sin, mask, [None, None])
        cache.append(kv)
    # the reference loop: a while on a device tensor (a host read per check)
    mark("loop_setup")
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=device)
    x_t = noise.float()
    time = torch.tensor(1.0, dtype=torch.float32, device=device)
    i = 0
    while time >= -dt / 2:
        mark(f"denoise_step_{i}")
        v_t = model.denoise_step(obs.state, pad, cache, x_t, time.expand(B))
        x_t = x_t + dt * v_t
        time = time + dt
        i += 1
    mark("output")
    return x_t


def engine_sample_staged(engine) -> Callable:
    """(obs, noise, num_steps, mark) -> actions through `engine` with its stage hook set."""

    def sample(obs, noise, num_steps, mark=_noop):
        mark("setup")
        engine.stage_hook = mark
        try:
            out = engine.sample_actions(obs, noise, num_steps)
        finally:
            engine.stage_hook = None
        for name, event in engine.last_stage_events:  # a graph replay's boundaries, recorded by the graph
            mark(name, token=event)
        return out

    return sample


# ----------------------------------------------------------------- staged policy


class StagedPolicy:
    """`Policy.infer` split into marked stages (same transform, same sample, same output)."""

    def __init__(self, model: Pi0Model, sample_staged: Callable, workload: Workload, num_steps: int,
                 noise: torch.Tensor | None = None, tokenizer=None):
        self.model, self.sample, self.workload = model, sample_staged, workload
        self.device = model.action_in_proj.weight.device
        self.transform = ObservationTransform(workload, model.config, tokenizer, self.device)
        self.num_steps, self.noise = num_steps, noise

    @torch.no_grad()
    def __call__(self, example, mark: Callable[[str], None] = _noop) -> np.ndarray:
        t = self.transform
        mark("input_transform")
        host = t.host_arrays(example)
        mark("host_to_device")
        uploaded = t.upload(host)
        mark("image_preprocess")
        obs = t.preprocess(uploaded)
        noise = self.noise if self.noise is not None and self.noise.shape[0] == obs.batch else None
        actions = self.sample(obs, noise, self.num_steps, mark)
        mark("device_to_host")
        # as Policy.infer: the whole (contiguous) chunk to the host, then the robot's dims, then its finite check.
        # Slicing on the device first timed a copy kernel the served call does not run.
        out = finite_actions(actions.cpu().numpy()[..., : self.workload.robot_action_dim].astype(np.float32))
        if isinstance(example, dict):
            out = out[0]
        mark(END)
        return out


# ----------------------------------------------------------------- statistics


def _group(name: str) -> tuple[str, int | None]:
    m = _STEP.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def stage_stats(calls: list[CallRecord]) -> dict[str, Any]:
    """Per-stage statistics over calls. Stages named <x>denoise_step_<i> are grouped into one
    <x>denoise_step entry; any stage that occurs more than once per call gets per-occurrence
    mean/max (median over calls) besides its per-call total."""
    if not calls:
        raise ValueError("stage_stats: no calls recorded")
    order: list[str] = []
    per_call: list[dict[str, list[tuple[int | None, float]]]] = []
    nested: dict[str, list[float]] = {}
    for rec in calls:
        occ: dict[str, list[tuple[int | None, float]]] = {}
        inner: dict[str, float] = {}
        for name, depth, ms in rec.stages:
            if depth != 0:
                inner[name] = inner.get(name, 0.0) + ms
                continue
            g, idx = _group(name)
            occ.setdefault(g, []).append((idx, ms))
            if g not in order:
                order.append(g)
        per_call.append(occ)
        for name, total in inner.items():
            nested.setdefault(name, []).append(total)
    if UNMARKED in order:
        order.remove(UNMARKED)
        order.append(UNMARKED)
    span = summarize([rec.span_ms for rec in calls])
    stages = []
    for g in order:
        totals = [sum(ms for _, ms in occ.get(g, [])) for occ in per_call]
        s = summarize(totals)
        counts = [len(occ.get(g, [])) for occ in per_call]
        entry: dict[str, Any] = {
            "name": g, "per_call": max(counts), "median_ms": s["median"], "p95_ms": s["p95"], "mean_ms": s["mean"],
            "min_ms": s["min"], "max_ms": s["max"], "share": s["median"] / span["median"] if span["median"] > 0 else None,
        }
        if max(counts) > 1:
            means = [float(np.mean([ms for _, ms in occ[g]])) for occ in per_call if occ.get(g)]
            maxes = [max(ms for _, ms in occ[g]) for occ in per_call if occ.get(g)]
            entry["occurrence"] = {
                "mean_ms": summarize(means)["median"], "mean_p95_ms": summarize(means)["p95"],
                "max_ms": summarize(maxes)["median"], "max_p95_ms": summarize(maxes)["p95"],
            }
            indexed = [[ms for idx, ms in occ.get(g, []) if idx is not None] for occ in per_call]
            if any(indexed):
                n = max(len(x) for x in indexed)
                entry["occurrence"]["by_index_median_ms"] = [
                    summarize([x[i] for x in indexed if len(x) > i])["median"] for i in range(n)
                ]
        stages.append(entry)
    sub = [{"name": n, "median_ms": summarize(v)["median"], "p95_ms": summarize(v)["p95"]} for n, v in nested.items() if v]
    return {"stages": stages, "substages": sub, "span_ms": span,
            "stage_sum_of_medians_ms": float(sum(e["median_ms"] for e in stages))}


# ----------------------------------------------------------------- BYO breakdown


def _merge_timings(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """time_calls results of consecutive blocks of the same function -> one result."""
    wall = [x for p in parts for x in p["samples"]["wall_ms"]]
    events = [x for p in parts for x in (p["samples"]["cuda_event_ms"] or [])]
    peaks = [p["peak_memory_bytes"] for p in parts if p["peak_memory_bytes"] is not None]
    return {
        "timers": {"cuda_event_ms": summarize(events) if events else None, "wall_ms": summarize(wall)},
        "samples": {"cuda_event_ms": events or None, "wall_ms": wall},
        "first_call_s": parts[0]["first_call_s"], "warmup_s": parts[0]["warmup_s"], "warmup": parts[0]["warmup"],
        "iters": len(wall), "peak_memory_bytes": max(peaks) if peaks else None,
    }


def breakdown_fn(call: Callable[[Any], Any], *, device: torch.device | str = "cpu", warmup: int = 3, iters: int = 20,
                 untimed: Callable[[], Any] | None = None, recorder: StageRecorder | None = None,
                 progress: bool = False, label: str = "", blocks: int | None = None,
                 idle_ms: float = 0.0, idle_spin: bool = False, first_call_s: float | None = None) -> dict[str, Any]:
    """Break down any policy call. `call(rec)` runs one call and marks its stages on `rec`
    (rec.mark / rec.stage, or the module-level markers: `rec` is active while it runs).
    `untimed()` is the same call without marks (default: `call(NULL_RECORDER)` with no
    recorder active), timed separately with time_calls for the coverage statement; the
    instrumented and untimed calls alternate in `blocks` blocks of iters / blocks calls (default:
    one call each, in turn). `idle_ms`: each measured call (instrumented or untimed, not the
    warm-up) follows that long an idle, the host asleep and the device synchronized, as a
    control loop calls its policy: which stages go cold between calls; `idle_spin`: spinning on
    the clock instead (timing.wait_idle).

    First call: what a policy does once (compile, capture, lazy set-up) lands in whichever call comes first, so the
    first call made here is the untimed one, timed alone as the result's first_call_s (as bench's), unless the
    caller made and timed it already (`first_call_s`: `breakdown`'s check). The instrumented call then warms up
    `warmup` times, at least once: its own first call (a graph's timed capture) is never a stage sample."""
    from vlaperf.timing import _check_counts

    _check_counts("breakdown_fn", warmup, iters)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"breakdown_fn: device {device} but this torch has no CUDA device (use device='cpu')")
    rec = recorder or StageRecorder(device)
    untimed = untimed or (lambda: call(NULL_RECORDER))
    if first_call_s is None:
        # Made after the instrumented warm-up, the untimed path's first call found the work done and read as warm
        first_call_s = Timer(device).wall_s(untimed)

    def one(idle: float = 0.0):
        synchronize(device)
        wait_idle(idle, idle_spin)
        with rec.activate(), rec.call():
            call(rec)

    for _ in range(max(warmup, 1)):  # with warmup=0 the instrumented first call was a stage sample
        one()
    rec.clear()
    # Instrumented and untimed calls alternate, by default call by call, so drift (clocks, other
    # tenants) hits both alike: in blocks of 3 calls, a CI run that shared its 2 CPUs with another
    # test run once had the untimed median 66% above the instrumented one. The untimed calls are
    # timed by time_calls.
    blocks = iters if blocks is None else max(1, min(blocks, iters))
    sizes = [iters // blocks + (1 if b < iters % blocks else 0) for b in range(blocks)]
    parts = []
    gc.collect()  # once, here: time_calls' own collection before each one-call block made short calls ~0.2 ms slower
    for b, n in enumerate(sizes):
        for _ in range(n):
            one(idle_ms)
        parts.append(time_calls(untimed, device=device, warmup=max(warmup, 1) if b == 0 else 0, iters=n,
                                progress=progress and b == 0, label=f"untimed {label}".strip(), collect_garbage=False,
                                idle_ms=idle_ms, idle_spin=idle_spin, first_call_s=first_call_s if b == 0 else None))
    stats = stage_stats(rec.calls)
    timing = _merge_timings(parts)
    timer = rec.timer
    if timer == "cuda_event" and timing["timers"]["cuda_event_ms"] is not None:
        untimed_med, untimed_clock = timing["timers"]["cuda_event_ms"]["median"], "CUDA events"
    else:
        untimed_med, untimed_clock = timing["timers"]["wall_ms"]["median"], "wall clock"
    instrumented = stats["span_ms"]["median"]
    coverage = instrumented / untimed_med if untimed_med > 0 else None
    statement = (
        f"stages sum to {100 * coverage:.1f}% of the untimed call: instrumented call median {instrumented:.3f} ms "
        f"({'CUDA events' if timer == 'cuda_event' else 'perf_counter'}, {iters} calls) vs untimed median "
        f"{untimed_med:.3f} ms ({untimed_clock}, vlaperf.timing.time_calls, {iters} calls)"
        if coverage is not None else "untimed call took 0 ms: coverage undefined"
    )
    if coverage is not None and not COVERAGE_FAIR[0] <= coverage <= COVERAGE_FAIR[1]:
        statement += ("; far from 100%: the staged call is not the untimed one (the marks' own cost, a noisy "
                      "machine, or a call that differs): read the stages as shares of the staged call, and rerun "
                      "with more --iters on a quieter machine before taking their times as the call's")
    added = stats["stage_sum_of_medians_ms"] / instrumented if instrumented > 0 else None
    if added is not None and not COVERAGE_FAIR[0] <= added <= COVERAGE_FAIR[1]:
        # each stage's median is of its own calls: on a quiet machine they add up to the call's, on a noisy one not
        statement += (f"; the stages' medians add to {'only ' if added < 1 else ''}{100 * added:.1f}% of the staged "
                      "call's median (the share column's total), each being the median of its own calls: the calls "
                      "varied too much for their parts to add up, so rerun with more --iters on a quieter machine")
    return {
        # the warm-up calls made: 0 makes one, and the file said 0 beside the untimed timing's 1
        "timer": timer, "warmup": max(warmup, 1), "iters": iters, "idle_ms": idle_ms, "idle_spin": idle_spin, **stats,
        "untimed_median_ms": untimed_med, "untimed": timing, "coverage": coverage, "statement": statement,
    }


# ----------------------------------------------------------------- pi0 breakdown


def _workload(workload: Workload | str) -> tuple[Workload, Workload]:
    w = get_workload(workload) if isinstance(workload, str) else workload
    base = WORKLOADS.get(w.id, w)
    return base, w


def _same(a, b) -> dict[str, Any]:
    if isinstance(a, np.ndarray):
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    exact = bool(a.shape == b.shape and torch.equal(a, b))
    max_abs = float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")
    return {"exact": exact, "max_abs": max_abs}


@dataclass
class StagedCall:
    """One pi0 policy call, instrumented (`call(rec)`) and plain (`untimed()`)."""

    call: Callable[[Any], Any]
    untimed: Callable[[], Any]
    path: str  # "reference" | "engine"
    requested: Any  # the requested Levers
    engine: Any  # the Engine broken down (None on the reference path)
    images: list[dict[str, Any]]
    notes: list[str]
    steps: int
    base: Workload
    workload: Workload
    matches_reference: dict[str, Any] | None = None
    first_call_s: float | None = None  # the check's untimed call, the process's first of it (None: no check)


@torch.no_grad()
def prepare_breakdown(model: Pi0Model, workload: Workload | str, levers=None, mode: str = "model", *, seed: int = 0,
                      num_steps: int | None = None, check: bool = True) -> StagedCall:
    """Build the instrumented and plain calls of `breakdown` (also used by `vlaperf breakdown
    --trace`). With `check`, runs both once and records whether they agree exactly."""
    from vlaperf.engine import Engine
    from vlaperf.engine.levers import Levers
    from vlaperf.policy import Policy, example_request

    if mode not in ("model", "policy"):
        raise ValueError(f"mode must be 'model' or 'policy', got {mode!r}")
    device = model.action_in_proj.weight.device
    base, workload = _workload(workload)
    steps = check_num_steps(workload.steps if num_steps is None else num_steps)

    requested_engine = levers if isinstance(levers, Engine) else None
    requested = requested_engine.levers if requested_engine else Levers.parse(levers, device, model.dtype)
    notes: list[str] = []
    if requested == Levers():
        path, engine, untimed_sample = "reference", None, model.sample_actions
        staged = lambda obs, noise, n, mark=_noop: reference_sample_staged(model, obs, noise, n, mark)  # noqa: E731
        notes.append("reference path re-run step by step through the model's public functions (see "
                     "vlaperf.profile.breakdown); its while-on-tensor loop is kept, so each denoise_step "
                     "includes the host read of the loop condition that follows it")
    else:
        engine = requested_engine or Engine(model, requested)
        path, untimed_sample = "engine", engine.sample_actions
        staged = engine_sample_staged(engine)
        if engine.levers.cuda_graph:
            notes.append("stages timed inside the CUDA graph: a second capture of the call with a timing-event node at "
                         "each stage boundary; the untimed call replays the graph without them")
        if engine.levers.compile and not engine.levers.compile_layers:
            notes.append("compile makes the prefix one function, so it is one stage (prefix); with compile_layers it "
                         "is embed_prefix and prefill")

    obs = random_observation(workload, model.config, device, seed=seed)
    noise = random_noise(workload, model.config, device, seed=seed)
    valid = obs.host_image_valid or tuple(bool(v) for v in obs.image_mask.any(0).tolist())
    P = model.config.vision.num_patches
    images = [{"slot": s, "tokens": P, "valid": bool(valid[s]),
               "embedded": path == "reference" or not engine.levers.skip_masked_images or bool(valid[s])}
              for s in range(workload.image_slots)]

    if mode == "model":
        call = lambda rec: staged(obs, noise, steps, rec.mark)  # noqa: E731
        untimed = lambda: untimed_sample(obs, noise, steps)  # noqa: E731
        plain = lambda: staged(obs, noise, steps)  # noqa: E731
        reference = untimed
    else:
        # The same requests as `vlaperf bench --mode policy` (224 px camera images).
        request = example_request(workload, seed)
        sp = StagedPolicy(model, staged, workload, steps, noise)
        policy = Policy(model, untimed_sample, workload, num_steps=steps, noise=noise)
        call = lambda rec: sp(request, rec.mark)  # noqa: E731
        untimed = lambda: policy.infer(request)  # noqa: E731
        plain = lambda: sp(request)  # noqa: E731
        reference = lambda: policy.infer(request)["actions"]  # noqa: E731

    sc = StagedCall(call, untimed, path, requested, engine, images, notes, steps, base, workload)
    if check:
        # the untimed call first, timed alone: it is the process's first call of the path users run (compile,
        # capture), as bench's first_call_s is
        synchronize(device)
        start = perf_counter()
        expected = reference()
        synchronize(device)
        sc.first_call_s = perf_counter() - start
        sc.matches_reference = _same(plain(), expected)
        if not sc.matches_reference["exact"]:
            notes.append(f"the staged sequence does NOT reproduce the untimed call exactly (max abs diff "
                         f"{sc.matches_reference['max_abs']:.3g}): the breakdown may not describe the same computation")
    return sc


@torch.no_grad()
def breakdown(model: Pi0Model, workload: Workload | str, levers=None, mode: str = "model", warmup: int = 5,
              iters: int = 20, device: torch.device | str | None = None, *, seed: int = 0,
              num_steps: int | None = None, progress: bool = False, idle_ms: float = 0.0,
              idle_spin: bool = False) -> dict[str, Any]:
    """Median / p95 per stage of one pi0 policy call. Returns a vlaperf result
    (command "breakdown", schema vlaperf.result/1) with a "breakdown" section, and the
    untimed call's "timers"/"samples".

    levers: None / "reference" -> the reference path; a lever spec, a Levers or an Engine
    -> that engine variant, as requested (see the module docstring for cuda_graph and compile).
    """
    from vlaperf.cli import result_header
    from vlaperf.timing import environment_record

    model_device = model.action_in_proj.weight.device
    if device is not None and torch.device(device).type != model_device.type:
        raise ValueError(f"device {device} differs from the model's device {model_device}")
    device = model_device
    sc = prepare_breakdown(model, workload, levers, mode, seed=seed, num_steps=num_steps)
    requested, notes = sc.requested, sc.notes

    bd = breakdown_fn(sc.call, device=device, warmup=warmup, iters=iters, untimed=sc.untimed, progress=progress,
                      label=requested.label(), idle_ms=idle_ms, idle_spin=idle_spin, first_call_s=sc.first_call_s)
    for entry in bd["stages"]:
        m = re.match(r"^image_(\d+)_embed$", entry["name"])
        if m:
            entry["info"] = sc.images[int(m.group(1))]
    timed_names = [] if sc.engine is None else sc.engine.levers.names()
    result = result_header("breakdown", sc.base, sc.workload, model, environment_record(device), requested.names(),
                           requested.label(), mode)
    untimed_t = bd.pop("untimed")
    result["timers"] = untimed_t["timers"]
    result["samples"] = untimed_t["samples"]
    result.update({k: untimed_t[k] for k in ("first_call_s", "warmup_s", "warmup", "iters", "peak_memory_bytes")})
    result["breakdown"] = {
        "path": sc.path, "levers_timed": timed_names, "steps": sc.steps, "images": sc.images,
        "matches_reference": sc.matches_reference, "notes": notes, **bd,
    }
    return result


def format_breakdown(result: dict[str, Any]) -> str:
    """Plain-text table of a breakdown result (the CLI prints a rich table instead)."""
    bd = result["breakdown"]
    lines = [f"breakdown {result['workload']['id']} {result['variant']['label']} ({result['mode']} mode, {bd['timer']})"]
    for e in bd["stages"]:
        extra = ""
        if "occurrence" in e:
            o = e["occurrence"]
            extra = f"  x{e['per_call']}: mean {o['mean_ms']:.3f} max {o['max_ms']:.3f}"
        lines.append(f"  {e['name']:<24} {e['median_ms']:9.3f} ms  p95 {e['p95_ms']:9.3f}{extra}")
    lines.append("  " + bd["statement"])
    lines += ["  note: " + n for n in bd["notes"]]
    return "\n".join(lines)
