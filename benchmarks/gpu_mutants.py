"""Mutation audit of code that only runs on a GPU (CUDA graphs, the CUDA-event timer, the GPU's environment record):
the CPU test suite cannot reach it, so its mutants run here, on the GPU machine.

Each mutant is one exact text replacement in one file, a plausible bug (a dropped copy, a key that forgets a field,
a missing sync). The runner copies the package and the tests into a folder of its own per mutant, applies the
replacement there, runs the GPU tests with that folder first on PYTHONPATH, and records which test files failed.
`killed_before`: a test file other than the audit's new one failed (`--new` names it); `killed`: any failed.
Mutants run side by side (`--jobs`) on the one GPU; the unmutated tree runs first (it must pass, and it fills the
Triton cache the mutants then share).

Side by side, the mutants share the GPU by time slices, which moves what a timing check measures: a check that needs
the GPU to itself (the in-graph breakdown's coverage in test_profile_breakdown.py) can fail under any mutant. Read each
kill's `messages` before counting it (session 40: two such false kills in 24).

    python benchmarks/gpu_mutants.py --json $R/gpu_mutants.json --jobs 6
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TESTS = "tests/test_cuda_measurement.py"
TESTS = [NEW_TESTS, "tests/test_engine_cuda.py", "tests/test_profile_breakdown.py", "tests/test_timing.py"]
# what each mutated file's mutants run (the step kernel's compile in test_engine_cuda.py is the slow part)
TESTS_FOR = {"vlaperf/timing.py": [NEW_TESTS, "tests/test_timing.py", "tests/test_profile_breakdown.py"]}

# (id, file, old text, new text, occurrence of old to replace (1-based), why it is a bug)
MUTANTS = [
    ("graph-output-aliased", "vlaperf/engine/graphs.py", "return entry.output.clone()", "return entry.output", 1,
     "a kept action chunk is overwritten by the next replay"),
    ("graph-inputs-not-copied", "vlaperf/engine/graphs.py",
     "torch._foreach_copy_(entry.static_inputs, inputs, non_blocking=True)", "pass", 1,
     "every replay runs on the first call's inputs"),
    ("graph-timed-shares-key", "vlaperf/engine/graphs.py", 'key = (key, "timed") if timed else key', "key = key", 1,
     "the timed and untimed calls share one graph"),
    ("graph-stale-stage-events", "vlaperf/engine/graphs.py", "self.last_stage_events = entry.stage_events",
     "self.last_stage_events = entry.stage_events or self.last_stage_events", 1,
     "an untimed replay keeps the last timed replay's events"),
    ("graph-inputs-not-cloned", "vlaperf/engine/graphs.py", "static_inputs = [x.clone() for x in inputs]",
     "static_inputs = list(inputs)", 1, "the first caller's tensors become the graph's buffers"),
    ("graph-untimed-gets-events", "vlaperf/engine/graphs.py", "self._stage_sink = stages if timed else None",
     "self._stage_sink = stages", 1, "the untimed graph holds event nodes"),
    ("graph-no-warmup", "vlaperf/engine/graphs.py", "for _ in range(self.warmup_runs):", "for _ in range(0):", 1,
     "lazy initialisation inside the capture"),
    ("graph-no-stream-join", "vlaperf/engine/graphs.py", "torch.cuda.current_stream().wait_stream(side)", "pass", 1,
     "the capture races the side stream's warm-up"),
    ("graph-has-shape-untimed-only", "vlaperf/engine/graphs.py",
     'return key in self.entries or (key, "timed") in self.entries', "return key in self.entries", 1,
     "a timed capture precompiles the kernels again"),
    ("engine-key-no-steps", "vlaperf/engine/engine.py", "key = (plan.slots, plan.prompt_len, num_steps, ",
     "key = (plan.slots, plan.prompt_len, ", 1, "another step count replays the first count's graph"),
    ("engine-key-no-slots", "vlaperf/engine/engine.py", "key = (plan.slots, plan.prompt_len, num_steps, ",
     "key = (plan.prompt_len, num_steps, ", 1, "another camera plan replays the first plan's graph"),
    ("engine-key-no-prompt-len", "vlaperf/engine/engine.py", "key = (plan.slots, plan.prompt_len, num_steps, ",
     "key = (plan.slots, num_steps, ", 1, "another prompt bucket replays the first bucket's graph"),
    ("engine-never-timed", "vlaperf/engine/engine.py", "timed = self.stage_hook is not None", "timed = False", 1,
     "the breakdown of a graphed call gets no stage events"),
    ("engine-no-prepare", "vlaperf/engine/engine.py",
     "self.prepare(num_steps)  # schedule tables are copied to the device before any capture", "pass", 1,
     "the schedule tables are made inside the capture"),
    ("timer-no-sync-after", "vlaperf/timing.py", "torch.cuda.synchronize(self.device)", "pass", 2,
     "the wall clock stops before the GPU has finished"),
    ("timer-stream-sync-after", "vlaperf/timing.py", "torch.cuda.synchronize(self.device)",
     "stream.synchronize()", 2, "the wall clock misses work on other streams"),
    ("timer-no-sync-before", "vlaperf/timing.py", "torch.cuda.synchronize(self.device)", "pass", 1,
     "the wall clock includes work queued before the call"),
    ("timer-event-is-wall", "vlaperf/timing.py", "return (t1 - t0) * 1e3, self._start.elapsed_time(self._end)",
     "return (t1 - t0) * 1e3, (t1 - t0) * 1e3", 1, "the event time is the wall clock"),
    ("timer-no-events", "vlaperf/timing.py", 'self.use_events = self.device.type == "cuda"',
     "self.use_events = False", 1, "a GPU run has no CUDA-event timing"),
    ("time-calls-peak-not-reset", "vlaperf/timing.py", "        _reset_peak_memory(device)\n\n        bar.phase(\"timed\")",
     "        bar.phase(\"timed\")", 1, "the peak memory includes the warm-up's"),
    ("interleaved-event-ratio-from-wall", "vlaperf/timing.py",
     '"cuda_event_ms": _ratio_stats(event_ms[baseline], event_ms[name]) if timer.use_events else None',
     '"cuda_event_ms": _ratio_stats(wall_ms[baseline], wall_ms[name]) if timer.use_events else None', 1,
     "the event ratio is the wall clock's"),
    ("record-no-gpu-name", "vlaperf/timing.py", '"gpu": _probe(lambda: torch.cuda.get_device_name(dev)) if is_cuda else None',
     '"gpu": None', 1, "a GPU result file does not name its GPU"),
    ("uuid-keeps-prefix", "vlaperf/timing.py", '.lower().removeprefix("gpu-")', ".lower()", 1,
     "the UUID as torch prints it, not as nvidia-smi selects it"),
    ("gpu-state-bare-uuid", "vlaperf/timing.py", 'select = f"--id=GPU-{uuid}"', 'select = f"--id={uuid}"', 1,
     "nvidia-smi asked for a GPU by a UUID without its prefix"),
]


def apply(root: str, path: str, old: str, new: str, occurrence: int) -> None:
    file = os.path.join(root, path)
    text = open(file).read()
    starts = [m.start() for m in re.finditer(re.escape(old), text)]
    if len(starts) < occurrence:
        raise ValueError(f"{path}: {old!r} occurs {len(starts)} times, occurrence {occurrence} asked for")
    at = starts[occurrence - 1]
    open(file, "w").write(text[:at] + new + text[at + len(old):])


def run_tests(root: str, timeout: int, env: dict, tests: list[str]) -> dict:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--tb=line", *tests]
    env = dict(env, PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+?)::(\S+)", out, re.M)))
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    # --tb=line: one "path:line: message" per failure, what a reader needs to tell a kill from a flake
    messages = [line[:300] for line in out.splitlines() if re.match(r"^\S+\.py:\d+: ", line)]
    return {"rc": rc, "failed": [f"{f}::{t.split(' ')[0]}" for f, t in failed], "messages": messages,
            "summary": summary[-1:] or [out[-400:]], "seconds": round(time.perf_counter() - start, 1)}


def copy_tree(dest: str) -> None:
    for part in ("vlaperf", "tests", "benchmarks", "pyproject.toml"):
        src = os.path.join(REPO, part)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, part), ignore=shutil.ignore_patterns("results", "__pycache__"))
        else:
            shutil.copy(src, dest)


def one(mutant, work: str, timeout: int, env: dict) -> dict:
    mid, path, old, new, occurrence, why = mutant
    root = os.path.join(work, mid)
    copy_tree(root)
    apply(root, path, old, new, occurrence)
    tests = TESTS_FOR.get(path, [t for t in TESTS if t != "tests/test_timing.py"])
    r = run_tests(root, timeout, env, tests)
    files = {f.split("::")[0] for f in r["failed"]}
    r.update(id=mid, file=path, why=why, tests=tests, killed=r["rc"] != 0, killed_before=bool(files - {NEW_TESTS}) or r["rc"] is None)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=420)
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    args = ap.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m[0] in args.only.split(",")]
    work = tempfile.mkdtemp(prefix="vlaperf-mutants-")
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(work, "triton-cache"))
    base = os.path.join(work, "_unmutated")
    copy_tree(base)
    for m in mutants:  # every replacement must apply before any time is spent
        apply(base, *m[1:5])
        shutil.rmtree(base)
        copy_tree(base)
    baseline = run_tests(base, args.timeout, env, TESTS)
    print("unmutated:", baseline["summary"], baseline["messages"], f"{baseline['seconds']} s", flush=True)
    results = []
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda m: one(m, work, args.timeout, env), mutants):
            print(f"{r['id']:36s} killed={r['killed']!s:5s} before={r['killed_before']!s:5s} {r['seconds']:6.1f} s "
                  f"{r['summary'][0]}", flush=True)
            results.append(r)
    out = {"tests": TESTS, "new_tests": NEW_TESTS, "unmutated": baseline, "mutants": results,
           "killed_before": sum(r["killed_before"] for r in results), "killed": sum(r["killed"] for r in results),
           "total": len(results)}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"killed {out['killed_before']} -> {out['killed']} of {out['total']}")


if __name__ == "__main__":
    main()
