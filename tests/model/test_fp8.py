"""kernels.fp8_mlp: torchao's float8 MLP against an fp64 reference (CPU: emulated FP8 matmul).

Tolerances: e4m3 keeps 3 mantissa bits (rounding error up to 2^-4 per operand), so an FP8 product's
relative L2 error against fp64 is a few percent; the bound 0.12 holds for both recipes with a margin,
while any mistake of layout (gate/up swapped, a transposed weight, a missing activation) gives errors
of order 1. Inputs are fresh random draws (seed printed by conftest).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

import torch.nn.functional as F  # noqa: E402

from zebractl.model.ops import fp8  # noqa: E402

FP8_REL_L2 = 0.12


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def _reference(x, w1, b1, w2, b2):
    h = x @ w1.t() + b1
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w2.t() + b2


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_fp8_mlp_matches_fp64_output_and_gradients(recipe):
    r = fp8.FP8Recipe.build(recipe, emulate=True)
    t, h, f = 512, 64, 96
    x = torch.randn(2, t // 2, h).bfloat16().requires_grad_()
    w1 = (torch.randn(2 * f, h) / h**0.5).bfloat16().requires_grad_()
    b1 = (torch.randn(2 * f) * 0.1).bfloat16().requires_grad_()
    w2 = (torch.randn(h, f) / f**0.5).bfloat16().requires_grad_()
    b2 = (torch.randn(h) * 0.1).bfloat16().requires_grad_()
    y = fp8.swiglu_mlp(x, w1, b1, w2, b2, r)
    assert y.dtype == torch.bfloat16 and y.shape == (2, t // 2, h)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w1, b1, w2, b2), g)
    ref_in = [p.detach().double().requires_grad_() for p in (x, w1, b1, w2, b2)]
    y_ref = _reference(*ref_in)
    ref_grads = torch.autograd.grad(y_ref, ref_in, g.double())
    errors = [_rel(y, y_ref)] + [_rel(a, b) for a, b in zip(grads, ref_grads, strict=True)]
    assert all(e < FP8_REL_L2 for e in errors), errors
    for a, p in zip(grads, (x, w1, b1, w2, b2), strict=True):
        assert a.dtype == p.dtype  # gradients come back in the parameters' dtype


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_mlp_under_autocast_with_fp32_weights(recipe):
    """The torch_fused engine's way: fp32 parameters under bf16 autocast. The MLP computes on the
    input cast to bf16, returns bf16 like an autocast linear, and its weight gradients arrive in
    fp32 for the fp32 parameters, all within the FP8 bound of fp64."""
    r = fp8.FP8Recipe.build(recipe, emulate=True)
    t, h, f = 512, 64, 96
    x = torch.randn(2, t // 2, h, requires_grad=True)  # fp32: the residual stream of torch_fused
    w1 = (torch.randn(2 * f, h) / h**0.5).requires_grad_()
    w2 = (torch.randn(h, f) / f**0.5).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8.mlp_forward(x, w1, None, w2, None, r, fp8.swiglu_mlp)
    assert y.dtype == torch.bfloat16
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w1, w2), g)
    assert [a.dtype for a in grads] == [torch.float32] * 3
    ref_in = [p.detach().double().requires_grad_() for p in (x, w1, w2)]
    zero1, zero2 = torch.zeros(2 * f, dtype=torch.float64), torch.zeros(h, dtype=torch.float64)
    y_ref = _reference(ref_in[0], ref_in[1], zero1, ref_in[2], zero2)
    ref_grads = torch.autograd.grad(y_ref, ref_in, g.double())
    errors = [_rel(y, y_ref)] + [_rel(a, b) for a, b in zip(grads, ref_grads, strict=True)]
    assert all(e < FP8_REL_L2 for e in errors), errors


def test_fp8_error_is_fp8_sized_not_bf16_sized():
    """The emulation really quantises to FP8: its error is far above bf16's (else the test above
    would pass for a plain bf16 matmul and prove nothing)."""
    r = fp8.FP8Recipe.build("tensorwise", emulate=True)
    x = torch.randn(256, 64).bfloat16()
    w = (torch.randn(128, 64) / 8).bfloat16()
    ref = x.double() @ w.double().t()
    assert _rel(fp8.linear(x, w, None, r), ref) > 0.01 > _rel(x @ w.t(), ref)


def test_unsupported_reasons_name_the_setting_and_the_fix():
    cpu = torch.device("cpu")
    assert "precision bf16" in fp8.unsupported_reason(cpu, "fp32")
    why = fp8.unsupported_reason(cpu, "bf16")
    assert "compute capability 8.9" in why and "kernels.fp8_mlp=off" in why


def test_the_fp8_mlp_keeps_the_parameters_and_their_names():
    """FP8 changes how the MLP computes, not what it holds: same state-dict keys and shapes (so
    checkpoints and conversion are unaffected)."""
    from zebractl.config.resolve import resolve_recipe
    from zebractl.model.model import build_model

    plain = resolve_recipe("tiny_kda", []).run
    on = resolve_recipe("tiny_kda", ["kernels.fp8_mlp=tensorwise"]).run
    a = dict(build_model(plain.model, kernels=plain.kernels).named_parameters())
    b = dict(build_model(on.model, kernels=on.kernels).named_parameters())
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < fp8.MIN_CAPABILITY,
    reason="needs a CUDA GPU with FP8 tensor cores",
)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpu_compiled_fp8_mlp_matches_fp64(recipe):
    """The real path: torch._scaled_mm inside one compiled region, at a 300M model's MLP shape."""
    r = fp8.FP8Recipe.build(recipe)
    mlp = fp8.compiled_swiglu_mlp()
    dev, h, f = "cuda", 1024, 4096
    x = torch.randn(4, 2048, h, device=dev).bfloat16().requires_grad_()
    w1 = (torch.randn(2 * f, h, device=dev) * 0.02).bfloat16().requires_grad_()
    w2 = (torch.randn(h, f, device=dev) * 0.02).bfloat16().requires_grad_()
    y = mlp(x, w1, None, w2, None, r)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w1, w2), g)
    zero = torch.zeros(2 * f, dtype=torch.float64, device=dev)
    ref_in = [p.detach().double().requires_grad_() for p in (x, w1, w2)]
    y_ref = _reference(ref_in[0], ref_in[1], zero, ref_in[2], torch.zeros(h, device=dev).double())
    ref_grads = torch.autograd.grad(y_ref, ref_in, g.double())
    errors = [_rel(y, y_ref)] + [_rel(a, b) for a, b in zip(grads, ref_grads, strict=True)]
    print(f"{recipe}: rel L2 vs fp64 (out, dx, dw1, dw2) = {[f'{e:.4f}' for e in errors]}")
    assert all(e < FP8_REL_L2 for e in errors), errors
