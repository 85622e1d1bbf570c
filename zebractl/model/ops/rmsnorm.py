"""The fused RMSNorm (with the residual add of a pre-norm block): FLA's forward, our backward.

FLA 0.6.0's ``rms_norm`` backward for rows wider than 512 (``layer_norm_bwd_kernel_row``) runs one
program per SM, each walking its ~250 rows one at a time: latency-bound. On an H200 its 25 calls of a
kda_300M step (rows of 1024, micro-batch 16) took 9.2 ms, four times the forward, for about 1.7 ms
worth of memory traffic (benchmarks/README.md, the profile of 2026-12-01 at 1ad596d). Ours gives each program
one tile of ``BT`` rows (thousands of programs, no loop) and writes each tile's fp32 weight-gradient
row, summed afterwards (32 MB of partials for 32,768 rows of 1024). The arithmetic is FLA's: fp32
throughout, ``x_hat = x * rstd``, ``dx = (w * dy - x_hat * mean(x_hat * w * dy)) * rstd
(+ d residual)``, one rounding to each output's dtype (round to nearest even). One difference:
FLA's row kernel rounds ``dx`` to dx's dtype before storing the residual's gradient, so with a bf16
``x`` and an fp32 residual its fp32 residual gradient is bf16-valued (1.6e-3 relative); ours rounds
each output once from the fp32 value (tests/model/test_rmsnorm.py checks both against fp64).

The forward (``forward``): FLA's ``layer_norm_fwd`` (one program per row for rows wider than 512:
6.5 ms for a kda_300M step's 25 calls at micro-batch 32 on an H100 against 4.0 ms of memory traffic
at the H100's rate; benchmarks/README.md, the profile of 2026-12-06 at 45a9fe8) or ours
(``tiled``: a tile of rows per program, FLA's arithmetic: the residual added in fp32, the fp32 sum
normalised, ``y = (x * rstd) * w``, one rounding per output). With a
residual it stores the sum (in the residual's dtype) that the next block adds to and the backward
reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor

TILE_ELEMENTS = 4096
"""Elements per program: ``BT`` rows x the row width rounded up to a power of two (4 rows of 1024;
five fp32 tiles live at once, ~80 registers per thread at 4 warps)."""


@triton.jit
def _rms_norm_bwd_kernel(
    X,  # the normalised input (with a residual: the sum), [T, D]
    W,  # [D]
    DY,  # [T, D]
    DRES,  # gradient arriving at the stored sum (prenorm), [T, D] or unused
    DX,  # [T, D]
    DRES_IN,  # the residual's gradient when its dtype differs from DX's, [T, D] or unused
    DW,  # fp32 partial weight gradients, [programs, D]
    RSTD,  # [T]
    T,
    D: tl.constexpr,
    BD: tl.constexpr,
    BT: tl.constexpr,
    HAS_DRES: tl.constexpr,
    STORE_DRES_IN: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    cmask = cols < D
    rows = pid * BT + tl.arange(0, BT)
    rmask = rows < T
    m = rmask[:, None] & cmask[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + off, mask=m, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    xhat = x * rstd[:, None]
    wdy = dy * w[None, :]
    c1 = tl.sum(xhat * wdy, axis=1) / D
    dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
    if HAS_DRES:
        dx += tl.load(DRES + off, mask=m, other=0.0).to(tl.float32)
    if STORE_DRES_IN:
        tl.store(
            DRES_IN + off, dx.to(DRES_IN.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m
        )
    tl.store(DX + off, dx.to(DX.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m)
    tl.store(DW + pid.to(tl.int64) * D + cols, tl.sum(dy * xhat, axis=0), mask=cmask)


@triton.jit
def _rms_norm_fwd_kernel(
    X,  # [T, D]
    RES,  # the residual, [T, D] or unused
    W,  # [D]
    Y,  # [T, D]
    RES_OUT,  # the sum x + residual in the residual's dtype, [T, D] or unused
    RSTD,  # [T]
    T,
    eps,
    D: tl.constexpr,
    BD: tl.constexpr,
    BT: tl.constexpr,
    HAS_RES: tl.constexpr,
    STORE_RES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    cmask = cols < D
    rows = pid * BT + tl.arange(0, BT)
    rmask = rows < T
    m = rmask[:, None] & cmask[None, :]
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(RES + off, mask=m, other=0.0).to(tl.float32)
    if STORE_RES:
        tl.store(RES_OUT + off, x.to(RES_OUT.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    tl.store(RSTD + rows, rstd, mask=rmask)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]) * w[None, :]
    tl.store(Y + off, y.to(Y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m)


def _tile(t: int, d: int) -> tuple[int, int, int]:
    """(BD, BT, programs) for rows of ``d`` and ``t`` rows: ``TILE_ELEMENTS`` per program."""
    bd = triton.next_power_of_2(d)
    bt = max(1, min(TILE_ELEMENTS // bd, triton.next_power_of_2(max(1, t))))
    return bd, bt, triton.cdiv(t, bt)


def rms_norm_fwd(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, rstd, the normalised input) of ``y = RMSNorm(x [+ residual]) * weight`` for 2-D
    contiguous ``x``/``residual``, FLA's ``layer_norm_fwd(..., is_rms_norm=True)`` contract: the
    normalised input is the sum in the residual's dtype with a residual, else ``x`` itself."""
    t, d = x.shape
    bd, bt, programs = _tile(t, d)
    y = torch.empty_like(x)
    rstd = torch.empty((t,), dtype=torch.float32, device=x.device)
    res_out = torch.empty_like(residual) if residual is not None else None
    _rms_norm_fwd_kernel[(programs,)](
        x,
        residual if residual is not None else x,
        weight,
        y,
        res_out if res_out is not None else y,
        rstd,
        t,
        eps,
        D=d,
        BD=bd,
        BT=bt,
        HAS_RES=residual is not None,
        STORE_RES=res_out is not None,
        num_warps=4 if bt * bd <= 4096 else 8,
    )
    return y, rstd, res_out if res_out is not None else x


def rms_norm_bwd(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    rstd: Tensor,
    dres: Tensor | None,
    dx_dtype: torch.dtype,
    dres_in_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(dx, dw, d residual) of ``y = RMSNorm(x) * weight`` for 2-D contiguous ``x``/``dy``;
    ``dres`` is the gradient arriving at ``x`` itself (the stored sum of a pre-norm block), and
    ``dres_in_dtype`` the residual's dtype (None: no residual; equal to ``dx_dtype``: the same
    tensor as dx)."""
    t, d = x.shape
    bd, bt, programs = _tile(t, d)
    dx = torch.empty((t, d), dtype=dx_dtype, device=x.device)
    separate = dres_in_dtype is not None and dres_in_dtype != dx_dtype
    dres_in = torch.empty((t, d), dtype=dres_in_dtype, device=x.device) if separate else None
    dw = torch.empty((programs, d), dtype=torch.float32, device=x.device)
    _rms_norm_bwd_kernel[(programs,)](
        x,
        weight,
        dy,
        dres if dres is not None else dy,
        dx,
        dres_in if separate else dx,
        dw,
        rstd,
        t,
        D=d,
        BD=bd,
        BT=bt,
        HAS_DRES=dres is not None,
        STORE_DRES_IN=separate,
        num_warps=4 if bt * bd <= 4096 else 8,
    )
    residual_grad = None if dres_in_dtype is None else (dres_in if separate else dx)
    return dx, dw.sum(0).to(weight.dtype), residual_grad


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, prenorm, forward):  # type: ignore[override]
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        res2 = residual.reshape(-1, shape[-1]).contiguous() if residual is not None else None
        if forward == "tiled":
            y, rstd, res_out = rms_norm_fwd(x2, weight, eps, res2)
        else:
            from fla.modules.norm.layernorm import layer_norm_fwd

            y, _, rstd, res_out = layer_norm_fwd(
                x=x2, weight=weight, bias=None, eps=eps, residual=res2, is_rms_norm=True
            )
        ctx.save_for_backward(res_out, weight, rstd)
        ctx.shape, ctx.x_dtype, ctx.prenorm = shape, x.dtype, prenorm
        ctx.res_dtype = residual.dtype if residual is not None else None
        y = y.reshape(shape)
        return (y, res_out.reshape(shape)) if prenorm else y

    @staticmethod
    def backward(ctx, dy, *more):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        d = x.shape[-1]
        dres = more[0] if ctx.prenorm and more and more[0] is not None else None
        dx, dw, dres_in = rms_norm_bwd(
            dy.reshape(-1, d).contiguous(),
            x,
            weight,
            rstd,
            dres.reshape(-1, d).contiguous() if dres is not None else None,
            ctx.x_dtype,
            ctx.res_dtype,
        )
        dres_in = dres_in.reshape(ctx.shape) if dres_in is not None else None
        return dx.reshape(ctx.shape), dw, dres_in, None, None, None


def rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    residual: Tensor | None = None,
    prenorm: bool = False,
    forward: str = "fla",
) -> Tensor | tuple[Tensor, Tensor]:
    """FLA's ``rms_norm(x, weight, None, residual=..., eps=..., prenorm=...)`` with our backward:
    ``RMSNorm(x [+ residual]) * weight`` and, with ``prenorm``, the sum (in the residual's dtype);
    ``forward``: FLA's forward kernel (fla) or ours (tiled)."""
    return _RMSNorm.apply(x, weight, residual, eps, prenorm, forward)
