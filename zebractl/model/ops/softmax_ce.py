"""The LM-head loss's softmax part in one kernel: each row's loss and its logit gradient, written
over the logits, with the row read from memory once.

The chunked LM-head loss (:mod:`zebractl.model.ops.lm_head`) turns each chunk of logits
``[C, V]`` into the per-token loss and ``softmax(logits) - onehot(label)`` in place. FLA 0.6.0's
kernels take two launches: the forward reads every logit to find each row's log-sum-exp, and the
backward reads every logit again (from memory: the whole chunk has gone through in between) and
writes the gradient. That is three passes over ``C x V`` values; at kda_300M's 128,256-word
vocabulary and micro-batch 32 they cost 18.5 ms of a 288 ms step on an H100 (6.9 ms forward, 11.6
ms backward; benchmarks/README.md, 2026-12-06).

Here one program owns a row from start to end: it sweeps the row once for the running maximum and
sum of exponentials (block by block, one exponential per value), then sweeps it again, last block
first, writing the softmax minus one at the label. The grid is a few programs per SM, each
taking rows in turn, so that the rows in flight (256 KB each at that vocabulary) might stay in the
L2 cache for the second sweep. Measured on an H100 (2026-12-06, benchmarks/README.md): 1.047x FLA's
pair on a 2,048-row chunk at 2 programs per SM, which is three passes' bytes at FLA's rate: the
second sweep mostly misses L2 there (264 rows in flight, 67 MB, against its 50 MB), and one program
per SM (33 MB) is slower (0.88x: too few loads in flight). ``block`` and ``num_warps`` are
parameters for the next measurement (benchmarks/ce_kernel_bench.py), and so is ``lanes``: the
first sweep's maximum and sum kept per lane, reduced once per row, instead of across the program at
every step (its barriers stall the loads).

Arithmetic, in fp32 from the logits' dtype: ``log_s = log(sum exp(x - m))`` with the running
maximum ``m`` rescaling the sum at each block; ``loss = (m - x[label]) + log_s``; the gradient
``exp((x - m) - log_s) - [col == label]``, rounded once to the logits' dtype. The log-sum-exp
``m + log_s`` is never rounded as one number: at logits in the thousands its ulp would be the
gradient's error. A row whose label is
``ignore_index`` has loss 0 and a zero gradient. Labels outside ``[0, V)`` are the caller's to
refuse (the data verifier bounds token ids); they are read as no label here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor

BLOCK = 8192
"""Logits per sweep step of a program (at most; fewer for a smaller vocabulary)."""
PROGRAMS_PER_SM = 2
"""Programs in flight per SM (on an H100: 2, 4 and 8 within 0.2% of each other, 1 slower)."""


@triton.jit
def _ce_rows_kernel(
    X,
    LABELS,
    LOSS,
    N,
    V,
    stride,
    ignore_index,
    per_program: tl.constexpr,  # loop bounds as constants (Triton 3.6's interpreter, with numpy 2,
    nblocks: tl.constexpr,  # cannot loop to a runtime integer); one compile per chunk shape
    BV: tl.constexpr,
    LANES: tl.constexpr,  # the running maximum and sum per lane (no reduction per sweep step)
):
    cols = tl.arange(0, BV)
    for i in range(0, per_program):  # rows pid, pid + programs, ...; the last may be past N
        row = tl.program_id(0) + i * tl.num_programs(0)
        live = row < N
        base = X + tl.minimum(row, N - 1).to(tl.int64) * stride
        label = tl.load(LABELS + tl.minimum(row, N - 1)).to(tl.int64)
        # m starts finite, so a block of masked values never makes m - m_new a NaN
        if LANES:  # two exponentials per value, the reductions once per row
            mv = tl.full([BV], -3.0e38, tl.float32)
            sv = tl.zeros([BV], tl.float32)
            for b in range(0, nblocks):
                c = b * BV + cols
                x = tl.load(base + c, mask=(c < V) & live, other=float("-inf")).to(tl.float32)
                mn = tl.maximum(mv, x)
                sv = sv * tl.exp(mv - mn) + tl.exp(x - mn)
                mv = mn
            m = tl.max(mv, axis=0)
            s = tl.sum(sv * tl.exp(mv - m), axis=0)
        else:  # one exponential per value, a maximum and a sum across the program per step
            m = tl.max(tl.full([BV], -3.0e38, tl.float32), axis=0)
            s = tl.sum(tl.zeros([BV], tl.float32), axis=0)
            for b in range(0, nblocks):
                c = b * BV + cols
                x = tl.load(base + c, mask=(c < V) & live, other=float("-inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
                m = m_new
        # lse = m + log_s is never formed: at large logits its rounding (an ulp of m) would be the
        # gradient's error; x - m and m - target are exact or nearly, log_s is small
        log_s = tl.log(s)
        valid = (label != ignore_index) & (label >= 0) & (label < V)
        target = tl.load(base + label, mask=valid & live, other=0.0).to(tl.float32)
        tl.store(LOSS + row, tl.where(valid, (m - target) + log_s, 0.0), mask=live)
        keep = tl.where(valid, 1.0, 0.0)
        for j in range(0, nblocks):
            c = (nblocks - 1 - j) * BV + cols  # last block first: the most recently read
            x = tl.load(base + c, mask=(c < V) & live, other=0.0).to(tl.float32)
            g = tl.exp((x - m) - log_s) - tl.where(c == label, 1.0, 0.0)
            tl.store(base + c, (g * keep).to(X.dtype.element_ty), mask=(c < V) & live)


def _programs(device: torch.device, rows: int, per_sm: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(rows, sms * per_sm))
    return max(1, min(rows, 4))  # Triton's interpreter (tests)


def ce_rows_(
    logits: Tensor,
    labels: Tensor,
    ignore_index: int,
    programs_per_sm: int = PROGRAMS_PER_SM,
    block: int = BLOCK,
    num_warps: int | None = None,
    lanes: bool = False,
) -> Tensor:
    """Per-row loss (fp32 ``[C]``) of ``logits`` ``[C, V]`` (rows contiguous) against ``labels``
    ``[C]``; the logit gradient ``softmax - onehot`` is written over ``logits``. ``block``: logits
    per sweep step (a power of two); ``num_warps``: per program (default 16 from 4,096-wide steps,
    else 4); ``lanes``: keep the running maximum and sum per lane (two exponentials per value in
    the first sweep, no reduction across the program until the row's end)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be 2-D with contiguous rows, got {tuple(logits.shape)}")
    n, v = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss
    bv = min(block, triton.next_power_of_2(v))
    programs = _programs(logits.device, n, programs_per_sm)
    _ce_rows_kernel[(programs,)](
        logits, labels.contiguous(), loss, n, v, logits.stride(0), ignore_index,
        triton.cdiv(n, programs), triton.cdiv(v, bv), BV=bv, LANES=lanes,
        num_warps=num_warps or (16 if bv >= 4096 else 4),
    )  # fmt: skip
    return loss
