"""SwiGLU on the MLP's packed ``[gate; up]`` projection: one input, one gradient, no ``cat``.

The SwiGLU MLP's ``linear_fc1`` writes ``h = [gate | up]`` (``[N, 2F]``, megatron's layout), and
the activation is ``silu(gate) * up``. Taking ``h.chunk(2, -1)`` and calling FLA 0.6.0's ``swiglu``
on the two views computes the same values, but its backward returns the two gradients as separate
tensors, which autograd then concatenates into ``h``'s gradient: a second pass over the ``[N, 2F]``
gradient (``CatArrayBatchedCopy``: 11.5 ms of a 301 ms kda_300M step at micro-batch 32 in
an H100 profile of 2026-12-05, most of it this one). Here the backward writes the packed gradient directly:
one kernel reads ``h`` and the output gradient and writes ``dh``, and nothing else runs.

The arithmetic is FLA's, term for term, in fp32 with one rounding to the output's dtype:
``out = g * sigmoid(g) * u``; ``dg = dout * s * (1 + g * (1 - s)) * u`` and ``du = dout * g * s``
with ``s = sigmoid(g)``. Each program takes a tile of ``BT`` rows by ``BF`` columns of one half.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor

TILE_ELEMENTS = 4096
"""Elements of the output per program (``BT`` rows x ``BF`` columns)."""


@triton.jit
def _swiglu_fwd_kernel(H, OUT, N, F: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    m = (rows < N)[:, None] & (cols < F)[None, :]
    r = rows.to(tl.int64)[:, None]
    g = tl.load(H + r * (2 * F) + cols[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.load(H + r * (2 * F) + F + cols[None, :], mask=m, other=0.0).to(tl.float32)
    o = g * tl.sigmoid(g) * u
    tl.store(OUT + r * F + cols[None, :], o.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _swiglu_bwd_kernel(H, DO, DH, N, F: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    m = (rows < N)[:, None] & (cols < F)[None, :]
    r = rows.to(tl.int64)[:, None]
    g = tl.load(H + r * (2 * F) + cols[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.load(H + r * (2 * F) + F + cols[None, :], mask=m, other=0.0).to(tl.float32)
    do = tl.load(DO + r * F + cols[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = do * s * (1.0 + g * (1.0 - s)) * u
    du = do * (g * s)
    tl.store(DH + r * (2 * F) + cols[None, :], dg.to(DH.dtype.element_ty), mask=m)
    tl.store(DH + r * (2 * F) + F + cols[None, :], du.to(DH.dtype.element_ty), mask=m)


def _grid(n: int, f: int) -> tuple[tuple[int, int], int, int]:
    bf = min(1024, triton.next_power_of_2(f))
    bt = max(1, min(TILE_ELEMENTS // bf, triton.next_power_of_2(max(1, n))))
    return (triton.cdiv(n, bt), triton.cdiv(f, bf)), bt, bf


def swiglu_fwd(h: Tensor) -> Tensor:
    """``silu(h[:, :F]) * h[:, F:]`` of a contiguous 2-D ``h`` ``[N, 2F]``, in ``h``'s dtype."""
    n, f = h.shape[0], h.shape[1] // 2
    out = torch.empty((n, f), dtype=h.dtype, device=h.device)
    grid, bt, bf = _grid(n, f)
    _swiglu_fwd_kernel[grid](h, out, n, F=f, BT=bt, BF=bf, num_warps=4)
    return out


def swiglu_bwd(h: Tensor, dout: Tensor) -> Tensor:
    """The gradient of :func:`swiglu_fwd` at ``h`` for ``dout`` ``[N, F]``, packed as ``h``."""
    n, f = h.shape[0], h.shape[1] // 2
    dh = torch.empty_like(h)
    grid, bt, bf = _grid(n, f)
    _swiglu_bwd_kernel[grid](h, dout, dh, n, F=f, BT=bt, BF=bf, num_warps=4)
    return dh


class _PackedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):  # type: ignore[override]
        shape = h.shape
        h2 = h.reshape(-1, shape[-1]).contiguous()
        ctx.save_for_backward(h2)
        ctx.shape = shape
        return swiglu_fwd(h2).view(*shape[:-1], shape[-1] // 2)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        (h2,) = ctx.saved_tensors
        dh = swiglu_bwd(h2, dout.reshape(-1, dout.shape[-1]).contiguous())
        return dh.view(ctx.shape)


def packed_swiglu(h: Tensor) -> Tensor:
    """``silu(gate) * up`` of ``h = [gate | up]`` (last dimension ``2F``) -> ``[..., F]``; the
    backward writes ``h``'s gradient in one piece (see the module docstring)."""
    if h.shape[-1] % 2:
        raise ValueError(f"packed SwiGLU needs an even last dimension, got {h.shape[-1]}")
    return _PackedSwiGLU.apply(h)
