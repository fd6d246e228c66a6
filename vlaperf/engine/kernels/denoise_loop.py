"""The denoise loop of a batch-1 step through the step kernel, with one launch between steps.

Between two step-kernel launches the engine's loop ran ~15 small kernels (the final norm, the
action head and its split-K sum, the Euler update, the next step's action/time MLP, the suffix
assembly, the step kernel's buffer copy and counter fills): ~37 us a step on the H200 for a few
MFLOP (kernel_sequence_best_s9.txt). `_between_steps_kernel` does all of it in one launch:

    v      = norm(x[actions]) @ W_out^T + b_out           (the velocity, float32)
    x_t'   = x_t + dt * v                                  (Euler)
    tokens = silu(x_t' @ W_proj^T + time_row) @ W_mlp^T + b_mlp    (pi0's action/time MLP), or
             x_t' @ W_in^T + b_in                           (pi0.5: no MLP; time enters the norms)

Each program owns BN columns of the next tokens and computes the velocity and x_t' itself:
those inputs are small and L2-resident (the step's output, 100 KB; the float32 heads, 128 KB
each), so recomputing them per program costs less than a second launch and a grid-wide wait.
Program 0 alone stores x_t'. The programs also write the state token's row (pi0) and zero the
step kernel's arrival counters for its next launch. The float32 matmuls run as three TF32
products ("tf32x3"), as `head_linear`'s kernel does; the normalized rows are rounded to the
model's dtype before the head, as in the layer-by-layer loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlaperf.engine.kernels import expert_step as S


@triton.jit
def _between_steps_kernel(
    x_ptr, tok_ptr, xt_in_ptr, xt_out_ptr, wout_ptr, bout_ptr, fscale_ptr, fshift_ptr, wproj_ptr, tbias_ptr, wmlp_ptr, bmlp_ptr,
    state_ptr, ctr_ptr, tile_ctr_ptr, n_ctr, n_tile_ctr, H, eps, dt,
    D: tl.constexpr, A: tl.constexpr, AP: tl.constexpr, BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ZB: tl.constexpr,
    ROW0: tl.constexpr, FIRST: tl.constexpr, TOKENS: tl.constexpr, MLP: tl.constexpr, SHIFT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < H
    acols = tl.arange(0, AP)  # the action dim padded to a tensor-core size (masked)
    a_ok = acols < A
    xt_ptrs = rows[:, None] * A + acols[None, :]
    xt_mask = row_ok[:, None] & a_ok[None, :]
    xt = tl.load(xt_in_ptr + xt_ptrs, mask=xt_mask, other=0.0)
    if not FIRST:
        # the velocity at x_t from the step's output rows (the last H of the suffix)
        ks = tl.arange(0, BK)
        x_rows = x_ptr + (ROW0 + rows[:, None]) * D
        ssq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, D, BK):
            xk = tl.load(x_rows + k0 + ks[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
            ssq += tl.sum(xk * xk, axis=1)
        inv = 1.0 / tl.sqrt(ssq / D + eps)
        v = tl.zeros((BLOCK_M, AP), dtype=tl.float32)
        for k0 in range(0, D, BK):
            xk = tl.load(x_rows + k0 + ks[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
            xn = xk * inv[:, None] * tl.load(fscale_ptr + k0 + ks)[None, :]
            if SHIFT:
                xn += tl.load(fshift_ptr + k0 + ks)[None, :]
            xn = xn.to(x_ptr.dtype.element_ty).to(tl.float32)  # the norm's output in the model's dtype
            w = tl.load(wout_ptr + acols[:, None] * D + k0 + ks[None, :], mask=a_ok[:, None], other=0.0)
            v += tl.dot(xn, tl.trans(w), input_precision=PRECISION)
        v += tl.load(bout_ptr + acols, mask=a_ok, other=0.0)[None, :]
        xt = xt + dt * v
        if pid == 0:
            tl.store(xt_out_ptr + xt_ptrs, xt, mask=xt_mask)
    if TOKENS:
        cols = pid * BN + tl.arange(0, BN)
        if MLP:
            ks = tl.arange(0, BK)
            acc = tl.zeros((BLOCK_M, BN), dtype=tl.float32)
            for k0 in range(0, D, BK):
                wp = tl.load(wproj_ptr + (k0 + ks[:, None]) * A + acols[None, :], mask=a_ok[None, :], other=0.0)  # (BK, A)
                pre = tl.dot(xt, tl.trans(wp), input_precision=PRECISION) + tl.load(tbias_ptr + k0 + ks)[None, :]
                hidden = pre / (1.0 + tl.exp(-pre))  # silu
                wm = tl.load(wmlp_ptr + cols[:, None] * D + k0 + ks[None, :])  # (BN, BK)
                acc += tl.dot(hidden, tl.trans(wm), input_precision=PRECISION)
            acc += tl.load(bmlp_ptr + cols)[None, :]
        else:
            wp = tl.load(wproj_ptr + cols[:, None] * A + acols[None, :], mask=a_ok[None, :], other=0.0)  # (BN, A)
            acc = tl.dot(xt, tl.trans(wp), input_precision=PRECISION) + tl.load(tbias_ptr + cols)[None, :]
        tl.store(tok_ptr + (ROW0 + rows[:, None]) * D + cols[None, :], acc.to(tok_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
        if ROW0 > 0:  # pi0's state token leads the suffix; the step kernel overwrote its row
            tl.store(tok_ptr + cols, tl.load(state_ptr + cols))
        # the step kernel's arrival counters start its next launch at zero
        nprog = tl.num_programs(0)
        zeros = tl.zeros((ZB,), dtype=tl.int32)
        for start in range(pid * ZB, n_ctr, nprog * ZB):
            idx = start + tl.arange(0, ZB)
            tl.store(ctr_ptr + idx, zeros, mask=idx < n_ctr)
        for start in range(pid * ZB, n_tile_ctr, nprog * ZB):
            idx = start + tl.arange(0, ZB)
            tl.store(tile_ctr_ptr + idx, zeros, mask=idx < n_tile_ctr)


# The kernel's tiling: BN columns of the next tokens a program, BK-deep loads, warps, stages.
TILING = {"block_n": 16, "block_k": 64, "num_warps": 4, "num_stages": 3}


def between_steps(x: torch.Tensor, tokens_out: torch.Tensor, xt_in: torch.Tensor, xt_out: torch.Tensor | None, heads: dict, time_row: torch.Tensor | None,
                  dt: float, eps: float, row0: int, counters: tuple[torch.Tensor, torch.Tensor] | None,
                  final_scale: torch.Tensor | None, final_shift: torch.Tensor | None = None, tokens: bool = True,
                  block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None) -> None:
    """One launch between two steps (see the module docstring):
    x (Ts, D): the step's output, its last H rows read (unless this is the first step:
      final_scale None); tokens_out (Ts, D), another buffer (every program reads all of x):
      with `tokens`, rows [row0, row0 + H) get the next step's action tokens and row 0
      heads["state"] (pi0, row0 = 1)
    xt_in (H, A) float32: x_t; xt_out (H, A): where x_t + dt * v goes (a different buffer)
    heads: float32 "w_out" (A, D), "b_out" (A,); pi0: "w_proj" (D, A) (action_time_mlp_in on
      the actions, action_in_proj folded in), "w_mlp" (D, D), "b_mlp" (D,), "state" (D,) in x's
      dtype; pi0.5: "w_in" (D, A), "b_in" (D,)
    time_row (D,): pi0's tabulated time term of the next step (None for pi0.5)
    final_scale (D,) float32: the final norm's scale (1 + w; pi0.5: 1 + this step's scale) and
      final_shift (pi0.5's shift); counters: the step kernel's (counters, tile_counters)."""
    Ts, D = x.shape
    H, A = xt_in.shape
    block_n, block_k = block_n or TILING["block_n"], block_k or TILING["block_k"]
    num_warps, num_stages = num_warps or TILING["num_warps"], num_stages or TILING["num_stages"]
    first = final_scale is None
    mlp = "w_mlp" in heads
    if not first and xt_out is None:
        raise ValueError("between_steps: the Euler update needs an output buffer (xt_out)")
    block_k, block_n = min(block_k, D), min(block_n, D)
    if D % block_k or D % block_n or row0 + H != Ts or H > 64:
        raise ValueError(f"between_steps: unsupported shapes x {tuple(x.shape)}, x_t {tuple(xt_in.shape)} (a width that "
                         f"{block_k} and {block_n} divide, at most 64 action rows, the actions the last rows of the suffix)")
    if xt_in.dtype != torch.float32 or heads["w_out"].dtype != torch.float32:
        raise ValueError("between_steps: x_t and the heads must be float32")
    if tokens and mlp and time_row is None:
        raise ValueError("between_steps: pi0's next tokens need the next step's time row")
    w_proj = heads["w_proj"] if mlp else heads["w_in"]
    bias = (time_row if time_row is not None else heads["b_out"]) if mlp else heads["b_in"]  # b_out: not read
    ctr, tile_ctr = counters if counters is not None else (xt_in, xt_in)  # not written without tokens
    grid = (D // block_n,) if tokens else (1,)
    if tokens_out.shape != x.shape or tokens_out.data_ptr() == x.data_ptr():
        raise ValueError("between_steps: the tokens go to a buffer of x's shape other than x")
    _between_steps_kernel[grid](
        x, tokens_out, xt_in, xt_out if xt_out is not None else xt_in, heads["w_out"], heads["b_out"],
        final_scale if final_scale is not None else heads["b_out"], final_shift if final_shift is not None else heads["b_out"],
        w_proj, bias, heads.get("w_mlp", w_proj), heads.get("b_mlp", bias), heads.get("state", x),
        ctr, tile_ctr, ctr.numel() if counters is not None else 0, tile_ctr.numel() if counters is not None else 0,
        H, float(eps), float(dt),
        D=D, A=A, AP=max(16, triton.next_power_of_2(A)), BLOCK_M=max(16, triton.next_power_of_2(H)), BN=block_n, BK=block_k, ZB=256, ROW0=row0, FIRST=first,
        TOKENS=tokens, MLP=mlp, SHIFT=final_shift is not None,
        PRECISION="tf32x3" if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] >= 8 else "ieee",
        num_warps=num_warps, num_stages=num_stages,
    )


def denoise_loop(x_t: torch.Tensor, heads: dict, steps: int, time_rows: torch.Tensor | None, final_scales: torch.Tensor,
                 final_shifts: torch.Tensor | None, dt: float, eps: float, step_args: dict,
                 step_mods: torch.Tensor | None = None, mark=None) -> torch.Tensor:
    """All `steps` Euler steps of one sample, the expert layers of each through the step kernel:
    steps + 1 launches of `_between_steps_kernel` around the step-kernel launches, whose
    buffers are set up once. x_t (H, A) float32 noise; returns x_t after the last step.

    heads: as between_steps'; time_rows (steps, D): pi0's per-step time terms (None for pi0.5);
    final_scales, final_shifts (steps, D) or (D,): the final norm's after each step (shifts None
    for pi0); step_args: expert_step's arguments other than x and mod (the stacked weights, the
    cache, RoPE tables, mask, eps); step_mods (steps, ...): pi0.5's per-step modulation tables.
    mark: called with "denoise_step_<i>" before each step's launches and "end" after (profiling).
    """
    H = x_t.shape[0]
    row0 = 0 if time_rows is None else 1
    wqkv = step_args["wqkv"]
    x0 = torch.empty(row0 + H, wqkv.shape[-1], dtype=wqkv.dtype, device=x_t.device)
    launch = S.prepare_step(x0, **step_args, mod=None if step_mods is None else step_mods[0])
    counters = (launch.counters, launch.tile_counters)
    xs = (launch.x, torch.empty_like(launch.x))  # step i runs on xs[i % 2]; its tokens come from step i - 1's
    bufs = (torch.empty_like(x_t, dtype=torch.float32), torch.empty_like(x_t, dtype=torch.float32))
    xt = x_t.float().contiguous()
    mark = mark or (lambda stage: None)

    def per_step(t: torch.Tensor | None, i: int) -> torch.Tensor | None:
        return None if t is None else t[i] if t.dim() == 2 else t

    mark("denoise_step_0")
    between_steps(xs[1], xs[0], xt, None, heads, per_step(time_rows, 0), dt, eps, row0, counters, None)
    for i in range(steps):
        if i:
            mark(f"denoise_step_{i}")
        S.set_step_input(launch, xs[i % 2])
        S.launch_step(launch, None if step_mods is None else step_mods[i])
        last = i == steps - 1
        out = bufs[i % 2]  # x_t and x_t + dt * v in different buffers: every program reads x_t
        between_steps(xs[i % 2], xs[(i + 1) % 2], xt, out, heads, None if last else per_step(time_rows, i + 1), dt, eps, row0, counters,
                      per_step(final_scales, i), per_step(final_shifts, i), tokens=not last)
        xt = out
    mark("end")
    return xt
