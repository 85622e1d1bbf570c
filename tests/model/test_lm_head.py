"""The chunked LM-head loss (zebractl.model.ops.lm_head) against an fp64 reference.

Inputs are fresh random tensors each run (the seed is printed on failure). Tolerances:
- fp32 inputs: relative L2 error of loss, input and weight gradients <= 1e-5 (fp32 arithmetic).
- bf16 inputs: the logits and their gradient are bf16 (as in FLA), so every result carries the bf16
  floor (~1e-3). The weight gradient must be no worse than 1.25x the error of torch's own unchunked
  bf16 computation (F.linear in bf16 -> fp32 cross-entropy -> autograd), and must not grow with the
  number of chunks (fp32 accumulation across chunks); accumulating across chunks in bf16 (FLA's
  ``accumulate_grad_in_fp32=False``) fails that bound, which the mutation test shows.
The GPU test (``-m gpu``) checks FLA's Triton cross-entropy path and the tensor-core accumulation
against the same reference and against FLA 0.6.0's own fused linear cross-entropy.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from zebractl.model.ops import lm_head  # noqa: E402

F = torch.nn.functional


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _inputs(n=384, h=64, v=1000, dtype=torch.float32, device="cpu", ignored=0.1):
    x = (torch.randn(n, h, device=device) * 2).to(dtype)
    w = (torch.randn(v, h, device=device) * 0.05).to(dtype)
    y = torch.randint(0, v, (n,), device=device)
    y[torch.rand(n, device=device) < ignored] = -100
    return x, w, y


def _reference(x, w, y, scale=1.0):
    """fp64 loss and gradients of the same (rounded) operands."""
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    loss = F.cross_entropy(F.linear(xr, wr), y, ignore_index=-100, reduction="sum")
    (loss * scale).backward()
    return loss.detach(), xr.grad, wr.grad


def _ours(x, w, y, chunks, scale=1.0, **kw):
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = lm_head.linear_cross_entropy(x, w, y, num_chunks=chunks, **kw)
    (loss * scale).backward()
    return loss.detach(), x.grad, w.grad


def _torch_bf16(x, w, y):
    """torch's own unchunked bf16 pipeline: the floor every bf16 model pays."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    loss = F.cross_entropy(F.linear(x, w).float(), y, ignore_index=-100, reduction="sum")
    loss.backward()
    return loss.detach(), x.grad, w.grad


@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_fp32_matches_fp64(chunks):
    x, w, y = _inputs()
    scale = 1.0 / (y != -100).sum().item()  # the trainer's mean over tokens
    ref = _reference(x, w, y, scale)
    got = _ours(x, w, y, chunks, scale)
    for name, a, b in zip(("loss", "dx", "dw"), got, ref, strict=True):
        assert a.dtype == torch.float32
        err = _rel(a, b)
        assert err <= 1e-5, f"{name}: relative L2 error {err:.2e} > 1e-5"


def test_bf16_weight_gradient_at_the_bf16_floor_and_independent_of_chunks():
    x, w, y = _inputs(n=2048, h=64, v=3000, dtype=torch.bfloat16)
    _, dx_ref, dw_ref = _reference(x, w, y)
    _, dx_floor, dw_floor = _torch_bf16(x, w, y)
    floor = _rel(dw_floor, dw_ref)
    errs = {}
    for chunks in (1, 16, 64):
        loss, dx, dw = _ours(x, w, y, chunks)
        assert dx.dtype == dw.dtype == torch.bfloat16 and loss.dtype == torch.float32
        errs[chunks] = _rel(dw, dw_ref)
        assert _rel(dx, dx_ref) <= 1.25 * _rel(dx_floor, dx_ref) + 1e-6
    assert max(errs.values()) <= 1.25 * floor, f"dW errors {errs} vs torch bf16 floor {floor:.2e}"
    assert errs[64] <= 1.1 * errs[1] + 1e-6, f"dW error grows with the chunks: {errs}"


def test_bf16_accumulation_across_chunks_would_fail_the_bound(monkeypatch):
    """The accuracy test can fail: accumulating the weight gradient across chunks in bf16 (what
    FLA's accumulate_grad_in_fp32=False does) breaks the bound above."""
    x, w, y = _inputs(n=2048, h=64, v=3000, dtype=torch.bfloat16)
    _, _, dw_ref = _reference(x, w, y)
    _, _, dw_floor = _torch_bf16(x, w, y)

    def bf16_accumulate(dw, dlogits, xc):
        dw.copy_((dw.to(torch.bfloat16) + (dlogits.t().float() @ xc.float()).bfloat16()).float())

    monkeypatch.setattr(lm_head, "_accumulate_dw", bf16_accumulate)
    _, _, dw = _ours(x, w, y, 64)
    assert _rel(dw, dw_ref) > 1.25 * _rel(dw_floor, dw_ref)


def test_autocast_keeps_fp32_parameters_gradients_fp32():
    """torch_fused engine: fp32 weights under bf16 autocast get an fp32 gradient (unrounded)."""
    x, w, y = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, dx, dw = _ours(x, w, y, 4)
    assert dx.dtype == dw.dtype == torch.float32
    xb, wb = x.bfloat16(), w.bfloat16()
    _, _, dw_ref = _reference(xb, wb, y)
    _, _, dw_floor = _torch_bf16(xb, wb, y)
    assert _rel(dw, dw_ref) <= 1.25 * _rel(dw_floor.float(), dw_ref)


def test_ignored_labels_contribute_nothing():
    x, w, y = _inputs(ignored=0.0)
    y[::2] = -100
    loss, dx, dw = _ours(x, w, y, 5)
    ref_loss, ref_dx, ref_dw = _reference(x[1::2], w, y[1::2])
    assert _rel(loss, ref_loss) <= 1e-5 and _rel(dw, ref_dw) <= 1e-5
    assert torch.count_nonzero(dx[::2]) == 0
    assert _rel(dx[1::2], ref_dx) <= 1e-5
    y[:] = -100
    loss, dx, dw = _ours(x, w, y, 5)
    assert loss.item() == 0.0 and not dx.any() and not dw.any()


@pytest.mark.parametrize("tokens,chunks,expected", [(10, 3, 4), (10, 20, 1), (1, 1, 1), (0, 4, 1)])
def test_chunk_size(tokens, chunks, expected):
    assert lm_head.chunk_size(tokens, chunks) == expected


@pytest.mark.gpu
def test_gpu_fla_path_accuracy_against_fp64_and_fla():
    """CUDA: FLA's cross-entropy kernels + tensor-core fp32 accumulation (the production path) vs
    fp64, at the bf16 floor and no worse than FLA 0.6.0's fp32-accumulating fused loss (within 1.1x),
    clearly better than FLA's bf16 accumulation."""
    pytest.importorskip("fla")
    from fla.modules.fused_linear_cross_entropy.ops import fused_linear_cross_entropy_loss as flce

    x, w, y = _inputs(n=8192, h=256, v=32000, dtype=torch.bfloat16, device="cuda")
    _, _, dw_ref = _reference(x, w, y)
    _, _, dw = _ours(x, w, y, 8, ce_kernel="fla")
    ours = _rel(dw, dw_ref)

    def fla_dw(acc32: bool) -> torch.Tensor:
        wg = w.detach().clone().requires_grad_()
        flce(x, y, wg, num_chunks=8, reduction="sum", accumulate_grad_in_fp32=acc32).backward()
        return wg.grad

    fla32, fla16 = _rel(fla_dw(True), dw_ref), _rel(fla_dw(False), dw_ref)
    print(
        f"dW relative L2 vs fp64: ours {ours:.3e}, FLA fp32-acc {fla32:.3e}, FLA bf16-acc {fla16:.3e}"
    )
    assert ours <= 1.1 * fla32 + 1e-6
    assert ours < fla16
