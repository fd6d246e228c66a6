"""`Engine(model, levers)`: the fast `sample_actions`, assembled from the levers.

    engine = Engine(model, "best")                  # or "for_loop,sdpa,cuda_graph"
    actions = engine.sample_actions(obs, noise, num_steps=10)

The reference model is not modified; the engine reads its parameters (or fused copies
of them, see fusion.py) and is checked against `model.sample_actions` by vlaperf.check.
A process that only serves the engine may then free the copied originals with
`engine.release_reference_weights()` (`vlaperf serve` does, after its check).
"""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from typing import Callable

import torch
from torch import Tensor

from vlaperf.engine.fusion import (SCHEDULE_TABLES, build_weights, held_tensors, release_reference_copies, schedule,
                                   stack_expert, step_kernel_modulation, time_tables)
from vlaperf.engine.graphs import GraphCache
from vlaperf.engine.levers import Levers
from vlaperf.engine.loop import SuffixContext, denoise_step
from vlaperf.engine.prefix import PLAIN_BLOCKS, PrefixBlocks, PrefixPlan, embed_prefix, plan_prefix, prefill
from vlaperf.inputs import Observation
from vlaperf.models.pi0 import Guidance, Pi0Model, check_num_steps, check_sample_inputs


# Worker processes that compile the engine's Triton kernels during the first call of a compiled
# engine (kernels/compile_worker.py); 0: the kernel-compile thread compiles them alone.
COMPILE_WORKERS = 3

# The static cache's keys per sample, rounded up to this: with pi0's 595 (544 prefix + 51
# suffix) the folded attention's probabilities had rows of 1190 bytes, not 16-byte aligned,
# and cuBLAS ran those matmuls with sm75 kernels (~47 us a layer at batch 4 on the H200, in
# some processes). Padding keys are masked, never attended. On the H200 without
# triton_kernels (the path `best` takes on other GPUs): batch 1 1.14x faster, batch 4 0.95x
# against a process where the unpadded path ran fast (docs/perf-notes.md, session 8).
KV_ALIGN = 8


class Engine:
    def __init__(self, model: Pi0Model, levers: str | Levers | None = "best", compile_backend: str = "inductor"):
        """`compile_backend` other than inductor (e.g. "eager") checks tracing and graph
        breaks without generating kernels (used by the CPU tests)."""
        if model.reference_released:  # its layers' weights are gone: nothing to copy from
            raise RuntimeError("this model's reference weights were released (Engine.release_reference_weights): keep "
                               "using the engine that released them, or build the model again for a new engine")
        self.model = model
        self.device = model.action_in_proj.weight.device
        self._built_for = (model.dtype, self.device)  # the engine's weight copies are of this dtype, on this device
        # the two modules whose weights say the model's dtype (what Pi0Model.dtype reads) and device, held so that
        # each call reads them in two attribute lookups, not the model's eight-module walk: a cast or move changes
        # their weights in place (or swaps in new Parameters on the same modules), and so does a load with assign
        self._dtype_probe, self._device_probe = model.backbone.layers[0].self_attn.q_proj, model.action_in_proj
        self.levers = Levers.parse(levers, self.device, model.dtype)
        self.levers.check(self.device)
        self.precompile_error: Exception | None = None  # what stopped the last kernel-compile thread, if anything
        self.compile_worker_seconds: dict[str, float] = {}  # each kernel's compile in the first call's workers
        self._inductor_warmup = self._compile_workers = None
        if self.levers.compile and compile_backend == "inductor":
            from vlaperf.engine.compile import compile_blockers, start_inductor_warmup

            # beside the weights' preparation below; joined before torch.compile
            if not compile_blockers("inductor", self.device.type):
                self._inductor_warmup = start_inductor_warmup()
                kernels = self.levers.triton_kernels or self.levers.megakernel
                if COMPILE_WORKERS and self.device.type == "cuda" and self.levers.cuda_graph and kernels:
                    self._start_compile_workers()
        with torch.inference_mode(False):  # the engine's own tensors are plain ones, whatever mode it is built in
            self.weights = build_weights(model, fuse=self.levers.fuse_projections)
            if self.levers.megakernel:
                from vlaperf.engine.kernels.expert_step import error_flag

                self.weights.expert_stack = stack_expert(self.weights)
                error_flag(self.device)  # now, not first inside a CUDA-graph pool
        # the model's own parameters this engine reads (unfused q/k/v, ...): another engine's release of those is an
        # error at this engine's next call, not a shape error from deep inside it (release_reference_copies)
        params = {id(p) for p in model.parameters()}
        self._reads_from_model = {id(x) for x in held_tensors(self.weights)} & params
        self._tables: dict[int, dict[str, Tensor]] = {}
        self._times: dict[int, Tensor] = {}
        self._kv: dict[tuple, tuple[Tensor, Tensor]] = {}  # (shape, Tp) -> (keys, values)
        self.graphs = GraphCache() if self.levers.cuda_graph else None
        self.last_plan: PrefixPlan | None = None
        self._call_lock = threading.RLock()  # one call at a time (sample_actions)
        self._weights_version = model.weights_version  # the weights this engine copied (see sample_actions)
        # Stage boundaries for the profiler: called with a stage name where that stage starts
        # ("embed_prefix", "prefill", or "prefix" where compile makes the prefix one function;
        # "denoise_step_<i>") and "end" after the last. Never from inside compiled code. With
        # cuda_graph it is not called: a call made while it is set replays a second graph with
        # a timing event at each boundary instead, and `last_stage_events` holds them.
        self.stage_hook: Callable[[str], None] | None = None
        self._prefix = self._prefix_eager
        self._blocks = PLAIN_BLOCKS
        self._step = self._step_eager = partial(denoise_step, model, self.weights, kernels=self.levers.triton_kernels,
                                                megakernel=self.levers.megakernel)
        if self._inductor_warmup is not None:  # torch.compile below imports what that thread imports: never both at once
            self._inductor_warmup.join()
            self._inductor_warmup = None
        if self.levers.compile:
            from vlaperf.engine.compile import compile_fn, wants_pdl

            mode = self.levers.compile
            pdl = wants_pdl(self.device, in_graph=self.levers.cuda_graph)
            if self.levers.compile_layers:  # each layer block compiled once, reused by every layer
                self._blocks = PrefixBlocks(*(compile_fn(f, mode, compile_backend, pdl, self.device.type) for f in
                                              (PLAIN_BLOCKS.siglip, PLAIN_BLOCKS.gemma, PLAIN_BLOCKS.gemma_last_kv)))
            else:
                self._prefix = compile_fn(self._prefix_eager, mode, compile_backend, pdl, self.device.type)
            self._step = compile_fn(self._step, mode, compile_backend, pdl, self.device.type)

    @property
    def name(self) -> str:
        return self.levers.label()

    def release_reference_weights(self) -> int:
        """Free the reference model's parameters this engine holds its own copies of (with
        `fuse_projections`: q/k/v, gate/up, the expert's stacked o/down); returns the bytes
        freed (0 without fused weights). The engine runs as before; `model.sample_actions`
        refuses from then on, so run every equivalence check first."""
        freed = release_reference_copies(self.model, self.weights)
        if self.device.type == "cuda":
            with self._on_device():
                torch.cuda.empty_cache()  # hand the freed blocks back, so nvidia-smi sees it too
        return freed

    def raise_on_kernel_fault(self) -> None:
        """Raise if a `megakernel` step on this engine's device gave up waiting at a grid
        barrier since the last check: its actions are wrong. That happens only when not every
        program of the persistent kernel is resident at once (another process's kernels on
        the GPU, an MPS thread limit). One 4-byte read; the policy path calls it after its
        copy of the actions to host, so a server answers with an error, never wrong actions."""
        if not self.levers.megakernel:
            return
        from vlaperf.engine.kernels.expert_step import take_barrier_timeouts

        if take_barrier_timeouts(self.device):
            raise RuntimeError("megakernel: a grid barrier of the step kernel timed out, so these actions are wrong: not "
                               "every program of the persistent kernel was resident (another process's kernels on this "
                               "GPU, or an MPS thread limit). Give the GPU to this process or run without megakernel")

    # ------------------------------------------------------------------ public

    @torch.no_grad()
    def sample_actions(self, obs: Observation, noise: Tensor | None = None, num_steps: int = 10,
                       guidance: Guidance | None = None) -> Tensor:
        """Actions (B, H, A) float32, the same function as `model.sample_actions` (`guidance` included:
        real-time chunking's pull toward the previous chunk, models.pi0.Guidance). Calls from several
        threads take turns: the static KV cache, the CUDA graphs' input buffers and the schedule
        tables are the engine's own, one set per shape, so two calls at once would write each other's."""
        if self.model.weights_version != self._weights_version:
            raise RuntimeError("the model's weights changed since this engine was built (a checkpoint was loaded into "
                               "it), and the engine holds copies of the old ones: build the Engine again")
        now = (self._dtype_probe.weight.dtype, self._device_probe.weight.device)
        if now != self._built_for:
            raise RuntimeError(f"the model was cast or moved since this engine was built (now {now[0]} on {now[1]}, "
                               f"the engine's copies {self._built_for[0]} on {self._built_for[1]}): build the Engine "
                               "again")
        if self.model.reference_released and self._reads_from_model & self.model.released_parameters:
            raise RuntimeError("another engine released the model's weights that this engine reads from it "
                               "(Engine.release_reference_weights frees what the releasing engine holds copies of): "
                               "release only where one engine runs the model, or build the model again")
        check_sample_inputs(self.model.config, obs, noise, num_steps, self.device)
        num_steps = int(num_steps)  # a numpy integer too: one key for the schedule's tables and graphs
        if guidance is not None:
            cfg = self.model.config
            guidance.check(obs.batch, cfg.action_horizon, cfg.action_dim, num_steps, self.device)
        # never in inference mode, whatever the caller's: the static KV cache and the graphs' input buffers made in a
        # first call under torch.inference_mode() were inference tensors, and every later plain call's in-place
        # write to them failed ("Inplace update to inference tensor outside InferenceMode")
        with self._call_lock, _out_of_inference_mode(), self._on_device():
            return self._sample_actions(obs, noise, num_steps, guidance)

    def _on_device(self):
        """The engine's GPU as the current device for a call: a graph's capture, its side stream and synchronize()
        act on the current device, so an engine on cuda:1 with cuda:0 current captured an empty graph."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _sample_actions(self, obs: Observation, noise: Tensor | None, num_steps: int,
                        guidance: Guidance | None = None) -> Tensor:
        cfg = self.model.config
        if noise is None:
            noise = torch.randn(obs.batch, cfg.action_horizon, cfg.action_dim, device=self.device)
        lv = self.levers
        plan = plan_prefix(obs, lv.skip_masked_images, lv.trim_prompt_padding)
        self.last_plan = plan
        inputs = [obs.images, obs.image_mask, obs.tokens, obs.token_mask, obs.state, noise]
        if guidance is not None:  # graph inputs like the rest: new values replay the graph of these shapes
            inputs += guidance.tensors()
        if self.graphs is not None:
            self.prepare(num_steps)  # schedule tables are copied to the device before any capture
            key = (plan.slots, plan.prompt_len, num_steps, tuple((tuple(x.shape), x.dtype) for x in inputs))
            timed = self.stage_hook is not None
            precompile = None
            if not self.graphs.has_shape(key) and self.levers.compile and (lv.triton_kernels or lv.megakernel):
                precompile = self._precompile_kernels(inputs, plan, num_steps)
            return self.graphs.run(key, lambda: partial(self._sample, plan=plan, num_steps=num_steps), inputs,
                                   before_capture=precompile, timed=timed)
        return self._sample(*inputs, plan=plan, num_steps=num_steps)

    @property
    def last_stage_events(self) -> list[tuple[str, torch.cuda.Event]]:
        """(stage, CUDA event) at each stage boundary of the last call, when it replayed the timed
        graph (`stage_hook` set, with cuda_graph): the events that replay recorded, in order, ending
        with "end"; read their times once the call has finished. [] otherwise."""
        return self.graphs.last_stage_events if self.graphs is not None else []

    def prepare(self, num_steps: int) -> None:
        """Build the per-schedule tables ahead of time (also done lazily)."""
        check_num_steps(num_steps)
        with self._call_lock, _out_of_inference_mode():
            self._schedule_tensors(num_steps)

    def _start_compile_workers(self) -> None:
        """Start the kernel compile workers now (they import torch while the weights are prepared);
        the first call's kernel-compile thread hands them its launches, then ends them. Closed
        with the engine if no call comes."""
        import weakref

        from vlaperf.engine.kernels.compile_worker import CompileWorkers

        try:
            workers = CompileWorkers(COMPILE_WORKERS, self.device)
        except OSError as e:  # no process to spare: the thread compiles alone
            self.precompile_error = e
            return
        self._compile_workers = workers
        weakref.finalize(self, workers.close)

    def _precompile_kernels(self, inputs: list[Tensor], plan: PrefixPlan, num_steps: int) -> Callable[[], None]:
        """Compile this engine's Triton kernels in a thread while torch.compile traces the first
        call of a new shape: the uncompiled path runs there once with every kernel launch
        recorded, not run (kernels/launch.py), and the launches are compiled afterwards, the
        step kernel first, so each kernel is compiled for the arguments it will get: in the
        compile worker processes of a first call (`COMPILE_WORKERS`), whose cache entries the
        thread's own compile then finds, or in the thread alone.
        Returns the wait for that thread, which the graph cache calls before it captures
        (the thread's stream must be idle then). The thread only saves time: if it fails, the
        kernels compile at their first launch as before."""
        import threading

        from vlaperf.engine.kernels.launch import compile_only, compile_recorded

        B = inputs[4].shape[0]  # the state's batch
        Tp = len(plan.slots) * self.model.config.vision.num_patches + plan.prompt_len
        self._kv_buffers(B, Tp)  # allocated here, not raced for by the two threads
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        self.precompile_error = None
        workers, self._compile_workers = self._compile_workers, None  # the first call's only

        def work():
            launches: list = []
            try:
                with torch.no_grad(), torch.cuda.stream(stream) if stream else contextlib.nullcontext(), \
                        compile_only(record=launches):
                    self._sample(*inputs, plan=plan, num_steps=num_steps, compiled=False)
                # the step kernel takes longest (~2.3 s on the H200's host) and pi0.5's main thread reached
                # it before the in-order pass had; one thread: in four each compile took 1.4-1.9x longer
                # (the GIL, and the main thread's own compile beside them), two were no faster than one
                if workers is not None:
                    try:
                        self.compile_worker_seconds = workers.compile(launches, first=("_expert_step_kernel",))
                    except Exception as e:  # the thread compiles what they did not
                        self.precompile_error = e
                    finally:
                        workers.close()
                compile_recorded(launches, first=("_expert_step_kernel",), workers=1)
            except Exception as e:  # an optimization only: the main thread compiles what is missing
                self.precompile_error = e
            if stream is not None:
                stream.synchronize()

        thread = threading.Thread(target=work, name="vlaperf-kernel-compile", daemon=True)
        thread.start()
        return thread.join

    # ----------------------------------------------------------------- the path

    def _schedule_tensors(self, num_steps: int):
        if num_steps not in self._times:
            self._times[num_steps] = torch.tensor(schedule(num_steps), dtype=torch.float32, device=self.device)
            if self.levers.fuse_projections:
                tables = time_tables(self.model, num_steps, self.device)
                stack = self.weights.expert_stack
                if stack is not None and stack.adaptive:  # pi0.5 through the step kernel
                    tables["step_kernel_modulation"] = step_kernel_modulation(tables, stack)
                self._tables[num_steps] = tables
        return self._times[num_steps], self._tables.get(num_steps)

    def _kv_buffers(self, B: int, Tp: int) -> tuple[Tensor, Tensor] | None:
        """Engine-owned KV buffers (depth, B, K, T, h), allocated once per shape and prefix
        length and reused by every call, as a static cache should be (and as CUDA graphs need).
        T is Tp + Ts rounded up to a multiple of KV_ALIGN; the keys past Tp + Ts stay zero and
        the suffix mask masks them (loop.SuffixContext). Keyed by Tp too, not by shape alone:
        two prefix lengths that round to one T (a prompt bucket capped at a slot count that is
        no multiple of 8) shared a buffer, and the longer one's suffix keys stayed in the
        shorter one's padding; masked, but a NaN there (from one call's NaN input) made every
        later call of the shorter prefix NaN (a zero probability times NaN)."""
        if not self.levers.static_kv_cache:
            return None
        cfg = self.model.config
        Ts = cfg.action_horizon + (0 if cfg.pi05 else 1)
        T = -(-(Tp + Ts) // KV_ALIGN) * KV_ALIGN
        shape = (cfg.backbone.depth, B, cfg.backbone.num_kv_heads, T, cfg.backbone.head_dim)
        key = (shape, Tp)
        if key not in self._kv:
            k = torch.zeros(shape, dtype=self.model.dtype, device=self.device)
            self._kv[key] = (k, torch.zeros_like(k))
            if self.levers.compile:
                for t in self._kv[key]:
                    torch._dynamo.mark_static_address(t)
        return self._kv[key]

    def _prefix_eager(self, obs: Observation, plan: PrefixPlan, kv_buffers, blocks: PrefixBlocks | None = None):
        blocks = blocks or self._blocks
        self._mark("embed_prefix")
        prefix, pad = embed_prefix(self.model, self.weights, obs, plan, self.levers.sdpa, blocks)
        self._mark("prefill")
        cache = prefill(self.model, self.weights, prefix, pad, self.levers.sdpa, kv_buffers, kernels=self.levers.triton_kernels,
                        blocks=blocks)
        return pad, cache

    def _mark(self, stage: str) -> None:
        # is_compiling first: dynamo folds it, so a trace neither calls the hook nor guards on it
        # (setting or clearing the hook must not recompile)
        if torch.compiler.is_compiling() or self.stage_hook is None:
            return
        if self.graphs is not None:
            self.graphs.record_stage(stage)  # an event node while the timed graph is captured
        else:
            self.stage_hook(stage)

    def _sample(self, images, image_mask, tokens, token_mask, state, noise, *guidance: Tensor, plan: PrefixPlan,
                num_steps: int, compiled: bool = True) -> Tensor:
        """The call on the engine's path; compiled=False: none of it through torch.compile (the
        kernel-compile thread of the first call). `guidance`: Guidance.tensors(), or none."""
        prefix_fn = self._prefix if compiled else partial(self._prefix_eager, blocks=PLAIN_BLOCKS)
        step_fn = self._step if compiled else self._step_eager
        if self.levers.compile in ("reduce-overhead", "max-autotune"):
            # One policy call is one cudagraph-trees "step": outputs of the previous call's
            # graphs may be overwritten from here on, never within the call.
            torch.compiler.cudagraph_mark_step_begin()
        obs = Observation(images, image_mask, tokens, token_mask, state)
        B = state.shape[0]
        Tp = len(plan.slots) * self.model.config.vision.num_patches + plan.prompt_len
        kv_buffers = self._kv_buffers(B, Tp)
        if compiled and self._prefix != self._prefix_eager:  # compiled as one function: its own marks never run
            self._mark("prefix")
        pad, cache = prefix_fn(obs, plan, kv_buffers)
        ctx = SuffixContext(self.model, state, pad, cache, kv_buffers, hoist=self.levers.static_kv_cache)
        times, tables = self._schedule_tensors(num_steps)
        dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32).item()  # the reference's float32 dt
        x_t = noise.float()
        sdpa = self.levers.sdpa
        if self.levers.for_loop:
            for i in range(num_steps):
                self._mark(f"denoise_step_{i}")
                row = _table_row(tables, i)
                if guidance:  # the guidance needs the velocity itself: no Euler-folded head
                    v_t = step_fn(ctx, x_t, times[i].expand(B), row, sdpa)
                    x_t = x_t + dt * Guidance.apply(v_t, x_t, times[i], i, *guidance)
                elif row is not None and "euler_proj" in row:  # the action head returns the next x_t
                    x_t = step_fn(ctx, x_t, times[i].expand(B), row, sdpa, euler=True)
                else:
                    x_t = x_t + dt * step_fn(ctx, x_t, times[i].expand(B), row, sdpa)
            self._mark("end")
            return x_t
        # Without for_loop: the reference's loop condition, read on the host every step.
        time_t = torch.tensor(1.0, dtype=torch.float32, device=self.device)
        dt_t = torch.tensor(dt, dtype=torch.float32, device=self.device)
        i = 0
        while time_t >= -dt_t / 2:
            self._mark(f"denoise_step_{i}")
            v_t = step_fn(ctx, x_t, time_t.expand(B), _table_row(tables, i), sdpa)
            if guidance:
                v_t = Guidance.apply(v_t, x_t, time_t, i, *guidance)
            x_t = x_t + dt_t * v_t
            time_t = time_t + dt_t
            i += 1
        self._mark("end")
        return x_t


def _table_row(tables: dict[str, Tensor] | None, i: int) -> dict[str, Tensor] | None:
    if tables is None:
        return None
    return {name: t if name in SCHEDULE_TABLES else t[i] for name, t in tables.items()}


def _out_of_inference_mode():
    """Leave torch.inference_mode() for an engine call where the caller is in it (0.25 us a call when it is not,
    against 1.1 us for entering inference_mode(False) every time, on the CPU machine)."""
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()


def first_call_seconds(engine: Engine, obs: Observation, noise: Tensor, num_steps: int) -> float:
    """Time of the first call (compile / graph capture included), synchronised."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    engine.sample_actions(obs, noise, num_steps)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - start
