"""The LM head and its loss, chunked over tokens, with every product on the tensor cores.

``linear_cross_entropy(hidden, weight, labels)`` is the summed token cross-entropy of
``hidden @ weight.T``. Like FLA's fused linear cross-entropy it never materialises the
``[tokens x vocab]`` logits: the tokens are taken ``chunk`` at a time, and each chunk's loss and
gradients are computed in the forward pass (the loss is a scalar, so nothing else is needed), which
frees the chunk's logits before the next one. What differs is the weight gradient. FLA 0.6.0 (its
default ``accumulate_grad_in_fp32=True``) casts each chunk's logit gradient and inputs to fp32 and
accumulates with an fp32 GEMM, which runs without tensor cores (50 TFLOP/s on an H200, half of a
300M model's training step); with ``accumulate_grad_in_fp32=False`` it accumulates across chunks in
bf16 and loses accuracy. Here each chunk's product takes the bf16 operands as they are and
accumulates into an fp32 buffer inside one cuBLAS call (``torch.addmm(..., out_dtype=float32)``):
the products of bf16 numbers are exact in fp32 and the sums are fp32, so the weight gradient is as
accurate as the fp32 GEMM's and costs what a bf16 GEMM costs. No fp32 copy of a logit chunk or of the
inputs is made; TF32 is never switched on.

Per chunk (C tokens, V vocabulary, H hidden), in the compute dtype:

1. ``logits = x_c @ W.T`` (a bf16 GEMM, ``[C, V]``);
2. loss and ``dlogits = softmax(logits) - onehot(label)`` in fp32 arithmetic, written over the
   logits in place (``ce_kernel``: FLA's two Triton cross-entropy kernels, zebractl's one-pass
   kernel of :mod:`zebractl.model.ops.softmax_ce`, or torch on any device);
3. ``dx_c = dlogits @ W`` (bf16 GEMM) and ``dW += dlogits.T @ x_c`` (fp32 accumulator).

The backward pass scales the stored gradients by the incoming gradient (``d loss_sum``) and casts
them to the dtypes of ``hidden`` and ``weight``; the weight gradient stays fp32 until then, so an
fp32 weight (the torch_fused engine) receives it unrounded. Labels equal to ``ignore_index`` add
nothing to the loss or the gradients.

Memory: the fp32 weight-gradient accumulator (``V x H x 4`` bytes), the input gradient (as large as
``hidden``) and one chunk of logits (``C x V`` in the compute dtype).
"""

from __future__ import annotations

from typing import Literal

import torch

Tensor = torch.Tensor
CeKernel = Literal["torch", "fla", "one_pass"]


def chunk_size(tokens: int, num_chunks: int) -> int:
    """Tokens per chunk: ``tokens`` split into ``num_chunks`` (at least one token per chunk)."""
    return max(1, -(-tokens // max(1, num_chunks)))


def _ce_torch(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """Per-token loss of ``logits`` (fp32), and the logit gradient written over ``logits``.

    Two sweeps of the chunk: one fused log-softmax in fp32, then its exponent written straight
    over ``logits`` (the softmax, rounded once to their dtype); the target entries (``p - 1``,
    fp32) and the rows of ignored labels are written after. On a CPU, where this is much of a tiny
    recipe's step, 2.8x faster than a log-sum-exp, ``exp(logits - lse)`` and a copy back
    (benchmarks/results/2026-12-07_cpu_5ba95d3_lm_head_loss)."""
    valid = labels != ignore_index
    safe = labels.masked_fill(~valid, 0)
    logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    target = logp.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, -target, torch.zeros_like(target))
    torch.exp(logp, out=logits)
    del logp
    rows = torch.arange(logits.shape[0], device=logits.device)
    logits[rows, safe] = target.exp().sub_(1.0).to(logits.dtype)
    if logits.is_cuda:  # no host sync
        logits.masked_fill_(~valid[:, None], 0.0)
    else:  # only the ignored rows
        logits[(~valid).nonzero().squeeze(1)] = 0.0
    return loss


def _ce_fla(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """The same with FLA's Triton cross-entropy kernels (forward, then the in-place gradient)."""
    from fla.modules.fused_cross_entropy.ops import cross_entropy_bwd, cross_entropy_fwd

    loss, _, lse, total, start = cross_entropy_fwd(
        logits=logits, target=labels, ignore_index=ignore_index
    )
    ones = torch.ones((), dtype=torch.float32, device=logits.device).expand(logits.shape[0])
    cross_entropy_bwd(
        logits=logits,
        target=labels,
        lse=lse,
        dloss=ones,
        ignore_index=ignore_index,
        total_classes=total,
        class_start_idx=start,
        inplace_backward=True,
    )
    return loss


def _ce_one_pass(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """The same with zebractl's one-pass kernel (one launch per chunk, each row swept twice)."""
    from zebractl.model.ops.softmax_ce import ce_rows_

    return ce_rows_(logits, labels, ignore_index)


_CE = {"torch": _ce_torch, "fla": _ce_fla, "one_pass": _ce_one_pass}


def _accumulate_dw(dw: Tensor, dlogits: Tensor, x: Tensor) -> None:
    """``dw += dlogits.T @ x`` into the fp32 ``dw``: tensor-core products with fp32 accumulation
    on CUDA (bf16/fp16 operands), fp32 arithmetic elsewhere (exact products of the same operands)."""
    if dw.is_cuda and dlogits.dtype in (torch.bfloat16, torch.float16):
        torch.addmm(dw, dlogits.t(), x, out_dtype=torch.float32, out=dw)
    else:
        dw.addmm_(dlogits.t().float(), x.float())


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        chunk: int,
        ignore_index: int,
        compute_dtype: torch.dtype,
        ce_kernel: CeKernel,
    ) -> Tensor:
        x = hidden.to(compute_dtype)
        w = weight.to(compute_dtype)
        n = x.shape[0]
        dx = torch.empty_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        ce = _CE[ce_kernel]
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            xc, yc = x[start:end], labels[start:end]
            logits = torch.mm(xc, w.t())  # [C, V], becomes dlogits in place
            loss += ce(logits, yc, ignore_index).sum()
            torch.mm(logits, w, out=dx[start:end])
            _accumulate_dw(dw, logits, xc)
            del logits
        ctx.save_for_backward(dx, dw)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        dx, dw = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        g = grad.to(torch.float32)
        d_hidden = _scaled(dx, g, h_dtype)
        dw.mul_(g)  # fp32, once; then one rounding to the weight's dtype
        return d_hidden, dw.to(w_dtype), None, None, None, None, None


_ROWS = 8192
"""Rows per step of the backward scaling (bounds its fp32 temporary)."""


def _scaled(t: Tensor, g: Tensor, dtype: torch.dtype) -> Tensor:
    """``t * g`` in fp32 arithmetic, rounded once to ``dtype`` (in place when the dtypes agree)."""
    if t.dtype == torch.float32:
        return t.mul_(g).to(dtype)
    out = t if dtype == t.dtype else torch.empty(t.shape, dtype=dtype, device=t.device)
    for start in range(0, t.shape[0], _ROWS):
        rows = slice(start, start + _ROWS)
        out[rows].copy_(t[rows].float().mul_(g))
    return out


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    num_chunks: int,
    ignore_index: int = -100,
    ce_kernel: CeKernel = "torch",
) -> Tensor:
    """Summed token cross-entropy of ``hidden [N, H] @ weight[V, H].T`` against ``labels [N]``
    (fp32 scalar), chunked over the N tokens into ``num_chunks`` pieces.

    The compute dtype is the autocast dtype when autocast is on for the device, else ``hidden``'s.
    ``ce_kernel``: the softmax part on torch (any device), FLA's Triton cross-entropy kernels or
    zebractl's one-pass kernel (``fla``, ``one_pass``: CUDA, or Triton's interpreter).
    """
    dev = hidden.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden.dtype
    chunk = chunk_size(hidden.shape[0], num_chunks)
    with torch.autocast(dev, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden, weight, labels, chunk, ignore_index, dtype, ce_kernel
        )
