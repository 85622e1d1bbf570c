"""Mamba2's SSD scan in the compute dtype on FLA's chunked simple-GLA kernels
(``kernels.ssd_precision: mixed``).

FLA 0.6.0's ``chunk_simple_gla`` keeps the backward's chunk states in fp32, and on a Hopper GPU with
Triton 3.4 to 3.7.0 its gated ``chunk_bwd_dqkwg`` must run on the TileLang backend, which takes every
operand in one dtype. So the ``fp32`` setting casts q, k and v to fp32 first: every operand, every
gradient and the output go through a cast, and the chunk kernels run on fp32 tiles (on a 300M Mamba2
hybrid at micro-batch 16 on an H100, casts and copies were a fifth of the step, 2026-12-05 profile).

Here the operands stay in the compute dtype (bf16) and FLA's own building blocks run the scan:

- forward: exactly FLA's (``chunk_local_cumsum`` of the gate pre-scaled by 1/ln 2, then
  ``chunk_simple_gla_fwd``, whose chunk states are bf16, as FLA's forward keeps them);
- backward: the chunk states recomputed in bf16 (the forward's own), their gradients ``dh`` in fp32
  as FLA computes them; ``dv`` from the fp32 ``dh`` (FLA's), ``dq``/``dk``/``dg`` from a bf16 copy of
  ``dh`` (the one rounding FLA's fp32 path does not make; every operand of that kernel in one dtype,
  so TileLang runs it where Triton cannot); the gate gradient's reverse cumulative sum as FLA's.

Accuracy (GPU test ``tests/model/test_ssd.py``): output and gradients against an fp64 reference
within the same bound as the fp32 path's, relative to the tensors' scale.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

CHUNK = 64
"""Tokens per chunk (FLA's default for simple GLA)."""


class _SSDMixed(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        initial_state: Tensor | None,
        output_final_state: bool,
        cu_seqlens: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        from fla.ops.simple_gla.chunk import chunk_simple_gla_fwd
        from fla.ops.utils import chunk_local_cumsum, prepare_chunk_indices
        from fla.ops.utils.constant import RCP_LN2

        idx = None if cu_seqlens is None else prepare_chunk_indices(cu_seqlens, CHUNK)
        gc = chunk_local_cumsum(
            g, chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=idx
        )
        o, ht = chunk_simple_gla_fwd(
            q=q,
            k=k,
            v=v,
            g=gc,
            scale=1.0,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            chunk_size=CHUNK,
            chunk_indices=idx,
        )
        ctx.save_for_backward(q, k, v, gc, initial_state, idx, cu_seqlens)
        ctx.g_dtype = g.dtype
        return o.to(q.dtype), ht

    @staticmethod
    def backward(ctx, do: Tensor, dht: Tensor | None):  # type: ignore[override]
        from fla.ops.common.chunk_h import chunk_bwd_dh, chunk_fwd_h
        from fla.ops.common.chunk_o import chunk_bwd_dqkwg, chunk_bwd_dv
        from fla.ops.utils import chunk_local_cumsum

        q, k, v, gc, h0, idx, cu = ctx.saved_tensors
        do = do.contiguous().to(q.dtype)
        common = {"cu_seqlens": cu, "chunk_size": CHUNK}
        h, _ = chunk_fwd_h(
            k=k, v=v, g=gc, h0=h0, output_final_state=False, states_in_fp32=False, **common
        )
        dh, dh0 = chunk_bwd_dh(
            q=q,
            k=k,
            v=v,
            g=gc,
            do=do,
            h0=h0,
            dht=dht,
            scale=1.0,
            states_in_fp32=True,
            **common,
        )
        dq, dk, _, dg = chunk_bwd_dqkwg(
            q=q,
            k=k,
            v=v,
            g=gc,
            h=h,
            do=do,
            dh=dh.to(q.dtype),
            scale=1.0,
            chunk_indices=idx,
            **common,
        )
        dv = chunk_bwd_dv(q=q, k=k, g=gc, do=do, dh=dh, scale=1.0, chunk_indices=idx, **common)
        dg = chunk_local_cumsum(dg, reverse=True, chunk_indices=idx, **common).to(ctx.g_dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dh0, None, None


def ssd_mixed(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``o = sum_j (q_i . k_j) exp(G_i - G_j) v_j`` (``G`` the cumulative sum of ``g`` per sequence),
    q, k ``[B,T,H,K]`` and v ``[B,T,H,V]`` in one 16-bit dtype, g ``[B,T,H]`` fp32; CUDA only.
    Returns the output (q's dtype) and the final state (or None)."""
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"ssd_mixed: q, k, v in one 16-bit dtype (got {q.dtype}, {k.dtype}, {v.dtype})"
        )
    q, k, v, g = (t.contiguous() for t in (q, k, v, g))
    return _SSDMixed.apply(q, k, v, g.float(), initial_state, output_final_state, cu_seqlens)
