"""The optimizer-step patches of zebractl.runtime.megatron_compat against plain torch math.

Fresh random tensors each run; tolerances: norms 1e-6 relative to an fp64 reference (fp32
arithmetic), copies and scales bitwise equal to the per-tensor torch operation they replace.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.runtime import megatron_compat as mc  # noqa: E402


def _tensors():
    shapes = [(17,), (3, 5), (64, 33), (1,), (8, 8, 4)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.bfloat16]
    return [torch.randn(s).to(d) * 3 for s, d in zip(shapes, dtypes, strict=True)]


def test_foreach_l2norm_is_the_global_norm():
    ts = _tensors()
    got, _ = mc._foreach_l2norm(0, None, [ts], False)
    ref = torch.sqrt(sum((t.double() ** 2).sum() for t in ts))
    assert got.shape == (1,) and got.dtype == torch.float32
    assert abs(got.item() - ref.item()) <= 1e-6 * ref.item()
    empty, _ = mc._foreach_l2norm(0, None, [[]], False)
    assert empty.item() == 0.0


def test_foreach_scale_copies_and_scales_like_torch():
    src = [t.float() for t in _tensors()]
    dst = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
    mc._foreach_scale(0, None, [src, dst], 1.0)  # main (fp32) -> model (bf16) copy
    assert all(torch.equal(d, s.to(torch.bfloat16)) for s, d in zip(src, dst, strict=True))
    out = [torch.empty_like(t) for t in src]
    mc._foreach_scale(0, None, [src, out], 0.37)
    assert all(torch.equal(o, s * 0.37) for s, o in zip(src, out, strict=True))
    inplace = [t.clone() for t in src]
    mc._foreach_scale(0, None, [inplace, inplace], 0.5)  # clipping scales the grads in place
    assert all(torch.equal(i, s * 0.5) for s, i in zip(src, inplace, strict=True))


def test_optimizer_step_patches_megatrons_fallbacks_and_restores_them():
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as opt

    before = (opt.multi_tensor_scale_impl, clip.l2_norm_impl, clip.multi_tensor_scale_impl)
    grads = [t.float() for t in _tensors()]
    ref = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    with mc.optimizer_step():
        if not (mc.have_transformer_engine() or mc._have_apex()):
            assert clip.l2_norm_impl is mc._foreach_l2norm
            assert opt.multi_tensor_scale_impl is clip.multi_tensor_scale_impl is mc._foreach_scale
            # the call megatron's get_grad_norm_fp32 makes (the rest of it needs CUDA)
            norm, _ = clip.multi_tensor_applier(clip.l2_norm_impl, None, [grads], False)
            assert abs(norm.item() - ref) <= 1e-6 * ref
    assert (opt.multi_tensor_scale_impl, clip.l2_norm_impl, clip.multi_tensor_scale_impl) == before
