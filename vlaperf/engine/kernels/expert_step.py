"""All the expert layers of one denoise step in one persistent Triton kernel (`megakernel`).

Why: under `best` a pi0 denoise step is ~9x its memory floor (0.15 ms for 0.63 GB of expert
weights on an H200). It is not the bytes: the step is ~200 kernels, each paying a few
microseconds of launch, ramp-up and tail for a few MB of weights (docs/perf-notes.md). Here
the grid is one program per SM, launched once per step; each layer runs as six phases,
and every program takes its share of a phase's tasks, then waits at a grid barrier for
the others before the next phase reads what they wrote:

  phase     tasks (pi0 expert: D 1024, 8 heads x 256, F 4096, M = 51 rows)
  qkv       (8 q heads + k + v) x column pairs: RMSNorm prologue, x @ Wqkv^T, RoPE on q/k
            (the first half of a head's dims is paired with the second half, so each task
            owns matching column pairs); q to a buffer, this step's k/v to a scratch buffer
  attention query rows (8 heads x M, folded: one shared K/V head) x key splits: online
            softmax over the cached prefix keys (static KV cache, read only) and the
            scratch suffix keys; float32 partials
  merge     the splits' partials -> attention output (M, 8 x 256)
  o_proj    columns of x x K-slices: x += out @ Wo^T (split K, see below)
  gate_up   columns of F: h = gelu_tanh(n(x) @ Wg^T) * (n(x) @ Wu^T), RMSNorm prologue
  down      columns of x x K-slices: x += h @ Wd^T (split K)

Split K (`ks_o` and `ks_down`, 4 by default, on 32-column tiles): a task that owns whole
columns reads the whole activation (all 418 KB of h for down), and the phase is bound by
those re-reads through L2.
With K split, a task reads one slice, writes a float32 partial, and counts itself in at its
tile's counter; the last to arrive adds the partials in slice order to x, so the result does
not depend on which task finished first (the persistent launch equals the per-phase launches
bit for bit). H200, 18 layers: 1.01 ms a step against 1.10 unsplit (perf-notes, version 11);
0.84 ms with session 5's attention tiles and barrier (versions 15-16); ~0.79 ms with session
6's 32-column x 4-slice tiles, early value loads and idle-program prefetch (versions 18-20).

The RMSNorm scales are folded into Wqkv / Wgate_up (fuse_projections), so a norm is the
row's rsqrt(mean(x^2) + eps), accumulated from the x tiles the matmul loads anyway.

pi0.5 (`mod`, `modulation_table`): its adaptive norms, n (1 + scale) + shift, and gated
residuals, x + branch * gate, with scale / shift / gate fixed per step and layer. Since
(n (1 + scale) + shift) @ W^T = inv (x (1 + scale)) @ W^T + shift @ W^T, the matmuls read
xm = x (1 + scale), which o_proj's and down's writers store beside x with the per-tile sums
of squares of x (the norm's statistics), and add shift @ W^T, tabulated once per schedule.
The K loops stay those of pi0: the first version scaled the activations inside them and took
1.24 ms a step against pi0's 0.77 (docs/perf-notes.md, session 9, version 39). qkv and gate_up
load those sums of squares (one block) and their shift biases before the K loop and add them
after it (`stats_ahead`): libero-pi05's step kernel (10 rows) 0.67 against 0.88 ms a step in
its call (session 13, version 62).

Grid barrier: each program adds 1 to the phase's counter (release) and spins on it
(acquire) until every program has arrived; activations written in the kernel are read
back with `.cg` loads (L2, never a stale L1 line). By default in PTX (`barrier_asm`,
`poll_one`): one thread arrives with `red.release` and polls with `ld.acquire` while the
block waits for it at `bar.sync` (4% faster a step than every thread polling; atomics from
every thread measured about the same, perf-notes version 16). The spin gives up after MAX_SPIN polls and raises a flag (`barrier_timeouts`)
instead of hanging the GPU: that would happen only if the programs were not all resident
at once (one per SM is requested). Without barriers (`persistent=False`) the same kernel
runs one launch per (layer, phase); that is how the CPU tests run it under Triton's
interpreter, which executes programs one after another.

The prefix K/V are read from the engine's static cache; this step's own k/v live in a
scratch buffer. The custom op updates x in place (a declared mutation: inductor hands it the
tokens it has just built, so no copy a step); the launcher itself copies x unless in_place.

`dataflow` (off until timed): the attention tasks wait on per-head counters that the qkv tasks
count in, and the merge tasks on per-row-block counters that the attention tasks count in,
instead of the two grid barriers after qkv and attention. Every program finishes its qkv
tasks before it waits for anyone's, so the waits cannot deadlock while all programs are
resident (what the grid barriers need too).

Several samples (x of shape (B, M, D), up to MAX_ROWS rows in all): the matmul phases take
all B * M rows as one row block (a weight tile is read once for every sample), attention
tasks are (sample, row block, key split) over that sample's cache and mask. It is checked
against the torch layers in the interpreter and compiles for sm_90a (4 samples: a 256-row
block, K blocks a quarter as deep). On the H200 4 samples take 1.95 ms a step in one launch
(0.77 ms for one), and a batch-4 call's steps are faster through the layers (1.53 against
2.10 ms a step, T(N) in one process: docs/perf-notes.md, session 7), so the engine sends it one
sample only (`TUNED_ROWS`, loop.step_kernel_applies).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels.launch import launch, pdl_wait
from vlaperf.engine.kernels.small_m_matmul import _gelu_tanh
from vlaperf.models.pi0 import ATTENTION_MASK_VALUE

PHASES = ("qkv", "attention", "merge", "o_proj", "gate_up", "down")
# StepKernelConfig.prefetch: at the start of which phase every program prefetches which weights
# ("qkv+1": the next layer's). 1 is session 3's schedule (no gain then: docs/perf-notes.md 9b).
PREFETCH_PLANS = {
    1: {"qkv": ("o", "gate_up"), "o_proj": ("down",), "gate_up": ("qkv+1",)},
    2: {"attention": ("gate_up",), "o_proj": ("down",), "gate_up": ("qkv+1",)},
    3: {"attention": ("gate_up",), "o_proj": ("down", "qkv+1")},
    4: {"merge": ("gate_up",), "o_proj": ("down",), "gate_up": ("qkv+1",)},
}
MAX_ROWS = 256  # suffix rows of all samples in one launch
TUNED_ROWS = 64  # what the H200 sweeps timed (one sample of pi0's 51 rows): the engine sends no more


@dataclass(frozen=True)
class StepKernelConfig:
    """Tiles of the step kernel. `bn_*` columns and `bk_*` reduction depth per matmul task,
    `ks_*` K-slices; attention tiles `att_bm` query rows x `att_bn` keys, `splits` key
    splits, `merge_bd` dims per merge task; `num_warps` for the whole kernel. The defaults
    are the fastest of the H200 sweeps (benchmarks/expert_step_bench.py, sweeps 1-31); the
    options off by default measured slower there (docs/perf-notes.md). Three fields follow the
    launch's shape, so their defaults are "fitted" sentinels that `fit_config` resolves for
    each launch: `qkv_pairs` -1, `splits` 0, `merge_bd` 0."""

    bn_qkv: int = 16
    bk_qkv: int = 128
    bn_o: int = 32
    bk_o: int = 256
    bn_gu: int = 32
    bk_gu: int = 128
    bn_down: int = 32
    bk_down: int = 256
    att_bm: int = 16
    att_bn: int = 64
    # key splits of the attention phase, at most one att_bn tile each; 0: fitted to the programs
    # (fit_config: as many as the row blocks leave programs for, at least MIN_SPLITS, sweep 8's 5 at
    # pi0's 51 rows). libero-pi05's 10 rows are 5 row blocks: 10 splits, 614 against 663 us a step
    # at 5 (sweep 29, session 14)
    splits: int = 0
    # dims of the attention output a merge task combines; 0: fitted (fit_config: from 32 up, doubled while
    # the merge's tasks would take more than one round of the programs). pi0's 26 row blocks: 64 (104
    # tasks; 32 gave 208, two rounds), 746.4 against 756.1 us a step (sweep 31), the libero-pi0 call
    # 1.0092x (p10..p90 1.005..1.015); pi0.5's 5 row blocks: 32 (16: the same, sweep 30)
    merge_bd: int = 0
    # attention's key-tile loop pipelined in this many stages (2: the next tile's keys and values copied to
    # shared memory during this tile's products). 2 in session 19's sweep 37: 689.8 against 690.6 us a step
    # (the attention's median work 6.66 -> 6.40 us, its slot unchanged); 1
    att_stages: int = 1
    # attention tasks split the value / output dims in this many parts as well (each task: its rows'
    # scores over its key split in full, P @ V for HD / att_dsplit of the dims). At pi0's 51 rows every
    # key tile is read by each of the 26 row blocks of 16 (19 MB of L2 reads a layer for 0.6 MB of
    # keys); 32-row blocks halve that but spill with a 32 x 256 float32 accumulator (session 14).
    # With 32 rows and 2 dim parts the accumulator is 16 x 256's size again, and a task reads its
    # split's values half (q 16 KB + K 64 KB + V 32 KB, against 8 + 64 + 64 KB). Not with fold_merge
    # or dataflow (their arrival counts are per row block). Slower (session 19, sweep 36): 713.2 against
    # 691.7 us a step, attention's work 6.66 -> 7.94 us; the libero-pi0 call 0.975x (p10..p90
    # 0.970..0.979): a task's time follows its chain of key tiles, not its bytes; off
    att_dsplit: int = 1
    num_warps: int = 8
    num_stages: int = 4  # the matmuls' K loops
    poll_load: bool = True  # barrier polls with plain loads (else with atomics)
    # every program asks L2 for a later phase's weights at the start of a phase (CUDA only), by plan
    # (PREFETCH_PLANS): 1 (session 3) issues them while other weights stream from HBM; 2-4 in the
    # phases that read nothing from HBM. All slower (sweep 15: 823-860 against 775 us a step;
    # plan 2 0.972x the whole call): the issuing phase slows and gate_up does not speed up
    prefetch: int = 0
    ks_o: int = 4  # split K of o_proj into this many slices (see _phase_residual); 32 x 4 from sweep 12
    ks_gu: int = 1  # split K of gate_up (2: 6-8% slower a step)
    ks_down: int = 4  # split K of down (32 columns x 4 slices: 3.5% faster a step than 16 x 2, sweep 10)
    fold_merge: bool = False  # the last attention split of a row block merges them, no merge phase (14% slower)
    barrier_asm: bool = True  # arrive with red.release, poll with ld.acquire (inline PTX, CUDA only)
    poll_one: bool = True  # with barrier_asm: one thread polls, the block waits for it (4% faster a step)
    att_early_v: bool = True  # attention: a tile's value and mask loads issued with its keys (3% faster a step)
    # programs without a qkv task ask L2 for the layer's K/V cache and Wo (1: 3% faster a step), and Wgate_up (2)
    idle_prefetch: int = 1
    k_rotate: bool = False  # each task starts its K loop (and key tiles) at an offset of its own (no gain, sweep 13)
    dataflow: bool = False  # attention and merge wait on per-head / per-row-block counters, not grid barriers (no gain, sweep 14)
    # each program, its work in a phase done, asks L2 for the weights of its own task in the next
    # matmul phase before it waits at the barrier, so the wait hides their HBM latency (unlike
    # `prefetch`, nothing is asked while the program's own loads run; CUDA only). A bit mask of
    # the phases prefetched for: 1 o_proj (at the end of merge), 2 gate_up (end of o_proj),
    # 4 down (end of gate_up), 8 the next layer's qkv (end of down). All four (15, sweep 17):
    # every matmul's work 0.5 us shorter a layer, but the o_proj slot 1.7 us longer (the 16.8 MB
    # of gate_up prefetches delay its barrier): 794 against 773 us a step, 0.979x the call
    prefetch_own: int = 0
    # pi0.5 only: the loads its epilogues add (o_proj's / down's gate and next scale, qkv's and
    # gate_up's biases and norm statistics) issued before the K loop instead of after it: 8%
    # slower a step (sweep 20, same process: 945 / 947 against 878 / 879 us). Sweeps 19-24 timed
    # 50 rows; libero-pi05 launches 10 (docs/perf-notes.md, version 63): not measured at that shape
    early_mod_loads: bool = False
    # pi0.5 only: the writers' (o_proj, down) next-norm scale loaded right after the K loop, with
    # the gate, so its latency overlaps the partial store and the tile's arrival, instead of in
    # the last task's tail after the store of x. No gain: the libero-pi05 call 1.002x
    # (p10..p90 0.999..1.005, step_config_ab_libero-pi05_scale_after_loop.json); off
    scale_after_loop: bool = False
    # pi0.5 only: the programs idle in qkv also ask L2 for this layer's and the next one's rows of
    # the modulation table (2 x 58 KB of float32 a layer, a different table every step, so it is
    # never in L2 after the weights have streamed through): the writers' gate and next-norm scale
    # and gate_up's biases hit L2 instead of HBM. Neutral in the libero-pi05 call (session 13, both
    # sides in one process: 1.001x beside stats_ahead, 1.004x alone); on, as the closing bench ran
    mod_prefetch: bool = True
    # pi0: o_proj's and down's writers also store per-tile sums of squares of x (as pi0.5's do), so
    # qkv's and gate_up's K loops no longer square their activation tiles (the first layer's come
    # from a small kernel before the launch). 1 on, 0 off, -1 fitted (fit_config: on for one sample's
    # row block of at most WRITERS_SSQ_MAX_BLOCK rows). At pi0's 51 rows (a 64-row block) slower: 826
    # against 685 us a step, the libero-pi0 call 0.905x, and 0.910x with 64-deep K blocks, so not the
    # registers (session 26: kernel_expert_step_libero-pi0_sweep38.json, step_config_ab_libero-pi0_ssq_writers_*.json);
    # at droid-pi0's 11 rows (a 16-row block) faster: 602 against 688 us a step, the call 1.080x
    # (kernel_expert_step_droid-pi0_sweep23.json, step_config_ab_droid-pi0_ssq_writers.json)
    ssq_from_writers: int = -1
    # the consumers of those per-tile sums (pi0.5 always, pi0 with ssq_from_writers) load them, and
    # pi0.5's biases, as one block before the K loop and add them after it: the loads' latency
    # overlaps the loop (early_mod_loads added them before the loop, which waited on them there;
    # early_mod_loads takes precedence). The libero-pi05 call 1.167x (14.86 -> 12.73 ms, both sides
    # in one process; its step kernel 665-675 against 870-907 us a step: session 13); on
    stats_ahead: bool = True
    # qkv's RoPE tables (its tile's cos / sin, both halves) loaded before the K loop instead of after
    # it, so their L2 round trip overlaps the loop: pi0's analogue of stats_ahead (whose epilogue
    # loads after the loop cost pi0.5 0.21 ms a step). pi0 (session 14): 764.8 against 774.4 us a
    # step (sweep 28), the libero-pi0 call 1.0056x (p10..p90 1.001..1.013); on
    rope_ahead: bool = True
    # qkv's tasks take this many consecutive rotary pairs (d, d + HD/2) each, counted over all slots
    # (query heads, k, v) so a task may span two slots, in a bn_qkv-wide block: 10 makes pi0's 1280
    # pairs 128 tasks for 132 programs, where the per-slot tiling of bn_qkv pairs gives 80 tasks
    # and leaves 52 programs idle. 0: the per-slot tiling; -1: fitted to the programs (fit_config: the
    # fewest pairs a task that spread the pairs over all programs, where they fit bn_qkv). Not with
    # dataflow or prefetch_own's bit 8. Session 14, 10 pairs: the libero-pi05 call 1.0065x (p10..p90
    # 1.005..1.011), where the weights dominate a task's bytes; libero-pi0's 0.996x alone, 1.0058x
    # (1.002..1.010) with rope_ahead, its kernel 760.0 against 764.8 us a step (sweep 28)
    qkv_pairs: int = -1
    # pi0: qkv's and gate_up's K loops sum the squares of their activation tiles (the RMSNorm's statistics)
    # with a product against a block of ones on the tensor cores instead of a reduction across the threads
    # in every K block (those two phases take ~2.5 us a layer longer than down for the same bytes, session
    # 10). The squares of bf16 activations round to bf16 (relative 2^-9 each, the sum in float32).
    # Under Triton 3.6 (sm_90a) it spills 136 B at the default 128-deep K blocks, none with bk_qkv = bk_gu
    # = 64. Slower (session 15, sweep 32): 765.2 us a step at 64-deep blocks (those blocks alone 756.1),
    # 826.9 at 128, against 748.7; the libero-pi0 call 0.983x (p10..p90 0.980..0.986). Off; where on, it
    # takes precedence over ssq_local
    ssq_mma: bool = False
    # pi0: qkv's and gate_up's K loops sum the squares without crossing threads: each thread adds its own
    # 8-element runs of the activation tile into float32 partials (BLOCK_M x BLOCK_K / 8, 4 registers a
    # thread at 128-deep blocks), which one reduction after the loop adds up; before, every K block ended
    # in 16 warp shuffles. Session 15 (sweep 32): 728.3 against 748.7 us a step (qkv's and gate_up's
    # median work 0.5 us shorter each), the libero-pi0 call 1.013x (p10..p90 1.011..1.015); on
    ssq_local: bool = True
    # the grid barrier's poll (barrier_asm with poll_one): 1 is thread 0 reading the count with
    # `ld.acquire` one round trip after another. 2-4 keep that many relaxed reads in flight, issued
    # `poll_gap` clock cycles apart, so the count's completion is seen up to a round trip sooner
    # (the barrier releases ~0.77 us after the last arrival: sweep 32's timeline); the read that sees
    # it is followed by an acquiring fence. Slower (session 15, sweep 33): 769-778 against 726.6 us a step, the
    # release 0.77 -> 1.02 us (the fence compiles to MEMBAR.ALL.GPU, which waits for the reads still in flight); off
    poll_depth: int = 1
    poll_gap: int = 128
    # qkv's rotary halves (d, d + HD/2) and gate_up's gate and up columns as one product of twice the
    # width instead of two: their weight rows interleaved in one tile (a row at a time, so the loads
    # stay whole rows), the accumulator split in two after the K loop. Half the wgmma instructions (n16 /
    # n32 a warpgroup instead of n8 / n16) and one read of the activation tile from shared memory a K
    # block instead of two. Session 16 (sweep 35): pi0 691.9 against 731.6 us a step (qkv's slot 8.38 ->
    # 7.36 us, gate_up's 9.47 -> 8.61), the libero-pi0 call 1.027x (p10..p90 1.022..1.034, the same
    # actions bit for bit); pi0.5 601.0 against 613.9 us, its call 1.010x (1.004..1.016); on
    one_dot: bool = True
    # the matmul phases' K loops multiply the row block as a batch of products of this many rows (0: one
    # product of the whole block). At a 64-row block Triton issues a 64-row wgmma; as four 16-row products
    # it issues mma.sync, the instruction of the kernel at droid-pi0's 16-row block, whose qkv and gate_up
    # work ran shortest (session 26). Far slower at libero-pi0's 51 rows (session 27, sweep 39): 1065.9
    # against 688.4 us a step (qkv's work 5.89 -> 13.31 us, gate_up's 7.17 -> 16.64), the call 0.776x
    # (step_config_ab_libero-pi0_sub_m16.json). Off; needs one_dot; ignored where the block is not larger
    sub_m: int = 0


def sub_rows(cfg: StepKernelConfig, block_m: int) -> int:
    """The K loops' sub-block rows for a row block (StepKernelConfig.sub_m): 0 where it is off, does not divide
    the block into several, or one_dot is off."""
    sub = cfg.sub_m
    if sub <= 0 or not cfg.one_dot or sub >= block_m or block_m % sub or sub < 16:
        return 0
    return sub


def ssq_sum_mode(cfg: StepKernelConfig) -> int:
    """The K loops' way of summing the norm statistics' squares (_rows_matmul's SSQ_SUM): 0 across
    threads every K block, 1 `ssq_mma` (which takes precedence), 2 `ssq_local`."""
    return 1 if cfg.ssq_mma else 2 if cfg.ssq_local else 0


MIN_SPLITS = 5  # fit_config's least key splits (sweep 8's best at pi0's 51 rows)
WRITERS_SSQ_MAX_BLOCK = 16  # fit_config's largest row block with ssq_from_writers (measured at 16 and 64 rows)


def fit_config(cfg: StepKernelConfig, rows: int, samples: int, NH: int, HD: int, Tk: int, programs: int) -> StepKernelConfig:
    """`cfg` with its fitted fields (qkv_pairs -1, splits 0, merge_bd 0, ssq_from_writers -1) resolved for a
    launch of `programs` programs over `samples` x `rows` suffix rows, NH query heads of dim HD and Tk keys.
    Every user of these fields (the launch, its counter targets, the L2 model, the benches) resolves them here, so a
    head-dim split they cannot use (the key splits divide by it) is refused here too."""
    if cfg.att_dsplit < 1 or HD % cfg.att_dsplit or (HD // cfg.att_dsplit) & (HD // cfg.att_dsplit - 1):
        raise ValueError(f"StepKernelConfig.att_dsplit={cfg.att_dsplit}: expected a divisor of the head dim {HD} "
                         "leaving a power of two")
    pairs = cfg.qkv_pairs
    if pairs < 0:
        pairs = triton.cdiv((NH + 2) * (HD // 2), programs)
        pairs = pairs if pairs <= cfg.bn_qkv and not cfg.dataflow and not cfg.prefetch_own & 8 else 0
    row_blocks = samples * triton.cdiv(NH * rows, cfg.att_bm)
    splits = cfg.splits
    if splits <= 0:
        splits = min(max(MIN_SPLITS, programs // (row_blocks * cfg.att_dsplit)), triton.cdiv(Tk, cfg.att_bn))
    merge_bd = cfg.merge_bd
    if merge_bd <= 0:
        merge_bd = min(32, HD)
        while merge_bd < HD and row_blocks * (HD // merge_bd) > programs:
            merge_bd *= 2
    writers = cfg.ssq_from_writers
    if writers < 0:  # (pi0.5's launches read the writers' statistics whatever this says)
        writers = int(samples == 1 and row_block(rows) <= WRITERS_SSQ_MAX_BLOCK)
    return replace(cfg, qkv_pairs=pairs, splits=splits, merge_bd=merge_bd, ssq_from_writers=writers)


# ------------------------------------------------------------------------ helpers


@triton.jit
def _grid_sync(counter_ptr, err_ptr, nprog, MAX_SPIN: tl.constexpr, POLL_LOAD: tl.constexpr):
    _count_in(counter_ptr)  # every thread's stores are issued before this program arrives
    if POLL_LOAD:  # spin on plain (volatile) loads, then one acquiring read-modify-write
        spins = 0
        while (tl.load(counter_ptr, volatile=True) < nprog) & (spins < MAX_SPIN):
            spins += 1
        tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        if spins >= MAX_SPIN:
            tl.atomic_xchg(err_ptr, 1)
    else:  # every poll an acquiring atomic
        _poll_atomic(counter_ptr, nprog, err_ptr, MAX_SPIN)
    tl.debug_barrier()


@triton.jit
def _poll_atomic(counter_ptr, target, err_ptr, MAX_SPIN: tl.constexpr):
    """Every thread polls with acquiring atomics until `counter_ptr` reads >= `target`; after
    MAX_SPIN polls it gives up and raises the timeout flag."""
    spins = 0
    while (tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target) & (spins < MAX_SPIN):
        spins += 1
    if spins >= MAX_SPIN:
        tl.atomic_xchg(err_ptr, 1)


@triton.jit
def _poll_one(ptr, target, err_ptr, MAX_SPIN: tl.constexpr):
    """Thread 0 spins in PTX (a loop in Triton would run on every thread) with `ld.acquire`
    until the int32 at `ptr` (a 1-element pointer block) reads >= `target`; after MAX_SPIN
    polls it gives up and raises the timeout flag. The caller's bar.sync holds the others."""
    timed_out = tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t, v, n; mov.u32 $0, 0; mov.u32 t, %tid.x; setp.ne.u32 p, t, 0; "
        "@p bra DONE${:uid}; mov.u32 n, 0; "
        "SPIN${:uid}: ld.acquire.gpu.global.u32 v, [$1]; setp.ge.s32 p, v, $2; @p bra DONE${:uid}; "
        "add.u32 n, n, 1; setp.lt.u32 p, n, $3; @p bra SPIN${:uid}; mov.u32 $0, 1; DONE${:uid}: }",
        "=r,l,r,r", [ptr, target + tl.zeros((1,), tl.int32), MAX_SPIN + tl.zeros((1,), tl.int32)],
        dtype=tl.int32, is_pure=False, pack=1)
    if tl.max(timed_out, axis=0) > 0:
        tl.atomic_xchg(err_ptr, 1)


def _staggered_poll_ptx(depth: int) -> str:
    """PTX for thread 0's grid-barrier poll with `depth` relaxed loads in flight, issued `$4` clock
    cycles apart (StepKernelConfig.poll_depth / poll_gap): an L2 read every gap cycles instead of one a
    round trip, so the count's completion is seen sooner. The load that sees it is followed by
    `fence.acq_rel.gpu` (a relaxed read then a fence: the acquire pattern of PTX's memory model), which
    orders the block's later loads as `ld.acquire` did. Operands: $0 timed out, $1 counter, $2 target,
    $3 most polls, $4 gap."""
    regs = ", ".join(f"v{i}" for i in range(depth))

    def load_then_gap(i: int, tag: str) -> str:
        return (f"ld.relaxed.gpu.global.u32 v{i}, [$1]; mov.u32 c0, %clock; "
                f"G{tag}${{:uid}}: mov.u32 c1, %clock; sub.u32 c1, c1, c0; setp.lt.u32 q, c1, $4; @q bra G{tag}${{:uid}}; ")

    ptx = (f"{{ .reg .pred p, q; .reg .u32 t, n, c0, c1, {regs}; mov.u32 $0, 0; mov.u32 t, %tid.x; "
           "setp.ne.u32 p, t, 0; @p bra DONE${:uid}; mov.u32 n, 0; ")
    ptx += "".join(load_then_gap(i, f"a{i}") for i in range(depth))
    ptx += "LOOP${:uid}: "
    for i in range(depth):
        ptx += f"setp.ge.s32 p, v{i}, $2; @p bra HIT${{:uid}}; " + load_then_gap(i, f"b{i}")
    ptx += (f"add.u32 n, n, {depth}; setp.lt.u32 p, n, $3; @p bra LOOP${{:uid}}; mov.u32 $0, 1; bra DONE${{:uid}}; "
            "HIT${:uid}: fence.acq_rel.gpu; DONE${:uid}: }")
    return ptx


STAGGERED_POLL_2 = tl.constexpr(_staggered_poll_ptx(2))
STAGGERED_POLL_3 = tl.constexpr(_staggered_poll_ptx(3))
STAGGERED_POLL_4 = tl.constexpr(_staggered_poll_ptx(4))


@triton.jit
def _poll_staggered(ptr, target, err_ptr, MAX_SPIN: tl.constexpr, DEPTH: tl.constexpr, GAP: tl.constexpr):
    """_poll_one with DEPTH (2-4) polls in flight, GAP clock cycles apart (_staggered_poll_ptx)."""
    args = [ptr, target + tl.zeros((1,), tl.int32), MAX_SPIN + tl.zeros((1,), tl.int32), GAP + tl.zeros((1,), tl.int32)]
    if DEPTH == 2:
        timed_out = tl.inline_asm_elementwise(STAGGERED_POLL_2, "=r,l,r,r,r", args, dtype=tl.int32, is_pure=False, pack=1)
    elif DEPTH == 3:
        timed_out = tl.inline_asm_elementwise(STAGGERED_POLL_3, "=r,l,r,r,r", args, dtype=tl.int32, is_pure=False, pack=1)
    else:
        timed_out = tl.inline_asm_elementwise(STAGGERED_POLL_4, "=r,l,r,r,r", args, dtype=tl.int32, is_pure=False, pack=1)
    if tl.max(timed_out, axis=0) > 0:
        tl.atomic_xchg(err_ptr, 1)


@triton.jit
def _count_in(counter_ptr):
    """Count this program in at `counter_ptr` once every thread's stores are issued (release)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_count(counter_ptr, target, err_ptr, MAX_SPIN: tl.constexpr, ASM: tl.constexpr):
    """Wait (acquire) until `counter_ptr` reads `target`: thread 0 polls in PTX while the block
    waits at bar.sync (ASM, CUDA), or every thread polls with acquiring atomics (the
    interpreter, where the counters are complete already: one launch per phase)."""
    if ASM:
        _poll_one(counter_ptr + tl.zeros((1,), tl.int32), target, err_ptr, MAX_SPIN)
    else:
        _poll_atomic(counter_ptr, target, err_ptr, MAX_SPIN)
    tl.debug_barrier()


@triton.jit
def _grid_sync_asm(counter_ptr, err_ptr, nprog, MAX_SPIN: tl.constexpr, POLL_ONE: tl.constexpr,
                   POLL_DEPTH: tl.constexpr = 1, POLL_GAP: tl.constexpr = 0):
    """The same barrier with lighter instructions: one thread arrives with `red.release` (no
    value comes back, so it does not wait for the round trip) and polls with `ld.acquire`,
    which orders later loads without a closing atomic. POLL_ONE: only that thread polls and
    the others wait at the block barrier after it (as CUDA's cooperative grid sync does);
    else every thread polls, and each poll is an L1 invalidation (`CCTL.IVALL`) on every
    thread: the hottest instruction of the kernel in Nsight Compute (docs/perf-notes.md)."""
    tl.debug_barrier()
    ptr = counter_ptr + tl.zeros((1,), tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p red.release.gpu.global.add.s32 [$1], 1; mov.u32 $0, 0; }",
        "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    if POLL_ONE:
        if POLL_DEPTH > 1:
            _poll_staggered(ptr, nprog, err_ptr, MAX_SPIN, POLL_DEPTH, POLL_GAP)
        else:
            _poll_one(ptr, nprog, err_ptr, MAX_SPIN)
    else:
        spins = 0
        seen = tl.max(tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                                is_pure=False, pack=1), axis=0)
        while (seen < nprog) & (spins < MAX_SPIN):
            spins += 1
            seen = tl.max(tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                                    is_pure=False, pack=1), axis=0)
        if spins >= MAX_SPIN:
            tl.atomic_xchg(err_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _last_to_arrive(counter_ptr, expected):
    """Count this program in at `counter_ptr` once its stores are issued; True for the one
    that arrives last (`expected` arrivals in all), which may then read what the others
    stored: the acq_rel atomic orders their stores before its loads (.cg, from L2)."""
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == expected - 1


@triton.jit
def _now():
    """The GPU's global nanosecond clock (`%globaltimer`, the same on every SM): the timeline."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.zeros((1,), tl.int32)], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _dot(a, b, acc=None):
    """a @ b (+ acc): tl.dot with the operands' precision. Float32 operands multiply in IEEE float32, as torch's
    float32 matmul does; Triton's default for them is TF32 (10-bit mantissas, ~1e-3 relative a product), which
    put suffix_attention's float32 libero-pi0 at 7.9e-4 rel L2 against float32's 1e-4 (session 66). The dtype
    is known when the kernel compiles, so bfloat16 operands compile to the same tensor-core dot as before."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _rows_k_block(k0, acc, acc2, ssq, a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, cols, cols2, col_ok, K,
                  BLOCK_K: tl.constexpr, TWO: tl.constexpr, SSQ: tl.constexpr, SSQ_SUM: tl.constexpr = 0,
                  SUB_M: tl.constexpr = 0):
    """One K block [k0, k0 + BLOCK_K) of _rows_matmul (SUB_M: acc is (BLOCK_M / SUB_M, SUB_M, BLOCK_N))."""
    ks = k0 + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    a = tl.load(a_ptr + rows[:, None] * stride_a + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                cache_modifier=".cg")
    w_mask = col_ok[:, None] & k_ok[None, :]
    w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
    if SUB_M > 0:  # the row block as a batch of SUB_M-row products against the one weight tile
        SUBS: tl.constexpr = a.shape[0] // SUB_M
        wt = tl.broadcast_to(tl.expand_dims(tl.trans(w), 0), (SUBS, BLOCK_K, w.shape[0]))
        acc = _dot(tl.reshape(a, (SUBS, SUB_M, BLOCK_K)), wt, acc)
    else:
        acc += _dot(a, tl.trans(w))
    if TWO:
        w2 = tl.load(w_ptr + cols2[:, None] * stride_w + ks[None, :], mask=w_mask, other=0.0,
                     eviction_policy="evict_first")
        acc2 += _dot(a, tl.trans(w2))
    if SSQ:
        if SSQ_SUM == 1:  # the squares summed by the tensor cores: (a * a) @ ones, every column the row's sum
            ssq = _dot(a * a, tl.full((BLOCK_K, 16), 1.0, a.dtype), ssq)
        elif SSQ_SUM == 2:  # each thread adds up its own 8-element runs; across threads once after the loop
            af = a.to(tl.float32)
            ssq += tl.sum(tl.reshape(af * af, (a.shape[0], BLOCK_K // 8, 8)), axis=2)
        else:
            af = a.to(tl.float32)
            ssq += tl.sum(af * af, axis=1)
    return acc, acc2, ssq


@triton.jit
def _rows_matmul(a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, cols, cols2, col_ok, K, rot,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 TWO: tl.constexpr, SSQ: tl.constexpr, STAGES: tl.constexpr, ROTATE: tl.constexpr,
                 SSQ_SUM: tl.constexpr = 0, SUB_M: tl.constexpr = 0):
    """acc = A[rows] @ W[cols]^T (and acc2 with W[cols2] if TWO), float32; ssq = per-row sum
    of squares of A (if SSQ). A rows are activations written in this kernel: .cg loads.
    SSQ_SUM: how the squares are summed. 0: a reduction across the threads in every K block;
    1 (ssq_mma): a product with a block of ones on the tensor cores (the squares of bf16
    activations rounded to bf16, the sum in float32), one pick after the loop; 2 (ssq_local):
    each thread keeps float32 sums of its own 8-element runs, reduced across threads once
    after the loop.

    ROTATE: start at K block `rot` (the task's tile) and wrap around. Every task of a phase
    reads the same activations; in step they would all ask L2 for the same lines at once,
    rotated they spread over the K blocks. `rot` comes from the task, not the program, so the
    persistent launch still equals the per-phase launches bit for bit. (The loop counts blocks
    so that Triton still pipelines it: a modulo on a strided loop's variable stopped that.)

    SUB_M (sub_m, not with TWO): each K block's product as BLOCK_M / SUB_M products of SUB_M rows (a
    batched dot, which Triton compiles to mma.sync rather than a 64-row wgmma), the accumulator kept
    in that shape and made (BLOCK_M, BLOCK_N) once after the loop."""
    tl.static_assert((SUB_M == 0) | (not TWO), "sub_m needs one_dot")
    if SUB_M > 0:
        acc = tl.zeros((BLOCK_M // SUB_M, SUB_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SSQ_SUM == 1:
        ssq = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
    elif SSQ_SUM == 2:
        ssq = tl.zeros((BLOCK_M, BLOCK_K // 8), dtype=tl.float32)
    else:
        ssq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if ROTATE:
        n_k = tl.cdiv(K, BLOCK_K)
        for i in tl.range(0, n_k, num_stages=STAGES):
            acc, acc2, ssq = _rows_k_block(((i + rot) % n_k) * BLOCK_K, acc, acc2, ssq, a_ptr, stride_a, rows, row_ok,
                                           w_ptr, stride_w, cols, cols2, col_ok, K, BLOCK_K, TWO, SSQ, SSQ_SUM, SUB_M)
    else:
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc, acc2, ssq = _rows_k_block(k0, acc, acc2, ssq, a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, cols,
                                           cols2, col_ok, K, BLOCK_K, TWO, SSQ, SSQ_SUM, SUB_M)
    if SUB_M > 0:
        acc = tl.reshape(acc, (BLOCK_M, BLOCK_N))
    if SSQ_SUM == 1:
        ssq = tl.max(ssq, axis=1)  # the 16 columns hold the same sum
    elif SSQ_SUM == 2:
        ssq = tl.sum(ssq, axis=1)
    return acc, acc2, ssq


@triton.jit
def _rows_matmul_pair(a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, cols, cols2, col_ok, K, rot,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SSQ: tl.constexpr,
                      STAGES: tl.constexpr, ROTATE: tl.constexpr, SSQ_SUM: tl.constexpr, ONE_DOT: tl.constexpr,
                      SUB_M: tl.constexpr = 0):
    """_rows_matmul with TWO: A[rows] @ W[cols]^T and A[rows] @ W[cols2]^T. ONE_DOT (one_dot): as one
    product over the interleaved rows (cols[0], cols2[0], cols[1], ...), 2 BLOCK_N wide, whose
    accumulator's even and odd columns are the two results."""
    if ONE_DOT:
        wide_cols = tl.reshape(tl.join(cols, cols2), (2 * BLOCK_N,))
        wide_ok = tl.reshape(tl.join(col_ok, col_ok), (2 * BLOCK_N,))
        acc, _unused, ssq = _rows_matmul(a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, wide_cols, wide_cols, wide_ok,
                                         K, rot, BLOCK_M, 2 * BLOCK_N, BLOCK_K, False, SSQ, STAGES, ROTATE, SSQ_SUM, SUB_M)
        acc1, acc2 = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    else:
        acc1, acc2, ssq = _rows_matmul(a_ptr, stride_a, rows, row_ok, w_ptr, stride_w, cols, cols2, col_ok, K, rot,
                                       BLOCK_M, BLOCK_N, BLOCK_K, True, SSQ, STAGES, ROTATE, SSQ_SUM)
    return acc1, acc2, ssq


@triton.jit
def _prefetch_l2(base_ptr, n_elems, pid, nprog, ELEMS_PER_LINE: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 for this program's share of the weights [base, base + n_elems) that a later
    phase reads: their loads then hit L2 instead of waiting on HBM. Weights do not depend
    on activations, so this runs ahead of the barriers (prefetch.global.L2, one per line)."""
    n_lines = tl.cdiv(n_elems, ELEMS_PER_LINE)
    share = tl.cdiv(n_lines, nprog)
    first = pid * share
    for l0 in range(first, first + share, LINES):
        lines = l0 + tl.arange(0, LINES)
        lines = tl.where((lines < first + share) & (lines < n_lines), lines, first)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [base_ptr + lines.to(tl.int64) * ELEMS_PER_LINE], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_tile_l2(w_ptr, rows, stride_w, K_LEN: tl.constexpr, ELEMS_PER_LINE: tl.constexpr):
    """Ask L2 for K_LEN elements of each of the weight rows `rows` from w_ptr (a task's tile)."""
    lines = tl.arange(0, K_LEN // ELEMS_PER_LINE) * ELEMS_PER_LINE
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_w + lines[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_next_task(phase, layer, pid, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, L,
                        D: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr, F: tl.constexpr,
                        BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr,
                        KS_O: tl.constexpr, KS_GU: tl.constexpr, KS_DOWN: tl.constexpr, ELEMS_PER_LINE: tl.constexpr,
                        PHASES: tl.constexpr):
    """StepKernelConfig.prefetch_own (PHASES, its bit mask): the weights of this program's task (task = pid: every
    matmul phase has at most one task a program at the default tiles; a program with more
    prefetches its first) in the phase after `phase`, to L2. The tile and slice arithmetic is
    the phases' own (_phase_residual, _phase_gate_up, _phase_qkv)."""
    if phase == 2:  # -> o_proj: wo (D, NH*HD), tile of BN_O rows x one K-slice
        if (pid < (D // BN_O) * KS_O) & ((PHASES & 1) != 0):
            rows = (pid // KS_O) * BN_O + tl.arange(0, BN_O)
            K_O: tl.constexpr = NH * HD // KS_O
            _prefetch_tile_l2(wo_ptr + layer * (D * NH * HD) + (pid % KS_O) * K_O, rows, NH * HD, K_O, ELEMS_PER_LINE)
    elif phase == 3:  # -> gate_up: wgu (2F, D), the tile's gate rows and its up rows
        if (pid < (F // BN_GU) * KS_GU) & ((PHASES & 2) != 0):
            rows = (pid // KS_GU) * BN_GU + tl.arange(0, BN_GU)
            K_GU: tl.constexpr = D // KS_GU
            base = wgu_ptr + layer * (2 * F * D) + (pid % KS_GU) * K_GU
            _prefetch_tile_l2(base, rows, D, K_GU, ELEMS_PER_LINE)
            _prefetch_tile_l2(base, rows + F, D, K_GU, ELEMS_PER_LINE)
    elif phase == 4:  # -> down: wd (D, F), tile of BN_DOWN rows x one K-slice
        if (pid < (D // BN_DOWN) * KS_DOWN) & ((PHASES & 4) != 0):
            rows = (pid // KS_DOWN) * BN_DOWN + tl.arange(0, BN_DOWN)
            K_DOWN: tl.constexpr = F // KS_DOWN
            _prefetch_tile_l2(wd_ptr + layer * (D * F) + (pid % KS_DOWN) * K_DOWN, rows, F, K_DOWN, ELEMS_PER_LINE)
    elif phase == 5:  # -> the next layer's qkv: a slot's BN_QKV rotary pairs (d, d + HD/2)
        HALF: tl.constexpr = HD // 2
        JB: tl.constexpr = (HALF + BN_QKV - 1) // BN_QKV
        if (pid < (NH + 2) * JB) & (layer + 1 < L) & ((PHASES & 8) != 0):
            d1 = (pid % JB) * BN_QKV + tl.arange(0, BN_QKV)
            rows = (pid // JB) * HD + tl.minimum(d1, HALF - 1)
            base = wqkv_ptr + (layer + 1) * ((NH * HD + 2 * HD) * D)
            _prefetch_tile_l2(base, rows, D, D, ELEMS_PER_LINE)
            _prefetch_tile_l2(base, rows + HALF, D, D, ELEMS_PER_LINE)


@triton.jit
def _load_ssq_tiles(ssq_ptr, rows, TILES: tl.constexpr, BLOCK_M: tl.constexpr):
    """The per-tile sums of squares as one (tiles, rows) block, loaded, not yet added
    (StepKernelConfig.stats_ahead: issued before a K loop, added after it by _add_ssq_tiles).
    TILES is a power of two (ssq_constexprs turns stats_ahead off otherwise)."""
    t = tl.arange(0, TILES)
    return tl.load(ssq_ptr + t[:, None] * BLOCK_M + rows[None, :], cache_modifier=".cg")


@triton.jit
def _add_ssq_tiles(block):
    return tl.sum(block, axis=0)


@triton.jit
def _sum_ssq_tiles(ssq_ptr, rows, TILES: tl.constexpr, BLOCK_M: tl.constexpr):
    """MOD: the per-row sum of squares of x from the per-tile partials its writers left
    (_phase_residual), added in tile order (the same bits in every program)."""
    ssq = tl.zeros((BLOCK_M,), tl.float32)
    for t in tl.static_range(TILES):
        ssq += tl.load(ssq_ptr + t * BLOCK_M + rows, cache_modifier=".cg")
    return ssq


# ------------------------------------------------------------------------ phases


@triton.jit
def _before_k_loop(bias_ptr, second, bias_ok, ssq_ptr, rows, x_ptr, xm_ptr, MOD: tl.constexpr, LOADED: tl.constexpr,
                   EARLY_MOD: tl.constexpr, AHEAD: tl.constexpr, SSQ_TILES: tl.constexpr, BLOCK_M: tl.constexpr):
    """What qkv and gate_up load before their K loop when the norm statistics come from the writers'
    tiles (SSQ_IN): pi0.5's two biases (at bias_ptr and bias_ptr + second: qkv's rotate-half
    partners, gate_up's up columns) under early_mod_loads / stats_ahead (LOADED), the statistics
    summed there (EARLY_MOD) or their block (AHEAD, added after the loop); and the activations the
    product reads (pi0.5: xm = x (1 + scale)). What a flag does not ask for is 0.0, never read."""
    bias1 = 0.0
    bias2 = 0.0
    ssq_pre = 0.0
    ssq_block = 0.0
    if MOD:
        if LOADED:  # the biases ahead of the loop (early_mod_loads, stats_ahead)
            bias1 = tl.load(bias_ptr, mask=bias_ok, other=0.0)
            bias2 = tl.load(bias_ptr + second, mask=bias_ok, other=0.0)
        if EARLY_MOD:  # and the statistics, summed there
            ssq_pre = _sum_ssq_tiles(ssq_ptr, rows, SSQ_TILES, BLOCK_M)
    if AHEAD:
        ssq_block = _load_ssq_tiles(ssq_ptr, rows, SSQ_TILES, BLOCK_M)
    a_ptr = x_ptr
    if MOD:
        a_ptr = xm_ptr
    return bias1, bias2, ssq_pre, ssq_block, a_ptr


@triton.jit
def _rope_tables(cos_ptr, sin_ptr, rows, d1, mask, HD: tl.constexpr):
    """The RoPE tables of qkv's tile, in the tables' dtype: cos and sin at the lanes' dims d1 and at
    their rotate-half partners d1 + HD/2, for the rows."""
    t = rows[:, None] * HD + d1[None, :]
    return (tl.load(cos_ptr + t, mask=mask, other=0.0), tl.load(sin_ptr + t, mask=mask, other=0.0),
            tl.load(cos_ptr + t + HD // 2, mask=mask, other=0.0), tl.load(sin_ptr + t + HD // 2, mask=mask, other=0.0))


@triton.jit
def _phase_qkv(x_ptr, wqkv_ptr, q_ptr, kv_ptr, cos_ptr, sin_ptr, slot_ctr_ptr, M, eps, pid, nprog,
               D: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr,
               BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, ROTATE: tl.constexpr,
               DATAFLOW: tl.constexpr, mod_ptr=None, xm_ptr=None, ssq_ptr=None, MOD: tl.constexpr = False,
               SSQ_TILES: tl.constexpr = 1, EARLY_MOD: tl.constexpr = False, SSQ_IN: tl.constexpr = False,
               AHEAD: tl.constexpr = False, ROPE_AHEAD: tl.constexpr = False, PAIRS: tl.constexpr = 0,
               SSQ_SUM: tl.constexpr = 0, ONE_DOT: tl.constexpr = False, SUB_M: tl.constexpr = 0):
    """DATAFLOW: each task counts itself in at its slot's counter (query head, k or v) once
    its outputs are stored, for the attention tasks that wait on them.
    MOD (pi0.5's adaptive norm, n (1 + scale) + shift): the product reads xm = x (1 + scale),
    which the previous phase's writers stored with x, and the norm's statistics from their
    per-tile partials (ssq_ptr); mod_ptr + D holds shift @ Wqkv^T (modulation_table):
    (n (1 + scale) + shift) @ W^T = inv (x (1 + scale)) @ W^T + shift @ W^T.
    SSQ_IN (pi0 with ssq_from_writers): the statistics come from ssq_ptr too, the K loop reads x.
    AHEAD (stats_ahead): the statistics' block and the biases are loaded before the K loop.
    ROPE_AHEAD (rope_ahead): so are the RoPE tables of the tile (none for the value slot).
    PAIRS (qkv_pairs): a task is PAIRS consecutive pairs of all (NH + 2) * HD/2, so its lanes may
    belong to two slots; the slot, the RoPE and the destination are then chosen lane by lane."""
    HALF: tl.constexpr = HD // 2
    LOADED: tl.constexpr = EARLY_MOD | AHEAD  # the biases were loaded before the loop
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    n_jb = tl.cdiv(HALF, BN)
    if PAIRS > 0:
        n_tasks = tl.cdiv((NH + 2) * HALF, PAIRS)
    else:
        n_tasks = (NH + 2) * n_jb
    for task in range(pid, n_tasks, nprog):
        if PAIRS > 0:
            lane = tl.arange(0, BN)
            pair = task * PAIRS + lane
            d_ok = (lane < PAIRS) & (pair < (NH + 2) * HALF)
            slot_v = pair // HALF  # per lane: 0..NH-1 query heads, NH the key, NH+1 the value
            d1 = pair % HALF
            cols = slot_v * HD + d1
            rope_lane = d_ok & (slot_v <= NH)
        else:
            slot = task // n_jb  # 0..NH-1 query heads, NH the key, NH+1 the value
            d1 = (task % n_jb) * BN + tl.arange(0, BN)
            d_ok = d1 < HALF
            cols = slot * HD + d1
            rope_lane = d_ok & ((d1 * 0 + slot) <= NH)  # not the value slot
        if ROPE_AHEAD:  # in the table's dtype until used
            rope_ok = row_ok[:, None] & rope_lane[None, :]
            c1_ahead, s1_ahead, c2_ahead, s2_ahead = _rope_tables(cos_ptr, sin_ptr, rows, d1, rope_ok, HD)
        if SSQ_IN:  # (Triton folds constexpr conditions one name at a time: no `or` in them)
            bias1, bias2, ssq_pre, ssq_block, a_ptr = _before_k_loop(
                mod_ptr + D + cols, HALF, d_ok, ssq_ptr, rows, x_ptr, xm_ptr, MOD, LOADED, EARLY_MOD, AHEAD, SSQ_TILES,
                BLOCK_M)
            acc1, acc2, ssq = _rows_matmul_pair(a_ptr, D, rows, row_ok, wqkv_ptr, D, cols, cols + HALF, d_ok, D, task,
                                                BLOCK_M, BN, BK, False, STAGES, ROTATE, 0, ONE_DOT, SUB_M)
            if AHEAD:
                ssq = _add_ssq_tiles(ssq_block)
            elif EARLY_MOD:
                ssq = ssq_pre
            else:
                ssq = _sum_ssq_tiles(ssq_ptr, rows, SSQ_TILES, BLOCK_M)
        else:
            acc1, acc2, ssq = _rows_matmul_pair(x_ptr, D, rows, row_ok, wqkv_ptr, D, cols, cols + HALF, d_ok, D, task,
                                                BLOCK_M, BN, BK, True, STAGES, ROTATE, SSQ_SUM, ONE_DOT, SUB_M)
        inv = 1.0 / tl.sqrt(ssq / D + eps)
        acc1 = acc1 * inv[:, None]
        acc2 = acc2 * inv[:, None]
        if MOD:
            if LOADED:
                acc1 += bias1[None, :]
                acc2 += bias2[None, :]
            else:
                acc1 += tl.load(mod_ptr + D + cols, mask=d_ok, other=0.0)[None, :]
                acc2 += tl.load(mod_ptr + D + cols + HALF, mask=d_ok, other=0.0)[None, :]
        mask = row_ok[:, None] & d_ok[None, :]
        if PAIRS > 0:  # lane by lane: RoPE where the lane's slot is a query head or the key
            if ROPE_AHEAD:
                c1, s1 = c1_ahead.to(tl.float32), s1_ahead.to(tl.float32)
                c2, s2 = c2_ahead.to(tl.float32), s2_ahead.to(tl.float32)
            else:
                c1, s1, c2, s2 = _rope_tables(cos_ptr, sin_ptr, rows, d1, row_ok[:, None] & rope_lane[None, :], HD)
                c1, s1, c2, s2 = c1.to(tl.float32), s1.to(tl.float32), c2.to(tl.float32), s2.to(tl.float32)
            out1 = tl.where(rope_lane[None, :], acc1 * c1 - acc2 * s1, acc1)
            out2 = tl.where(rope_lane[None, :], acc2 * c2 + acc1 * s2, acc2)
            # queries to q, the key and the value to their scratch rows (the other pointer is not dereferenced)
            dst = tl.where((slot_v < NH)[None, :], q_ptr + rows[:, None] * (NH * HD) + (slot_v * HD + d1)[None, :],
                           kv_ptr + rows[:, None] * HD + ((slot_v - NH) * (BLOCK_M * HD) + d1)[None, :])
            tl.store(dst, out1.to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF, out2.to(q_ptr.dtype.element_ty), mask=mask)
        else:
            if slot <= NH:  # RoPE (rotate-half): (x1, x2) -> (x1 cos1 - x2 sin1, x2 cos2 + x1 sin2)
                if ROPE_AHEAD:
                    c1, s1 = c1_ahead.to(tl.float32), s1_ahead.to(tl.float32)
                    c2, s2 = c2_ahead.to(tl.float32), s2_ahead.to(tl.float32)
                else:
                    c1, s1, c2, s2 = _rope_tables(cos_ptr, sin_ptr, rows, d1, mask, HD)
                    c1, s1, c2, s2 = c1.to(tl.float32), s1.to(tl.float32), c2.to(tl.float32), s2.to(tl.float32)
                out1 = acc1 * c1 - acc2 * s1
                out2 = acc2 * c2 + acc1 * s2
            else:
                out1 = acc1
                out2 = acc2
            if slot < NH:
                dst = q_ptr + rows[:, None] * (NH * HD) + slot * HD + d1[None, :]
            else:  # scratch k (slot NH) / v (slot NH + 1): (2, BLOCK_M, HD)
                dst = kv_ptr + (slot - NH) * BLOCK_M * HD + rows[:, None] * HD + d1[None, :]
            tl.store(dst, out1.to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF, out2.to(q_ptr.dtype.element_ty), mask=mask)
        if DATAFLOW:
            _count_in(slot_ctr_ptr + slot)


@triton.jit
def _phase_attention(q_ptr, kv_ptr, kc_ptr, vc_ptr, mask_ptr, acc_ptr, ml_ptr, o_ptr, row_ctr_ptr, M, Tk, Tp,
                     keys_per_split, scale, stride_cb, stride_ct, stride_mb, stride_mq, pid, nprog,
                     NH: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, ABM: tl.constexpr,
                     ABN: tl.constexpr, SPLITS: tl.constexpr, MASK_VALUE: tl.constexpr, ATT_STAGES: tl.constexpr,
                     FOLD_MERGE: tl.constexpr, MD: tl.constexpr, EARLY_V: tl.constexpr, ROTATE: tl.constexpr,
                     NB: tl.constexpr, slot_ctr_ptr, err_ptr, QKV_JB: tl.constexpr, DATAFLOW: tl.constexpr,
                     MAX_SPIN: tl.constexpr, ASM: tl.constexpr, ADS: tl.constexpr = 1):
    """NB samples: a task is (sample, block of ABM folded rows, key split); its rows are
    head x token of one sample, so they share that sample's keys and mask. Partials are
    indexed by the global folded row g = sample * R + r. ADS > 1 (`att_dsplit`): the task is also
    one of ADS parts of the value / output dims; it computes the full scores (the same m and l in
    every part, bit for bit) and writes its part of the partial output, part 0 the m and l.

    DATAFLOW (no grid barrier after qkv): a task first waits until the qkv tasks of its rows'
    heads (QKV_JB each), and of k and v if its split reads this step's own keys, have counted
    in; it counts itself in at its row block's counter once its partials are stored."""
    R = NH * M
    d = tl.arange(0, HD)
    VD: tl.constexpr = HD // ADS  # the value / output dims of a task
    n_rb = tl.cdiv(R, ABM)
    for task in range(pid, NB * n_rb * SPLITS * ADS, nprog):
        if ADS == 1:  # (the default kernel's code as before att_dsplit)
            s = task % SPLITS
            blk = task // SPLITS
            dv = d
        else:
            part = task % ADS
            s = (task // ADS) % SPLITS
            blk = task // (ADS * SPLITS)
            dv = part * VD + tl.arange(0, VD)
        if NB == 1:
            b = 0
            r = blk * ABM + tl.arange(0, ABM)
        else:
            b = blk // n_rb
            r = (blk % n_rb) * ABM + tl.arange(0, ABM)
        r_ok = r < R
        head = r // M
        t = r % M
        row = b * M + t  # the token's row in x, q and the scratch k/v
        k_start = s * keys_per_split
        if DATAFLOW:
            r0 = (blk if NB == 1 else blk % n_rb) * ABM
            for hh in range(r0 // M, (tl.minimum(r0 + ABM, R) - 1) // M + 1):
                _wait_count(slot_ctr_ptr + hh, QKV_JB, err_ptr, MAX_SPIN, ASM)
            if k_start + keys_per_split > Tp:  # this split reads the step's own keys and values
                _wait_count(slot_ctr_ptr + NH, QKV_JB, err_ptr, MAX_SPIN, ASM)
                _wait_count(slot_ctr_ptr + NH + 1, QKV_JB, err_ptr, MAX_SPIN, ASM)
        q = tl.load(q_ptr + row[:, None] * (NH * HD) + head[:, None] * HD + d[None, :], mask=r_ok[:, None], other=0.0,
                    cache_modifier=".cg")
        m_i = tl.full((ABM,), float("-inf"), tl.float32)
        l_i = tl.zeros((ABM,), tl.float32)
        acc = tl.zeros((ABM, VD), tl.float32)
        n_kt = keys_per_split // ABN  # key tiles of a split (keys_per_split is a multiple of ABN)
        for j in tl.range(0, n_kt, num_stages=ATT_STAGES):
            # ROTATE: the row blocks of one split take its key tiles in different orders (see _rows_matmul)
            k0 = k_start + ((j + blk) % n_kt if ROTATE else j) * ABN
            keys = k0 + tl.arange(0, ABN)
            key_ok = (keys < Tk) & (keys < k_start + keys_per_split)
            # The prefix from the static cache, then this step's scratch k/v: one load through
            # per-key row pointers, each 16-byte aligned (the launcher checks the cache's base
            # and token stride), so the loads are 16-byte vectors. (Two masked loads joined by
            # a where loaded every tile twice and held three in registers; Triton 3.9 also
            # could not prove the alignment through the where and issued 2-byte loads.)
            cached = keys < Tp
            k_rows = tl.multiple_of(tl.where(cached, kc_ptr + b * stride_cb + keys * stride_ct,
                                             kv_ptr + (b * M + keys - Tp) * HD), 16)
            k = tl.load(k_rows[:, None] + d[None, :], mask=key_ok[:, None], other=0.0, cache_modifier=".cg")
            v_rows = tl.multiple_of(tl.where(cached, vc_ptr + b * stride_cb + keys * stride_ct,
                                             kv_ptr + (BLOCK_M + b * M + keys - Tp) * HD), 16)
            mask_ptrs = mask_ptr + b * stride_mb + t[:, None] * stride_mq + keys[None, :]
            if EARLY_V:  # values and mask in flight while the scores are computed: one round trip less a tile
                v = tl.load(v_rows[:, None] + dv[None, :], mask=key_ok[:, None], other=0.0, cache_modifier=".cg")
                allowed = tl.load(mask_ptrs, mask=r_ok[:, None] & key_ok[None, :], other=0)
            scores = _dot(q, tl.trans(k)).to(tl.float32) * scale
            if not EARLY_V:
                allowed = tl.load(mask_ptrs, mask=r_ok[:, None] & key_ok[None, :], other=0)
            scores = tl.where(allowed != 0, scores, MASK_VALUE)
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if not EARLY_V:
                v = tl.load(v_rows[:, None] + dv[None, :], mask=key_ok[:, None], other=0.0, cache_modifier=".cg")
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        g = b * R + r
        base = s * (NB * R) + g
        tl.store(acc_ptr + base[:, None] * HD + dv[None, :], acc, mask=r_ok[:, None])
        if ADS == 1:
            tl.store(ml_ptr + base, m_i, mask=r_ok)
            tl.store(ml_ptr + SPLITS * NB * R + base, l_i, mask=r_ok)
        elif part == 0:  # every part has the same m and l
            tl.store(ml_ptr + base, m_i, mask=r_ok)
            tl.store(ml_ptr + SPLITS * NB * R + base, l_i, mask=r_ok)
        if DATAFLOW:
            _count_in(row_ctr_ptr + blk)
        if FOLD_MERGE:  # the row block's last split to finish merges them all: no merge phase, one barrier less
            if _last_to_arrive(row_ctr_ptr + blk, SPLITS):
                for c in range(HD // MD):
                    _merge_rows(acc_ptr, ml_ptr, o_ptr, g, r_ok, c * MD + tl.arange(0, MD), M, R, NH, HD, SPLITS, NB)


@triton.jit
def _merge_rows(acc_ptr, ml_ptr, o_ptr, g, g_ok, dd, M, R, NH: tl.constexpr, HD: tl.constexpr, SPLITS: tl.constexpr,
                NB: tl.constexpr):
    """Attention output of the global folded rows g (sample * R + head * M + token), dims dd:
    the splits' partials weighted by exp(m_s - max m) and normalised by the summed l."""
    RR = NB * R
    m = tl.full(g.shape, float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):  # unrolled: the splits' loads are independent, issue them together
        m = tl.maximum(m, tl.load(ml_ptr + s * RR + g, mask=g_ok, other=float("-inf"), cache_modifier=".cg"))
    total = tl.zeros((g.shape[0], dd.shape[0]), tl.float32)
    norm = tl.zeros(g.shape, tl.float32)
    for s in tl.static_range(SPLITS):
        m_s = tl.load(ml_ptr + s * RR + g, mask=g_ok, other=float("-inf"), cache_modifier=".cg")
        w = tl.where(m_s > float("-inf"), tl.exp(m_s - m), 0.0)  # a split with no keys adds nothing
        norm += w * tl.load(ml_ptr + SPLITS * RR + s * RR + g, mask=g_ok, other=0.0, cache_modifier=".cg")
        part = tl.load(acc_ptr + (s * RR + g)[:, None] * HD + dd[None, :], mask=g_ok[:, None], other=0.0,
                       cache_modifier=".cg")
        total += w[:, None] * part
    if NB == 1:
        row = g % M
        head = g // M
    else:
        r = g % R
        row = (g // R) * M + r % M
        head = r // M
    tl.store(o_ptr + row[:, None] * (NH * HD) + head[:, None] * HD + dd[None, :],
             (total / norm[:, None]).to(o_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _phase_merge(acc_ptr, ml_ptr, o_ptr, row_ctr_ptr, err_ptr, M, pid, nprog,
                 NH: tl.constexpr, HD: tl.constexpr, ABM: tl.constexpr, SPLITS: tl.constexpr, MD: tl.constexpr,
                 NB: tl.constexpr, DATAFLOW: tl.constexpr, MAX_SPIN: tl.constexpr, ASM: tl.constexpr):
    """Tasks: (the attention's row blocks, per sample) x dim chunks. DATAFLOW (no grid barrier
    after attention): a task waits until its row block's SPLITS attention tasks counted in."""
    R = NH * M
    n_rb = tl.cdiv(R, ABM)
    n_dc: tl.constexpr = HD // MD
    for task in range(pid, NB * n_rb * n_dc, nprog):
        blk = task // n_dc
        dd = (task % n_dc) * MD + tl.arange(0, MD)
        if DATAFLOW:
            _wait_count(row_ctr_ptr + blk, SPLITS, err_ptr, MAX_SPIN, ASM)
        if NB == 1:
            r = blk * ABM + tl.arange(0, ABM)
            _merge_rows(acc_ptr, ml_ptr, o_ptr, r, r < R, dd, M, R, NH, HD, SPLITS, NB)
        else:
            r = (blk % n_rb) * ABM + tl.arange(0, ABM)
            _merge_rows(acc_ptr, ml_ptr, o_ptr, (blk // n_rb) * R + r, r < R, dd, M, R, NH, HD, SPLITS, NB)


@triton.jit
def _write_next(x_new, xm_ptr, ssq_ptr, scale_ptr, rows, cols, col_ok, mask, tile, write_next, D: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """_phase_residual's MOD epilogue: the tile's share of the next norm's inputs. Columns and
    rows outside the matrix hold zeros (masked loads), so they add nothing to the sums."""
    if write_next:
        xf = tl.where(mask, x_new.to(tl.float32), 0.0)
        scale = tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
        tl.store(xm_ptr + rows[:, None] * D + cols[None, :], (xf * scale[None, :]).to(xm_ptr.dtype.element_ty), mask=mask)
        tl.store(ssq_ptr + tile * BLOCK_M + rows, tl.sum(xf * xf, axis=1))


@triton.jit
def _store_next(x_new, xm_ptr, ssq_ptr, scale, rows, cols, mask, tile, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """_write_next with the scale already loaded (StepKernelConfig.early_mod_loads)."""
    xf = tl.where(mask, x_new.to(tl.float32), 0.0)
    tl.store(xm_ptr + rows[:, None] * D + cols[None, :], (xf * scale[None, :]).to(xm_ptr.dtype.element_ty), mask=mask)
    tl.store(ssq_ptr + tile * BLOCK_M + rows, tl.sum(xf * xf, axis=1))


@triton.jit
def _mod_prologue_kernel(x_ptr, scale_ptr, xm_ptr, ssq_ptr, MT, D: tl.constexpr, BLOCK_M: tl.constexpr, BN: tl.constexpr,
                         XM: tl.constexpr = True, USE_PDL: tl.constexpr = False):
    """MOD, before the step kernel: the first layer's xm and per-tile sums of squares, one tile
    of columns a program, as _write_next leaves them for every later layer (one small launch
    where torch took six: ~20 us a step on the H200, docs/perf-notes.md session 9). Not XM (pi0
    with ssq_from_writers): the sums of squares only."""
    pdl_wait(USE_PDL)
    tile = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < D
    mask = (rows < MT)[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
    if XM:
        _write_next(x, xm_ptr, ssq_ptr, scale_ptr, rows, cols, col_ok, mask, tile, 1, D, BLOCK_M)
    else:
        xf = tl.where(mask, x.to(tl.float32), 0.0)
        tl.store(ssq_ptr + tile * BLOCK_M + rows, tl.sum(xf * xf, axis=1))


@triton.jit
def _add_to_x(acc, gate, ptrs, mask, x_ptr, xm_ptr, ssq_ptr, scale_pre, scale_ptr, rows, cols, col_ok, tile, write_next,
              D: tl.constexpr, BLOCK_M: tl.constexpr, GATE: tl.constexpr, SCALE_LOADED: tl.constexpr,
              SSQ_OUT: tl.constexpr = False):
    """_phase_residual's write of a finished tile: x += acc (* gate), and with GATE the next
    norm's inputs (xm, the sums of squares), from the scale the caller loaded (SCALE_LOADED:
    early_mod_loads, scale_after_loop) or loaded here; SSQ_OUT (pi0, ssq_from_writers): the
    sums of squares only."""
    res = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    x_new = (acc * gate + res).to(x_ptr.dtype.element_ty)
    tl.store(ptrs, x_new, mask=mask)
    if GATE:
        if SCALE_LOADED:
            if write_next:
                _store_next(x_new, xm_ptr, ssq_ptr, scale_pre, rows, cols, mask, tile, D, BLOCK_M)
        else:
            _write_next(x_new, xm_ptr, ssq_ptr, scale_ptr, rows, cols, col_ok, mask, tile, write_next, D, BLOCK_M)
    elif SSQ_OUT:
        if write_next:
            xf = tl.where(mask, x_new.to(tl.float32), 0.0)
            tl.store(ssq_ptr + tile * BLOCK_M + rows, tl.sum(xf * xf, axis=1))


@triton.jit
def _phase_residual(a_ptr, K, w_ptr, x_ptr, part_ptr, tile_ctr_ptr, M, pid, nprog,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr,
                    STAGES: tl.constexpr, ROTATE: tl.constexpr, gate_ptr=None, scale_ptr=None, xm_ptr=None,
                    ssq_ptr=None, write_next=0, GATE: tl.constexpr = False, EARLY_MOD: tl.constexpr = False,
                    SCALE_AFTER_LOOP: tl.constexpr = False, SSQ_OUT: tl.constexpr = False, SUB_M: tl.constexpr = 0):
    """x[:, cols] += A @ W[cols]^T; GATE (pi0.5): x[:, cols] += (A @ W[cols]^T) gate[cols], and
    where `write_next`, also xm[:, cols] = x (1 + scale)[cols] (the next norm's modulated
    input, scale_ptr) and ssq[tile] = the rows' sums of squares over these columns, for the
    next matmul phase (_phase_qkv / _phase_gate_up with MOD): no pass over x of its own.
    SSQ_OUT (pi0, ssq_from_writers): only the sums of squares, where `write_next`.

    KS == 1: each task owns its columns of x (so in place is safe) and reads all of A.
    KS > 1 (split K): task (tile, s) multiplies only the K-slice s, so each program reads
    1/KS of the activations instead of all of them (for down: 104 KB of h instead of
    418 KB, the phase's largest cost), and twice as many programs have work. The partials
    go to `part` in float32; the last of a tile's KS tasks to finish adds them to x in the
    order s = 0..KS-1, so the result does not depend on which program finished first.
    """
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k_slice = K // KS
    for task in range(pid, tl.cdiv(D, BN) * KS, nprog):
        tile = task // KS  # a tile's KS tasks go to neighbouring programs and run side by side
        s = task % KS
        cols = tile * BN + tl.arange(0, BN)
        col_ok = cols < D
        scale_pre = 0.0  # read only when loaded below (GATE with EARLY_MOD or SCALE_AFTER_LOOP)
        if GATE:
            if EARLY_MOD:  # the gate and the next norm's scale, ahead of the loop
                gate_pre = tl.load(gate_ptr + cols, mask=col_ok, other=0.0)
                scale_pre = tl.load(scale_ptr + cols, mask=col_ok & ((cols * 0 + write_next) != 0), other=0.0)
        acc, _a, _s = _rows_matmul(a_ptr + s * k_slice, K, rows, row_ok, w_ptr + s * k_slice, K, cols, cols, col_ok,
                                   k_slice, tile, BLOCK_M, BN, BK, False, False, STAGES, ROTATE, 0, SUB_M)
        mask = row_ok[:, None] & col_ok[None, :]
        ptrs = x_ptr + rows[:, None] * D + cols[None, :]
        gate = 1.0
        if GATE:
            if EARLY_MOD:
                gate = gate_pre[None, :]
            else:
                gate = tl.load(gate_ptr + cols, mask=col_ok, other=0.0)[None, :]
                if SCALE_AFTER_LOOP:  # issued before the partial store and the arrival, used in the tail
                    scale_pre = tl.load(scale_ptr + cols, mask=col_ok & ((cols * 0 + write_next) != 0), other=0.0)
        SCALE_LOADED: tl.constexpr = EARLY_MOD or SCALE_AFTER_LOOP
        if KS == 1:
            _add_to_x(acc, gate, ptrs, mask, x_ptr, xm_ptr, ssq_ptr, scale_pre, scale_ptr, rows, cols, col_ok, tile,
                      write_next, D, BLOCK_M, GATE, SCALE_LOADED, SSQ_OUT)
        else:
            part = part_ptr + rows[:, None] * D + cols[None, :]
            tl.store(part + s * (BLOCK_M * D), acc, mask=mask)
            if _last_to_arrive(tile_ctr_ptr + tile, KS):
                total = tl.zeros((BLOCK_M, BN), tl.float32)
                for s2 in tl.static_range(KS):
                    total += tl.load(part + s2 * (BLOCK_M * D), mask=mask, other=0.0, cache_modifier=".cg")
                _add_to_x(total, gate, ptrs, mask, x_ptr, xm_ptr, ssq_ptr, scale_pre, scale_ptr, rows, cols, col_ok, tile,
                          write_next, D, BLOCK_M, GATE, SCALE_LOADED, SSQ_OUT)


@triton.jit
def _phase_gate_up(x_ptr, wgu_ptr, h_ptr, part_ptr, tile_ctr_ptr, M, eps, pid, nprog,
                   D: tl.constexpr, F: tl.constexpr, BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   KS: tl.constexpr, STAGES: tl.constexpr, ROTATE: tl.constexpr, mod_ptr=None, xm_ptr=None,
                   ssq_ptr=None, MOD: tl.constexpr = False, SSQ_TILES: tl.constexpr = 1, EARLY_MOD: tl.constexpr = False,
                   SSQ_IN: tl.constexpr = False, AHEAD: tl.constexpr = False, SSQ_SUM: tl.constexpr = 0,
                   ONE_DOT: tl.constexpr = False, SUB_M: tl.constexpr = 0):
    """h[:, cols] = gelu(n(x) @ Wg[cols]^T) * (n(x) @ Wu[cols]^T). KS > 1 splits D as in
    _phase_residual: each task's gate, up and sum-of-squares partials go to `part`, and the
    tile's last task adds them (in order) before the norm and GELU, which need the whole sums.
    MOD (pi0.5): n(x) is modulated, n (1 + scale) + shift: as in _phase_qkv, the product reads
    xm and the statistics come from ssq_ptr; mod_ptr + D holds shift @ Wgu^T over the 2F columns.
    SSQ_IN and AHEAD as in _phase_qkv."""
    LOADED: tl.constexpr = EARLY_MOD | AHEAD  # the biases were loaded before the loop
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k_slice = D // KS
    n_tiles = tl.cdiv(F, BN)
    for task in range(pid, n_tiles * KS, nprog):
        tile = task // KS
        s = task % KS
        cols = tile * BN + tl.arange(0, BN)
        col_ok = cols < F
        mask = row_ok[:, None] & col_ok[None, :]
        if SSQ_IN:
            bias_g, bias_u, ssq_pre, ssq_block, a_ptr = _before_k_loop(
                mod_ptr + D + cols, F, col_ok, ssq_ptr, rows, x_ptr, xm_ptr, MOD, LOADED, EARLY_MOD, AHEAD, SSQ_TILES,
                BLOCK_M)
            g, u, ssq = _rows_matmul_pair(a_ptr + s * k_slice, D, rows, row_ok, wgu_ptr + s * k_slice, D, cols, cols + F,
                                          col_ok, k_slice, tile, BLOCK_M, BN, BK, False, STAGES, ROTATE, 0, ONE_DOT, SUB_M)
        else:
            g, u, ssq = _rows_matmul_pair(x_ptr + s * k_slice, D, rows, row_ok, wgu_ptr + s * k_slice, D, cols, cols + F,
                                          col_ok, k_slice, tile, BLOCK_M, BN, BK, True, STAGES, ROTATE, SSQ_SUM, ONE_DOT,
                                          SUB_M)
        last = True
        if KS > 1:
            gu = part_ptr + rows[:, None] * (2 * F) + cols[None, :]  # (KS, BLOCK_M, 2F): gate columns, then up
            sq = part_ptr + KS * BLOCK_M * 2 * F + tile * BLOCK_M + rows  # then (KS, tiles, BLOCK_M)
            tl.store(gu + s * (BLOCK_M * 2 * F), g, mask=mask)
            tl.store(gu + s * (BLOCK_M * 2 * F) + F, u, mask=mask)
            tl.store(sq + s * (n_tiles * BLOCK_M), ssq)
            last = _last_to_arrive(tile_ctr_ptr + tile, KS)
            if last:
                g = tl.zeros((BLOCK_M, BN), tl.float32)
                u = tl.zeros((BLOCK_M, BN), tl.float32)
                ssq = tl.zeros((BLOCK_M,), tl.float32)
                for s2 in tl.static_range(KS):
                    g += tl.load(gu + s2 * (BLOCK_M * 2 * F), mask=mask, other=0.0, cache_modifier=".cg")
                    u += tl.load(gu + s2 * (BLOCK_M * 2 * F) + F, mask=mask, other=0.0, cache_modifier=".cg")
                    ssq += tl.load(sq + s2 * (n_tiles * BLOCK_M), cache_modifier=".cg")
        if last:
            if SSQ_IN:
                if AHEAD:
                    ssq = _add_ssq_tiles(ssq_block)
                elif EARLY_MOD:
                    ssq = ssq_pre
                else:
                    ssq = _sum_ssq_tiles(ssq_ptr, rows, SSQ_TILES, BLOCK_M)
            inv = 1.0 / tl.sqrt(ssq / D + eps)
            if MOD:
                if LOADED:
                    g = g * inv[:, None] + bias_g[None, :]
                    u = u * inv[:, None] + bias_u[None, :]
                else:
                    g = g * inv[:, None] + tl.load(mod_ptr + D + cols, mask=col_ok, other=0.0)[None, :]
                    u = u * inv[:, None] + tl.load(mod_ptr + D + F + cols, mask=col_ok, other=0.0)[None, :]
                h = _gelu_tanh(g) * u
            else:
                h = _gelu_tanh(g * inv[:, None]) * (u * inv[:, None])
            tl.store(h_ptr + rows[:, None] * F + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------ kernel


@triton.jit
def _expert_step_kernel(
    x_ptr, q_ptr, kv_ptr, o_ptr, h_ptr, acc_ptr, ml_ptr, part_ptr, counter_ptr, tile_ctr_ptr, err_ptr, ts_ptr,
    wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, mask_ptr, mod_ptr, xm_ptr, ssq_ptr,
    M, Tk, Tp, keys_per_split, eps, scale, stride_cl, stride_cb, stride_ct, stride_mb, stride_mq,
    layer_lo, layer_hi, phase_lo, phase_hi,
    D: tl.constexpr, NH: tl.constexpr, HD: tl.constexpr, F: tl.constexpr, BLOCK_M: tl.constexpr,
    BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
    BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_DOWN: tl.constexpr, BK_DOWN: tl.constexpr,
    ABM: tl.constexpr, ABN: tl.constexpr, SPLITS: tl.constexpr, MD: tl.constexpr,
    MASK_VALUE: tl.constexpr, STAGES: tl.constexpr, ATT_STAGES: tl.constexpr,
    USE_BARRIER: tl.constexpr, POLL_LOAD: tl.constexpr, MAX_SPIN: tl.constexpr,
    PF_O: tl.constexpr, PF_GU: tl.constexpr, PF_DOWN: tl.constexpr, PF_QKV_NEXT: tl.constexpr,
    ELEMS_PER_LINE: tl.constexpr, L: tl.constexpr,
    KS_O: tl.constexpr, KS_GU: tl.constexpr, KS_DOWN: tl.constexpr, FOLD_MERGE: tl.constexpr, BARRIER_ASM: tl.constexpr,
    POLL_ONE: tl.constexpr, CTR_O: tl.constexpr, CTR_GU: tl.constexpr, CTR_DOWN: tl.constexpr, CTR_LAYER: tl.constexpr,
    TIMELINE: tl.constexpr, EARLY_V: tl.constexpr, IDLE_PREFETCH: tl.constexpr, ROTATE: tl.constexpr,
    NB: tl.constexpr, DATAFLOW: tl.constexpr, CTR_SLOT: tl.constexpr, PREFETCH_OWN: tl.constexpr, MOD: tl.constexpr,
    EARLY_MOD: tl.constexpr, SCALE_AFTER_LOOP: tl.constexpr, MOD_PREFETCH: tl.constexpr = False,
    SSQ_IN: tl.constexpr = False, SSQ_OUT: tl.constexpr = False, STATS_AHEAD: tl.constexpr = False,
    ROPE_AHEAD: tl.constexpr = False, QKV_PAIRS: tl.constexpr = 0, SSQ_SUM: tl.constexpr = 0,
    POLL_DEPTH: tl.constexpr = 1, POLL_GAP: tl.constexpr = 0, ONE_DOT: tl.constexpr = False, ADS: tl.constexpr = 1,
    SUB_M: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    QKV_N: tl.constexpr = NH * HD + 2 * HD
    MT = NB * M  # the rows of all samples: the matmul phases treat them alike
    QKV_JB: tl.constexpr = (HD // 2 + BN_QKV - 1) // BN_QKV  # qkv tasks per slot (query head, k, v)
    # pi0.5's per-layer modulation table (MOD), laid out as modulation_table says
    MOD_W: tl.constexpr = 4 * D + QKV_N + 2 * F
    # SSQ_IN (pi0.5, or pi0 with ssq_from_writers): qkv and gate_up read the norm statistics from
    # the writers' tiles instead of squaring x; SSQ_OUT (pi0 with ssq_from_writers): the writers
    # store them (pi0.5's do with xm, under MOD)
    for layer in range(layer_lo, layer_hi):
        # attention row blocks, o_proj tiles, gate_up tiles, down tiles, qkv slots (dataflow)
        tile_ctr = tile_ctr_ptr + layer * CTR_LAYER
        modl = mod_ptr + layer * MOD_W
        for phase in range(phase_lo, phase_hi):
            if TIMELINE:  # (layer, phase, program): start, work done, barrier passed
                ts = ts_ptr + ((layer * 7 + phase) * nprog + pid) * 3 + tl.arange(0, 1)
                tl.store(ts, _now())
            # the prefetch plan (PREFETCH_PLANS): weights do not depend on activations, so any phase may
            # ask. The constexpr guards keep a plan's code out of the kernels that do not use it
            if PF_O >= 0:
                if phase == PF_O:
                    _prefetch_l2(wo_ptr + layer * (D * NH * HD), D * NH * HD, pid, nprog, ELEMS_PER_LINE, 512)
            if PF_GU >= 0:
                if phase == PF_GU:
                    _prefetch_l2(wgu_ptr + layer * (2 * F * D), 2 * F * D, pid, nprog, ELEMS_PER_LINE, 512)
            if PF_DOWN >= 0:
                if phase == PF_DOWN:
                    _prefetch_l2(wd_ptr + layer * (D * F), D * F, pid, nprog, ELEMS_PER_LINE, 512)
            if PF_QKV_NEXT >= 0:
                if (phase == PF_QKV_NEXT) & (layer + 1 < L):
                    _prefetch_l2(wqkv_ptr + (layer + 1) * (QKV_N * D), QKV_N * D, pid, nprog, ELEMS_PER_LINE, 512)
            if phase == 0:
                _phase_qkv(x_ptr, wqkv_ptr + layer * (QKV_N * D), q_ptr, kv_ptr, cos_ptr, sin_ptr, tile_ctr + CTR_SLOT, MT,
                           eps, pid, nprog, D, NH, HD, BLOCK_M, BN_QKV, BK_QKV, STAGES, ROTATE, DATAFLOW, modl, xm_ptr,
                           ssq_ptr, MOD, (D + BN_DOWN - 1) // BN_DOWN, EARLY_MOD, SSQ_IN, STATS_AHEAD, ROPE_AHEAD,
                           QKV_PAIRS, SSQ_SUM, ONE_DOT, SUB_M)
                if IDLE_PREFETCH > 0:
                    # qkv has fewer tasks than programs (80 of 132 for pi0's expert); the idle ones ask L2
                    # for what the next phases read first from HBM, instead of waiting at the barrier
                    if QKV_PAIRS > 0:
                        QKV_TASKS: tl.constexpr = ((NH + 2) * (HD // 2) + QKV_PAIRS - 1) // QKV_PAIRS
                    else:
                        QKV_TASKS: tl.constexpr = (NH + 2) * ((HD // 2 + BN_QKV - 1) // BN_QKV)
                    if pid >= QKV_TASKS:
                        ip = pid - QKV_TASKS
                        n_idle = nprog - QKV_TASKS
                        kv_elems = (NB - 1) * stride_cb + Tk * stride_ct
                        _prefetch_l2(kc_ptr + layer * stride_cl, kv_elems, ip, n_idle, ELEMS_PER_LINE, 512)
                        _prefetch_l2(vc_ptr + layer * stride_cl, kv_elems, ip, n_idle, ELEMS_PER_LINE, 512)
                        _prefetch_l2(wo_ptr + layer * (D * NH * HD), D * NH * HD, ip, n_idle, ELEMS_PER_LINE, 512)
                        if IDLE_PREFETCH > 1:
                            _prefetch_l2(wgu_ptr + layer * (2 * F * D), 2 * F * D, ip, n_idle, ELEMS_PER_LINE, 512)
                        if MOD and MOD_PREFETCH:  # float32 rows: 32 to a 128-byte line; the next layer's too
                            rows_ahead = tl.where(layer + 1 < L, 2, 1)
                            _prefetch_l2(modl, MOD_W * rows_ahead, ip, n_idle, 32, 512)
            elif phase == 1:
                _phase_attention(q_ptr, kv_ptr, kc_ptr + layer * stride_cl, vc_ptr + layer * stride_cl, mask_ptr,
                                 acc_ptr, ml_ptr, o_ptr, tile_ctr, M, Tk, Tp, keys_per_split, scale, stride_cb, stride_ct,
                                 stride_mb, stride_mq, pid, nprog, NH, HD, BLOCK_M, ABM, ABN, SPLITS, MASK_VALUE,
                                 ATT_STAGES, FOLD_MERGE, MD, EARLY_V, ROTATE, NB, tile_ctr + CTR_SLOT, err_ptr, QKV_JB,
                                 DATAFLOW, MAX_SPIN, BARRIER_ASM, ADS)
            elif phase == 2:
                if not FOLD_MERGE:
                    _phase_merge(acc_ptr, ml_ptr, o_ptr, tile_ctr, err_ptr, M, pid, nprog, NH, HD, ABM, SPLITS, MD, NB,
                                 DATAFLOW, MAX_SPIN, BARRIER_ASM)
            elif phase == 3:
                _phase_residual(o_ptr, NH * HD, wo_ptr + layer * (D * NH * HD), x_ptr, part_ptr, tile_ctr + CTR_O, MT, pid,
                                nprog, D, BLOCK_M, BN_O, BK_O, KS_O, STAGES, ROTATE, modl + D + QKV_N, modl + 2 * D + QKV_N,
                                xm_ptr, ssq_ptr, 1, MOD, EARLY_MOD, SCALE_AFTER_LOOP, SSQ_OUT, SUB_M)
            elif phase == 4:
                _phase_gate_up(x_ptr, wgu_ptr + layer * (2 * F * D), h_ptr, part_ptr, tile_ctr + CTR_GU, MT, eps, pid, nprog,
                               D, F, BLOCK_M, BN_GU, BK_GU, KS_GU, STAGES, ROTATE, modl + 2 * D + QKV_N, xm_ptr, ssq_ptr, MOD,
                               (D + BN_O - 1) // BN_O, EARLY_MOD, SSQ_IN, STATS_AHEAD, SSQ_SUM, ONE_DOT, SUB_M)
            elif phase == 5:
                _phase_residual(h_ptr, F, wd_ptr + layer * (D * F), x_ptr, part_ptr, tile_ctr + CTR_DOWN, MT, pid, nprog, D,
                                BLOCK_M, BN_DOWN, BK_DOWN, KS_DOWN, STAGES, ROTATE, modl + 3 * D + QKV_N + 2 * F,
                                modl + MOD_W, xm_ptr, ssq_ptr, layer + 1 < L, MOD, EARLY_MOD, SCALE_AFTER_LOOP, SSQ_OUT,
                                SUB_M)
            # phase 6 does nothing: benchmarks time the barriers alone with phases=(6, 7)
            if TIMELINE:
                tl.debug_barrier()  # every warp of the program is done
                tl.store(ts + 1, _now())
            if PREFETCH_OWN > 0:
                _prefetch_next_task(phase, layer, pid, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, L, D, NH, HD, F, BN_QKV, BN_O,
                                    BN_GU, BN_DOWN, KS_O, KS_GU, KS_DOWN, ELEMS_PER_LINE, PREFETCH_OWN)
            if USE_BARRIER:
                # the kernel's end syncs the last phase; a folded merge phase has nothing to wait for; with
                # DATAFLOW, attention and merge tasks wait on counters for what they read instead
                if (((layer < layer_hi - 1) | (phase < phase_hi - 1)) & ((phase != 2) | (not FOLD_MERGE))
                        & ((phase > 1) | (not DATAFLOW))):
                    if BARRIER_ASM:
                        _grid_sync_asm(counter_ptr + layer * 7 + phase, err_ptr, nprog, MAX_SPIN, POLL_ONE, POLL_DEPTH,
                                       POLL_GAP)
                    else:
                        _grid_sync(counter_ptr + layer * 7 + phase, err_ptr, nprog, MAX_SPIN, POLL_LOAD)
            if TIMELINE:
                tl.store(ts + 2, _now())


# ------------------------------------------------------------------------ launcher

_ERROR_FLAGS: dict[str, torch.Tensor] = {}
_LAST_COUNTERS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
_LAST_LAUNCH: dict[str, dict] = {}


def _device_key(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def error_flag(device: torch.device) -> torch.Tensor:
    """The device's barrier-timeout flag, created on first use. The engine creates it when it is
    built, outside any CUDA-graph memory pool: a flag first made inside a pool would be a live
    pool allocation that no graph outputs (inductor's CUDA-graph trees refuse that)."""
    return _error_flag(torch.device(device))


def _error_flag(device: torch.device) -> torch.Tensor:
    key = _device_key(device)
    if key not in _ERROR_FLAGS:
        _ERROR_FLAGS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _ERROR_FLAGS[key]


def barrier_timeouts(device: torch.device | str) -> int:
    """1 if a grid barrier on `device` ever gave up waiting (results of that call are wrong)."""
    flag = _ERROR_FLAGS.get(_device_key(device))
    return 0 if flag is None else int(flag.item())


def take_barrier_timeouts(device: torch.device | str) -> int:
    """Read and clear the barrier-timeout flag of `device`: 1 if a grid barrier gave up since
    the last take, so the step(s) in between returned wrong values. One 4-byte device read
    (a sync): for paths that sync anyway, such as the policy's copy of the actions to host."""
    seen = barrier_timeouts(device)
    if seen:
        _ERROR_FLAGS[_device_key(device)].zero_()
    return seen


def last_launch(device: torch.device | str) -> dict | None:
    """What the last expert_step call on `device` launched: its configuration with the fitted fields
    resolved (`config`), and the shape they were fitted to (`rows` a sample, `samples`, `keys`,
    `programs`). Result files record it, so a figure names the tiling it ran with on that GPU."""
    return _LAST_LAUNCH.get(_device_key(device))


def last_barrier_counters(device: torch.device | str) -> torch.Tensor | None:
    """The barrier counters of the last persistent launch on `device` made with keep_counters
    (layer * 7 + phase):
    those of the phases run must equal the number of programs, except the very last one
    (the kernel's end syncs it) and a folded merge phase (no barrier)."""
    counters = _LAST_COUNTERS.get(_device_key(device))
    return None if counters is None else counters[0]


def last_split_counters(device: torch.device | str) -> torch.Tensor | None:
    """The arrival counters of the split tasks in the last persistent launch on `device` made
    with keep_counters, per layer: attention row blocks (each must read the number of key splits if the merge is
    folded or with dataflow), o_proj, gate_up and down tiles (ks_o, ks_gu, ks_down if split),
    qkv slots (with dataflow); else 0."""
    counters = _LAST_COUNTERS.get(_device_key(device))
    return None if counters is None else counters[1]


def key_splits(cfg: StepKernelConfig, Tk: int) -> tuple[int, int]:
    """(number of key splits, keys per split) of the attention phase over Tk keys: whole
    `att_bn` tiles per split, at most `cfg.splits` splits, none empty."""
    splits = max(1, min(cfg.splits, triton.cdiv(Tk, cfg.att_bn)))
    keys_per_split = triton.cdiv(triton.cdiv(Tk, splits), cfg.att_bn) * cfg.att_bn
    return triton.cdiv(Tk, keys_per_split), keys_per_split


def split_counter_targets(cfg: StepKernelConfig, M: int, NH: int, D: int, F: int, Tk: int, samples: int = 1,
                          HD: int = 256, programs: int = 132) -> list[int]:
    """What each split counter of one layer (see `last_split_counters`) must read after a
    launch: the key splits per attention row block (per sample) if the merge is folded or
    with dataflow, ks_o / ks_gu / ks_down per o_proj / gate_up / down tile if split, and with
    dataflow the qkv tasks per slot (query heads, k, v); else 0 (nothing counts there)."""
    cfg = fit_config(cfg, M, samples, NH, HD, Tk, programs)
    splits = key_splits(cfg, Tk)[0] if (cfg.fold_merge or cfg.dataflow) else 0
    jb = triton.cdiv(HD // 2, cfg.bn_qkv) if cfg.dataflow else 0
    return ([splits] * (samples * triton.cdiv(NH * M, cfg.att_bm))
            + [cfg.ks_o if cfg.ks_o > 1 else 0] * triton.cdiv(D, cfg.bn_o)
            + [cfg.ks_gu if cfg.ks_gu > 1 else 0] * triton.cdiv(F, cfg.bn_gu)
            + [cfg.ks_down if cfg.ks_down > 1 else 0] * triton.cdiv(D, cfg.bn_down) + [jb] * (NH + 2))


def l2_traffic(cfg: StepKernelConfig, M: int, NH: int, HD: int, D: int, F: int, Tk: int, samples: int = 1,
               elem: int = 2, programs: int = 132) -> dict[str, dict[str, int]]:
    """A model of the bytes each phase of one layer moves through L2 (every load and store of
    the kernel goes there; the weights also come from HBM once), by kind: `weights`,
    `activations` (what the tasks read of the previous phase's output: every tile reads the
    rows of its K slice again), `partials` (float32 split-K / key-split partials, written and
    read back), `outputs` (the phase's stores; the residual phases also read x). Rows are the
    real ones (NB x M): masked rows are not fetched. `elem` is the bytes of a weight or
    activation element (bf16: 2). On the H200 a program of these matmul tasks streams about
    50 KB a microsecond with its weights from HBM and 64-68 with them in L2
    (benchmarks/tma_probe.py), so a phase's time follows its bytes per program;
    docs/perf-notes.md, session 7, compares this model with the timeline."""
    cfg = fit_config(cfg, M, samples, NH, HD, Tk, programs)
    rows, f32 = samples * M, 4
    qkv_n = NH * HD + 2 * HD
    qkv_tasks = qkv_task_count(cfg, NH, HD)
    splits = key_splits(cfg, Tk)[0]
    att_blocks = samples * triton.cdiv(NH * M, cfg.att_bm)

    def residual(K: int, bn: int, ks: int) -> dict[str, int]:
        tiles = triton.cdiv(D, bn)
        return {"weights": D * K * elem, "activations": tiles * rows * K * elem,
                "partials": 2 * ks * rows * D * f32 if ks > 1 else 0, "outputs": 2 * rows * D * elem}

    return {
        "qkv": {"weights": qkv_n * D * elem, "activations": qkv_tasks * rows * D * elem, "partials": 0,
                "outputs": rows * qkv_n * elem},
        # every task reads its rows' q and its split's keys whole, its part of the values
        "attention": {"weights": 0, "activations": cfg.att_dsplit * att_blocks * splits * cfg.att_bm * HD * elem
                      + att_blocks * triton.cdiv(Tk, splits) * splits * (cfg.att_dsplit + 1) * HD * elem,
                      "partials": splits * samples * NH * M * (HD + 2) * f32, "outputs": 0},
        "merge": {"weights": 0, "activations": 0, "partials": splits * samples * NH * M * (HD + 2) * f32,
                  "outputs": rows * NH * HD * elem},
        "o_proj": residual(NH * HD, cfg.bn_o, cfg.ks_o),
        "gate_up": {"weights": 2 * F * D * elem, "activations": triton.cdiv(F, cfg.bn_gu) * rows * D * elem,
                    "partials": 2 * cfg.ks_gu * rows * (2 * F + triton.cdiv(F, cfg.bn_gu)) * f32 if cfg.ks_gu > 1 else 0,
                    "outputs": rows * F * elem},
        "down": residual(F, cfg.bn_down, cfg.ks_down),
    }


def qkv_task_count(cfg: StepKernelConfig, NH: int, HD: int) -> int:
    """The qkv phase's tasks: bn_qkv rotary pairs of one slot each, or qkv_pairs pairs of all slots."""
    if cfg.qkv_pairs:
        return triton.cdiv((NH + 2) * (HD // 2), cfg.qkv_pairs)
    return (NH + 2) * triton.cdiv(HD // 2, cfg.bn_qkv)


def ssq_constexprs(cfg: StepKernelConfig, mod: bool, D: int) -> dict[str, bool]:
    """Where the norm statistics come from (see the kernel): SSQ_IN, SSQ_OUT, STATS_AHEAD. stats_ahead
    loads the writers' statistics tiles as one block, which needs a power-of-two tile count; other
    widths add them after the loop as before."""
    tiles = (triton.cdiv(D, cfg.bn_o), triton.cdiv(D, cfg.bn_down))
    one_block = all(t & (t - 1) == 0 for t in tiles)
    writers = cfg.ssq_from_writers > 0  # (resolved by fit_config; an unresolved -1 counts as off)
    return {"SSQ_IN": bool(mod) or writers, "SSQ_OUT": writers and not mod,
            "STATS_AHEAD": cfg.stats_ahead and not cfg.early_mod_loads and (bool(mod) or writers) and one_block}


def prefetch_phases(plan: int) -> dict[str, int]:
    """The kernel's constants for a prefetch plan: the phase at whose start every program asks
    L2 for each weight matrix (-1: never)."""
    if plan not in (0, *PREFETCH_PLANS):
        raise ValueError(f"StepKernelConfig.prefetch={plan}: expected 0 (off) or a plan of {sorted(PREFETCH_PLANS)}")
    at = {w: PHASES.index(ph) for ph, ws in PREFETCH_PLANS.get(plan, {}).items() for w in ws}
    return {"PF_O": at.get("o", -1), "PF_GU": at.get("gate_up", -1), "PF_DOWN": at.get("down", -1),
            "PF_QKV_NEXT": at.get("qkv+1", -1)}


def modulation_table(mods: torch.Tensor, wqkv: torch.Tensor, wgu: torch.Tensor) -> torch.Tensor:
    """The step kernel's view of pi0.5's adaptive norms for the steps of a schedule.

    mods (steps, L*6 [+ 2], D): each layer's scale, shift, gate for its input norm, then for
    its post-attention norm (fusion.time_tables); wqkv (L, QKV_N, D), wgu (L, 2F, D) unfolded.
    Returns float32 (steps, L, 4D + QKV_N + 2F), per layer: 1 + scale1 (D),
    shift1 @ Wqkv^T (QKV_N), gate1 (D), 1 + scale2 (D), shift2 @ Wgu^T (2F), gate2 (D).
    Since (n (1 + s) + b) @ W^T = inv (x (1 + s)) @ W^T + b @ W^T, a modulated norm costs the
    kernel the writers' x (1 + s) beside x and a per-column bias after the product. The gates
    are rounded to the model dtype first, as the reference multiplies by them there."""
    L = wqkv.shape[0]
    rows = mods[:, : 6 * L].view(mods.shape[0], L, 6, -1)  # (steps, L, scale/shift/gate x 2, D)
    m = rows.float()
    shift_qkv = torch.einsum("sld,lnd->sln", m[:, :, 1], wqkv.float())
    shift_gu = torch.einsum("sld,lnd->sln", m[:, :, 4], wgu.float())
    gate1, gate2 = (rows[:, :, i].to(wqkv.dtype).float() for i in (2, 5))
    return torch.cat([1.0 + m[:, :, 0], shift_qkv, gate1, 1.0 + m[:, :, 3], shift_gu, gate2], dim=-1).contiguous()


def row_block(rows: int) -> int:
    """The matmul phases' row block for `rows` suffix rows (all samples): a power of two >= 16."""
    return max(16, triton.next_power_of_2(rows))


def k_depths(cfg: StepKernelConfig, block_m: int) -> dict[str, int]:
    """The matmuls' K block depths for a row block: the config's up to 64 rows; beyond, shallower
    in proportion, so the activation tile (block_m x bk) and its pipeline keep their shared memory."""
    return {k: max(16, getattr(cfg, k) * 64 // max(block_m, 64)) for k in ("bk_qkv", "bk_o", "bk_gu", "bk_down")}


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs, each striding over the tasks


def expert_step(
    x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
    eps: float, *, persistent: bool | None = None, config: StepKernelConfig | None = None,
    phases: tuple[int, int] = (0, len(PHASES)), programs: int | None = None, timeline: torch.Tensor | None = None,
    mod: torch.Tensor | None = None, in_place: bool = False, keep_counters: bool = False,
) -> torch.Tensor:
    """x (M, D) suffix hidden states -> x after all L layers of a pi0 expert; or B samples at
    once: x (B, M, D) with a batch axis on the cache, tables and mask as below. in_place: x
    (contiguous) is updated and returned, else a copy is (the custom op mutates: no copy
    kernel a step in the engine's graph).

    wqkv (L, NH*HD + 2*HD, D) with the input RMSNorm scale folded; wo (L, D, NH*HD);
    wgu (L, 2F, D): gate rows then up rows, post-attention RMSNorm scale folded; wd (L, D, F).
    k_cache, v_cache (L, Tk, HD) or (L, B, Tk, HD): token-major per layer (unit stride within
    a token, rows 16-byte aligned), the prefix's keys (after RoPE) and values in [0, Tk - M);
    the last M slots are not read.
    cos, sin ([B,] M, HD) RoPE tables of the suffix positions; mask ([B,] M, Tk) bool/uint8,
    True = may attend. The matmul phases take the B * M rows as one block of at most
    MAX_ROWS (their K blocks shrink as the rows grow, to keep the shared memory of 64 rows);
    attention tasks stay within one sample. Timed on the H200 for one sample of up to
    TUNED_ROWS rows, which is all the engine sends by default (docs/perf-notes.md).
    persistent: one launch with grid barriers (default on CUDA) or one launch per (layer,
    phase). phases: run only phases [lo, hi) of every layer (benchmarks; phase 6 is empty,
    so (6, 7) times the barriers alone). timeline: an int64 (L, 7, programs, 3) CUDA tensor
    to fill with each program's global-clock nanoseconds at the start of every (layer,
    phase), when its work is done and when it has passed the barrier (persistent launches
    only; see `timeline_summary`).
    mod: pi0.5's adaptive norms for this step, float32 (L, 4D + NH*HD + 2*HD + 2F) per
    `modulation_table` (then the weights carry no folded norm scales); None for pi0.
    keep_counters: keep this launch's barrier and split counters for `last_barrier_counters`
    (benchmarks' self-checks). Off by default: a reference kept past the call is a live
    allocation that inductor's CUDA-graph trees (compile=reduce-overhead) refuse.
    """
    batched = x.dim() == 3
    NB, (M, D) = (x.shape[0] if batched else 1), x.shape[-2:]
    L, qkv_n, _ = wqkv.shape
    HD = k_cache.shape[-1]
    F = wgu.shape[1] // 2
    NH = (qkv_n - 2 * HD) // HD
    Tk = k_cache.shape[-2]
    grid = programs or num_sms(x.device)
    cfg = fit_config(config or StepKernelConfig(), M, NB, NH, HD, Tk, grid)
    _LAST_LAUNCH[_device_key(x.device)] = {"config": asdict(cfg), "rows": M, "samples": NB, "keys": Tk, "programs": grid}
    if NB * M > MAX_ROWS:
        raise ValueError(f"the step kernel takes at most {MAX_ROWS} suffix rows (batch x rows), got {NB} x {M}")
    lead = (NB,) if batched else ()  # the batch axis, where the caller has one
    expected = {"wqkv": (L, NH * HD + 2 * HD, D), "wo": (L, D, NH * HD), "wgu": (L, 2 * F, D), "wd": (L, D, F),
                "k_cache": (L, *lead, Tk, HD), "v_cache": (L, *lead, Tk, HD), "cos": (*lead, M, HD),
                "sin": (*lead, M, HD), "mask": (*lead, M, Tk)}
    given = {"wqkv": wqkv, "wo": wo, "wgu": wgu, "wd": wd, "k_cache": k_cache, "v_cache": v_cache, "cos": cos,
             "sin": sin, "mask": mask}
    if mod is not None:
        expected["mod"], given["mod"] = (L, 4 * D + qkv_n + 2 * F), mod
    for name, shape in expected.items():
        if tuple(given[name].shape) != shape:
            raise ValueError(f"expert_step: {name} has shape {tuple(given[name].shape)}, expected {shape}")
    if mod is not None and (mod.dtype != torch.float32 or not mod.is_contiguous()):
        raise ValueError(f"expert_step: mod must be a contiguous float32 table, got {mod.dtype}")
    if not batched:  # one sample: add the batch axis everywhere
        x, cos, sin, mask = x[None], cos[None], sin[None], mask[None]
        k_cache, v_cache = k_cache[:, None], v_cache[:, None]
    for name in ("wqkv", "wo", "wgu", "wd"):
        if not given[name].is_contiguous():
            raise ValueError(f"expert_step: {name} must be contiguous (stack the layers once, not per call)")
    if cfg.dataflow and cfg.fold_merge:
        raise ValueError("StepKernelConfig: dataflow and fold_merge exclude each other (the folded merge needs the "
                         "barrier after attention that dataflow removes)")
    if cfg.att_dsplit > 1 and (cfg.dataflow or cfg.fold_merge):
        raise ValueError("StepKernelConfig: att_dsplit > 1 excludes dataflow and fold_merge (they count the "
                         "attention tasks per row block)")
    if not 0 <= cfg.prefetch_own <= 15:
        raise ValueError(f"StepKernelConfig.prefetch_own={cfg.prefetch_own}: expected a bit mask of 1 (o_proj), "
                         "2 (gate_up), 4 (down), 8 (next qkv)")
    if cfg.ssq_from_writers not in (-1, 0, 1):
        raise ValueError(f"StepKernelConfig.ssq_from_writers={cfg.ssq_from_writers}: expected -1 (fitted), 0 or 1")
    if not 1 <= cfg.poll_depth <= 4 or cfg.poll_gap < 0:
        raise ValueError(f"StepKernelConfig.poll_depth={cfg.poll_depth}, poll_gap={cfg.poll_gap}: expected a depth of 1 "
                         "to 4 reads in flight and a gap of 0 or more clock cycles")
    if cfg.poll_depth > 1 and not (cfg.barrier_asm and cfg.poll_one):
        raise ValueError("StepKernelConfig.poll_depth > 1 is thread 0's poll in PTX: it needs barrier_asm and poll_one")
    if cfg.qkv_pairs:
        if not 0 < cfg.qkv_pairs <= cfg.bn_qkv:
            raise ValueError(f"StepKernelConfig.qkv_pairs={cfg.qkv_pairs}: expected -1 (fitted), 0 (per-slot tiles) or "
                             f"1..bn_qkv ({cfg.bn_qkv}), the lanes of a qkv task's block")
        if cfg.dataflow or cfg.prefetch_own & 8:
            raise ValueError("StepKernelConfig: qkv_pairs excludes dataflow and prefetch_own's bit 8 (both count qkv's "
                             "tasks slot by slot)")
    prefetch = prefetch_phases(cfg.prefetch)  # raises for an unknown plan, on every device
    if x.device.type != "cuda":
        prefetch = prefetch_phases(0)  # prefetch.global.L2 is PTX: the interpreter runs none
    for name, ks, K in (("ks_o", cfg.ks_o, NH * HD), ("ks_gu", cfg.ks_gu, D), ("ks_down", cfg.ks_down, F)):
        if ks < 1 or K % ks:
            raise ValueError(f"StepKernelConfig.{name}={ks}: expected a positive divisor of that matmul's depth {K}")
    cos, sin = cos.contiguous(), sin.contiguous()
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("expert_step: k_cache and v_cache need the same strides, unit stride within a token")
    # The kernel tells the compiler that every cached token row starts at a multiple of 16 (read
    # as bytes or as elements), so the rows are loaded as 16-byte vectors: make it true.
    if (any(t.data_ptr() % 32 or t.stride(0) % 16 for t in (k_cache, v_cache)) or k_cache.stride(2) % 16
            or (NB > 1 and k_cache.stride(1) % 16)):
        raise ValueError("expert_step: every token row of k_cache / v_cache must start 16-byte aligned (a 32-byte "
                         "aligned base, layer, sample and token strides multiples of 16 elements): the kernel loads "
                         "rows as vectors")
    device = x.device
    persistent = device.type == "cuda" if persistent is None else persistent
    mask_u8 = mask.to(torch.uint8) if mask.dtype == torch.bool else mask
    MT = NB * M
    BLOCK_M = row_block(MT)
    bk = k_depths(cfg, BLOCK_M)
    if in_place and not x.is_contiguous():
        raise ValueError("expert_step: in_place needs a contiguous x")
    x = x.view(MT, D) if in_place else x.reshape(MT, D).contiguous().clone()  # updated in place by the kernel
    R = NH * M
    splits, keys_per_split = key_splits(cfg, Tk)
    q = torch.empty(MT, NH * HD, dtype=x.dtype, device=device)
    o = torch.empty_like(q)
    kv = torch.empty(2, BLOCK_M, HD, dtype=x.dtype, device=device)
    h = torch.empty(MT, F, dtype=x.dtype, device=device)
    acc = torch.empty(splits * NB * R * HD, dtype=torch.float32, device=device)
    ml = torch.empty(2 * splits * NB * R, dtype=torch.float32, device=device)
    # float32 partials of the split matmuls; the phases take turns (a barrier lies between them)
    gu_tiles = triton.cdiv(F, cfg.bn_gu)
    part_size = max(max(cfg.ks_o, cfg.ks_down) * BLOCK_M * D, cfg.ks_gu * BLOCK_M * (2 * F + gu_tiles))
    part = torch.empty(part_size if max(cfg.ks_o, cfg.ks_gu, cfg.ks_down) > 1 else 1, dtype=torch.float32, device=device)
    # arrival counters of the split tasks, per layer: attention row blocks, o_proj, gate_up, down tiles
    ctr_o = NB * triton.cdiv(R, cfg.att_bm)
    ctr_gu = ctr_o + triton.cdiv(D, cfg.bn_o)
    ctr_down = ctr_gu + gu_tiles
    ctr_slot = ctr_down + triton.cdiv(D, cfg.bn_down)
    ctr_layer = ctr_slot + NH + 2
    # the barrier counters (layer * 7 + phase), then the split tasks' ones: zeroed by one fill
    all_counters = torch.zeros(L * (len(PHASES) + 1) + L * ctr_layer, dtype=torch.int32, device=device)
    counters, tile_counters = all_counters.split([L * (len(PHASES) + 1), L * ctr_layer])
    err = _error_flag(device)
    if timeline is not None:
        want = (L, len(PHASES) + 1, grid, 3)
        if device.type != "cuda" or not persistent:
            raise ValueError("expert_step: timeline needs a persistent launch on CUDA (it reads the GPU's global clock)")
        if timeline.dtype != torch.int64 or tuple(timeline.shape) != want or timeline.device != device:
            raise ValueError(f"expert_step: timeline must be an int64 tensor of shape {want} on {device}, got "
                             f"{timeline.dtype} {tuple(timeline.shape)} on {timeline.device}")
    clock = err if timeline is None else timeline  # any pointer will do when TIMELINE is off
    if mod is not None or cfg.ssq_from_writers > 0:
        # pi0.5: the first layer's modulated input and norm statistics, in the tiles qkv reads
        # (down's); later layers get theirs from the phase before (_write_next). pi0 with
        # ssq_from_writers: the statistics alone
        xm = torch.empty_like(x) if mod is not None else x
        ssq = torch.empty(max(triton.cdiv(D, cfg.bn_o), triton.cdiv(D, cfg.bn_down)), BLOCK_M, dtype=torch.float32,
                          device=device)
        launch(_mod_prologue_kernel, (triton.cdiv(D, cfg.bn_down),), x, err if mod is None else mod, xm, ssq, MT, D=D,
               BLOCK_M=BLOCK_M, BN=cfg.bn_down, XM=mod is not None)
    else:
        xm, ssq = x, err  # not read
    args = [x, q, kv, o, h, acc, ml, part, counters, tile_counters, err, clock, wqkv, wo, wgu, wd, k_cache, v_cache, cos, sin,
            mask_u8, err if mod is None else mod, xm, ssq, M, Tk, Tk - M, keys_per_split, float(eps), HD**-0.5, k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), mask_u8.stride(0), mask_u8.stride(1)]
    consts = dict(D=D, NH=NH, HD=HD, F=F, BLOCK_M=BLOCK_M, BN_QKV=cfg.bn_qkv, BK_QKV=bk["bk_qkv"], BN_O=cfg.bn_o,
                  BK_O=bk["bk_o"], BN_GU=cfg.bn_gu, BK_GU=bk["bk_gu"], BN_DOWN=cfg.bn_down, BK_DOWN=bk["bk_down"],
                  ABM=cfg.att_bm, ABN=cfg.att_bn, SPLITS=splits, MD=min(cfg.merge_bd, HD),
                  MASK_VALUE=ATTENTION_MASK_VALUE, STAGES=cfg.num_stages, ATT_STAGES=cfg.att_stages,
                  POLL_LOAD=cfg.poll_load, MAX_SPIN=1 << 22, num_warps=cfg.num_warps,
                  **prefetch, ELEMS_PER_LINE=128 // wqkv.element_size(), L=L,
                  KS_O=cfg.ks_o, KS_GU=cfg.ks_gu, KS_DOWN=cfg.ks_down, FOLD_MERGE=cfg.fold_merge,
                  BARRIER_ASM=cfg.barrier_asm and device.type == "cuda", POLL_ONE=cfg.poll_one, CTR_O=ctr_o,
                  CTR_GU=ctr_gu, CTR_DOWN=ctr_down, CTR_LAYER=ctr_layer, TIMELINE=timeline is not None,
                  EARLY_V=cfg.att_early_v, IDLE_PREFETCH=cfg.idle_prefetch if device.type == "cuda" else 0,
                  ROTATE=cfg.k_rotate, NB=NB, DATAFLOW=cfg.dataflow, CTR_SLOT=ctr_slot,
                  PREFETCH_OWN=cfg.prefetch_own if device.type == "cuda" else 0, MOD=mod is not None,
                  EARLY_MOD=cfg.early_mod_loads, SCALE_AFTER_LOOP=cfg.scale_after_loop,
                  MOD_PREFETCH=cfg.mod_prefetch and device.type == "cuda", **ssq_constexprs(cfg, mod is not None, D),
                  ROPE_AHEAD=cfg.rope_ahead, QKV_PAIRS=cfg.qkv_pairs, SSQ_SUM=ssq_sum_mode(cfg),
                  POLL_DEPTH=cfg.poll_depth, POLL_GAP=cfg.poll_gap, ONE_DOT=cfg.one_dot,
                  ADS=cfg.att_dsplit, SUB_M=sub_rows(cfg, BLOCK_M))
    if persistent:
        launch(_expert_step_kernel, (grid,), *args, 0, L, phases[0], phases[1], USE_BARRIER=True, **consts)
        if keep_counters:
            _LAST_COUNTERS[_device_key(device)] = (counters, tile_counters.view(L, ctr_layer))
    else:
        for layer in range(L):
            for phase in range(*phases):
                launch(_expert_step_kernel, (grid,), *args, layer, layer + 1, phase, phase + 1, USE_BARRIER=False, **consts)
    return x.view(NB, M, D) if batched else x


def timeline_summary(timeline: torch.Tensor, phases: tuple[int, int] = (0, len(PHASES))) -> dict:
    """Where a persistent launch's time went, from the clock readings `expert_step` wrote
    into `timeline` (L, 7, programs, 3: start, work done, barrier passed; nanoseconds).

    Per phase, medians over the layers, in microseconds:
      slot          from the phase's first start to the next phase's first start (the
                    phases' slots add up to the launch's time)
      work_min / work_median / work_max   a program's time in the phase's tasks
      start_skew    the last program's start after the first's (barrier departure spread)
      release       from the last program's arrival to the first one passing the barrier
    plus `slot_total_us` (the phase's slots over all layers) and, for the whole launch,
    `total_us` and `work_share`: the summed median work over the summed slots.
    """
    t = timeline.detach().to("cpu", torch.int64)
    L, _, P, _ = t.shape
    order = [(layer, ph) for layer in range(L) for ph in range(*phases)]
    starts = [t[layer, ph, :, 0].min().item() for layer, ph in order]
    last_done = t[order[-1][0], order[-1][1], :, 1].max().item()
    rows: dict[str, dict[str, list[float]]] = {}
    for i, (layer, ph) in enumerate(order):
        start, done, passed = (t[layer, ph, :, j].double() for j in range(3))
        work = (done - start) / 1e3
        nxt = starts[i + 1] if i + 1 < len(order) else last_done
        name = PHASES[ph] if ph < len(PHASES) else "empty"
        r = rows.setdefault(name, {k: [] for k in ("slot", "work_min", "work_median", "work_max", "start_skew", "release")})
        r["slot"].append((nxt - starts[i]) / 1e3)
        r["work_min"].append(work.min().item())
        r["work_median"].append(work.median().item())
        r["work_max"].append(work.max().item())
        r["start_skew"].append((start.max() - start.min()).item() / 1e3)
        is_last = i + 1 == len(order)  # the kernel's end syncs the last phase: no barrier readings
        r["release"].append(float("nan") if is_last else (passed.min() - done.max()).item() / 1e3)
    out: dict = {"programs": P, "layers": L, "phases": {}}
    for name, r in rows.items():
        med = {k: float(torch.tensor(v).nanmedian()) for k, v in r.items()}
        med["slot_total_us"] = float(sum(r["slot"]))
        out["phases"][name] = med
    out["total_us"] = (last_done - starts[0]) / 1e3
    work = sum(r["work_median"] * len(rows[n]["slot"]) for n, r in out["phases"].items())
    out["work_share"] = work / out["total_us"] if out["total_us"] > 0 else float("nan")
    return out


def config_dict(config: StepKernelConfig | None = None) -> dict:
    return asdict(config or StepKernelConfig())
