"""The residual add fused into the next RMSNorm (``Norm.add`` / ``ops.add_rms_norm``).

CPU: the stack computed with ``step`` (the add inside the next norm) equals the stack computed with
each sublayer's own ``forward`` (``x + out``, then the next norm), bitwise on the torch backend.
GPU: FLA's fused kernel against the torch ops, forward and gradients, within bf16 rounding
(relative L2 < 1e-2: one bf16 rounding of the sum and of the output, ~4e-3 each, fresh inputs).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.model import ops  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.ops import KernelOptions  # noqa: E402


@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_hybrid"])
def test_fused_add_stack_equals_the_plain_residual_stack(recipe):
    cfg = resolve_recipe(recipe, []).run
    model = build_model(cfg.model, kernels=cfg.kernels).eval()
    stack = model.decoder
    x = torch.randn(2, 16, cfg.model.hidden_size)
    with torch.no_grad():
        fused = stack(x)
        y = x
        for layer in stack.layers:
            y = layer(y)
        plain = stack.final_norm(y)
    assert torch.equal(fused, plain)


@pytest.mark.gpu
def test_gpu_fla_fused_add_rms_norm_matches_torch():
    pytest.importorskip("fla")
    fla_opts, torch_opts = KernelOptions(backend="fla"), KernelOptions(backend="torch")
    h = 1024
    delta = torch.randn(4, 2048, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    resid = torch.randn(4, 2048, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(h, device="cuda")).bfloat16().requires_grad_()
    g_y, g_r = torch.randn_like(delta), torch.randn_like(delta)

    def run(opts):
        y, r = ops.add_rms_norm(opts, delta, resid, w, 1e-6)
        grads = torch.autograd.grad((y * g_y).sum() + (r * g_r).sum(), (delta, resid, w))
        return [y, r, *grads]

    for a, b in zip(run(fla_opts), run(torch_opts), strict=True):
        rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert rel < 1e-2, rel
