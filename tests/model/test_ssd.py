"""The Mamba2 mixer's speed levers: ``kernels.compile: glue`` and ``kernels.ssd_precision: mixed``.

CPU: the compiled glue (Inductor's C++ kernels) against the eager code on tiny_mamba in fp32: the
loss within 1e-6 relative and every gradient within 1e-5 relative L2 (Inductor may order a
reduction differently; nothing else differs). GPU: ``ssd_mixed`` (bf16 operands) against an fp64
reference of the same rounded inputs, next to FLA's fp32 path: each of o, dq, dk, dv, dg within
relative L2 2e-2 (bf16 outputs and a bf16 copy of the state gradients; the fp32 path's error is
printed beside it), with and without ``cu_seqlens``; tiny_mamba's loss with it within 2e-3 of the fp32
path's. Seeds are printed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.model import ops  # noqa: E402
from zebractl.model.mixers import mamba2  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.ops import torch_ops as T  # noqa: E402
from zebractl.schemas.recipe import KernelsConfig  # noqa: E402


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _loss_and_grads(kernels: KernelsConfig, seed: int, device: str = "cpu"):
    m = resolve_preset("tiny_mamba").config
    model = build_model(m, kernels=kernels, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (2, 96), generator=gen).to(device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss_sum, tokens = model(ids, labels=ids.roll(-1, 1))
    loss = loss_sum / tokens
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_glue_matches_eager_on_cpu():
    seed = int(torch.randint(0, 10_000, ()))
    print("seed", seed)
    eager_loss, eager = _loss_and_grads(KernelsConfig(backend="torch"), seed)
    glue_loss, glue = _loss_and_grads(KernelsConfig(backend="torch", compile="glue"), seed)
    assert abs(glue_loss - eager_loss) <= 1e-6 * abs(eager_loss), (seed, glue_loss, eager_loss)
    assert eager.keys() == glue.keys()
    for name, g in eager.items():
        assert _rel(glue[name], g) <= 1e-5, (seed, name, _rel(glue[name], g))


def test_compiled_glue_is_the_eager_arithmetic_per_region():
    """Each compiled region against its eager function on the same inputs (fp32 and bf16)."""
    seed = int(torch.randint(0, 10_000, ()))
    print("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    b, t, nh, groups, n, p = 2, 40, 4, 2, 8, 6
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 8e-3)):
        dt = torch.randn(b, t, nh, generator=gen).to(dtype)
        bb, cc = (torch.randn(b, t, groups * n, generator=gen).to(dtype) for _ in range(2))
        dt_bias, a_log = torch.randn(nh, generator=gen), torch.rand(nh, generator=gen)
        args = (dt, dt_bias, a_log, bb, cc, groups, n, dtype)
        for got, want in zip(
            mamba2._compiled(mamba2.ssd_inputs)(*args), mamba2.ssd_inputs(*args), strict=True
        ):
            assert got.dtype == want.dtype and _rel(got, want) <= tol, (seed, dtype)
        o, xh = (torch.randn(b, t, nh, p, generator=gen).to(dtype) for _ in range(2))
        z = torch.randn(b, t, nh * p, generator=gen).to(dtype)
        d, w = torch.randn(nh, generator=gen), torch.randn(nh * p, generator=gen)
        out_args = (o, xh, d, z, w, 1e-6, groups)
        got = mamba2._compiled(mamba2.ssd_output)(*out_args)
        want = mamba2.ssd_output(*out_args)
        assert got.dtype == want.dtype and _rel(got, want) <= tol, (seed, dtype)


def test_generation_with_a_cache_runs_eagerly():
    """A cache changes the shapes every call: the compiled regions are for training only."""
    m = resolve_preset("tiny_mamba").config
    model = build_model(m, kernels=KernelsConfig(backend="torch", compile="glue"))
    mixer = next(x for x in model.modules() if isinstance(x, mamba2.Mamba2Mixer))
    before = mamba2._compiled.cache_info().currsize
    x = torch.randn(1, 3, m.hidden_size)
    from zebractl.model.mixers.common import Cache

    mixer(x, cache=Cache())
    assert mamba2._compiled.cache_info().currsize == before


def test_compile_auto_is_glue_on_fla_kernels_only_and_eval_runs_eagerly():
    """``kernels.compile: auto`` (the default) compiles the glue where FLA's kernels run (CUDA),
    not on the CPU's pure-PyTorch path; evaluation (``model.eval()``) runs eagerly in every mode."""
    assert KernelsConfig().compile == "auto" and KernelsConfig().ssd_precision == "mixed"
    assert mamba2._glue(ops.KernelOptions("fla", KernelsConfig()))
    assert not mamba2._glue(ops.KernelOptions("torch", KernelsConfig()))
    assert not mamba2._glue(ops.KernelOptions("fla", KernelsConfig(compile="none")))
    assert mamba2._glue(ops.KernelOptions("torch", KernelsConfig(compile="glue")))
    m = resolve_preset("tiny_mamba").config
    model = build_model(m, kernels=KernelsConfig(backend="torch", compile="glue")).eval()
    mixer = next(x for x in model.modules() if isinstance(x, mamba2.Mamba2Mixer))
    before = mamba2._compiled.cache_info().currsize
    with torch.no_grad():
        mixer(torch.randn(1, 5, m.hidden_size))
    assert mamba2._compiled.cache_info().currsize == before


def test_mixed_ssd_refuses_fp32_operands():
    from zebractl.model.ops.mixed_ssd import ssd_mixed

    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(ValueError, match="16-bit"):
        ssd_mixed(q, q, q, torch.zeros(1, 4, 1))


def _ssd_case(seed: int, cu: list[int] | None):
    gen = torch.Generator().manual_seed(seed)
    b, t, h, k, v = (1, cu[-1], 4, 64, 64) if cu else (2, 300, 4, 64, 64)
    q = torch.randn(b, t, h, k, generator=gen).bfloat16()
    kk = (torch.randn(b, t, h, k, generator=gen) * 0.05).bfloat16()
    x = torch.randn(b, t, h, v, generator=gen).bfloat16()
    g = -torch.rand(b, t, h, generator=gen) * 0.3
    do = torch.randn(b, t, h, v, generator=gen).bfloat16()
    return q, kk, x, g, do


def _reference(q, k, x, g, do, cu):
    """fp64 SSD (the chunked torch code), per document where ``cu`` splits the sequence."""
    leaves = [t.double().requires_grad_() for t in (q, k, x, g)]
    if cu:
        outs = [
            T.chunk_scalar_gla(*(t[:, s:e] for t in leaves), scale=1.0)[0]
            for s, e in zip(cu[:-1], cu[1:], strict=True)
        ]
        o = torch.cat(outs, dim=1)
    else:
        o = T.chunk_scalar_gla(*leaves, scale=1.0)[0]
    (o * do.double()).sum().backward()
    return [o.detach()] + [t.grad for t in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize("cu", [None, [0, 70, 200, 448]])
def test_mixed_ssd_against_fp64_on_the_gpu(cu):
    from fla.ops.simple_gla import chunk_simple_gla

    from zebractl.model.ops.mixed_ssd import ssd_mixed

    seed = int(torch.randint(0, 10_000, ()))
    print("seed", seed)
    q, k, x, g, do = _ssd_case(seed, cu)
    ref = _reference(q, k, x, g, do, cu)
    cuda = [t.cuda() for t in (q, k, x, g, do)]
    cu_t = torch.tensor(cu, device="cuda", dtype=torch.long) if cu else None
    for name, fn, cast in (
        ("mixed", lambda *a: ssd_mixed(*a, cu_seqlens=cu_t)[0], lambda t: t),
        (
            "fp32",
            lambda *a: chunk_simple_gla(*a[:3], g=a[3], scale=1.0, cu_seqlens=cu_t)[0],
            lambda t: t.float(),
        ),
    ):
        leaves = [t.clone().requires_grad_() for t in cuda[:4]]
        o = fn(*(cast(t) if i < 3 else t for i, t in enumerate(leaves)))
        (o.float() * cuda[4].float()).sum().backward()
        got = [o.detach()] + [t.grad for t in leaves]
        errs = {
            n: _rel(a.cpu(), b)
            for n, a, b in zip(("o", "dq", "dk", "dv", "dg"), got, ref, strict=True)
        }
        print(name, errs)
        if name == "mixed":
            assert o.dtype == torch.bfloat16
            assert all(e <= 2e-2 for e in errs.values()), (seed, errs)


@pytest.mark.gpu
def test_mixed_ssd_trains_tiny_mamba_like_the_fp32_path():
    seed = int(torch.randint(0, 10_000, ()))
    print("seed", seed)
    loss32, g32 = _loss_and_grads(KernelsConfig(), seed, "cuda")
    loss16, g16 = _loss_and_grads(KernelsConfig(ssd_precision="mixed"), seed, "cuda")
    assert abs(loss16 - loss32) <= 2e-3 * abs(loss32), (seed, loss16, loss32)
    worst = max(_rel(g16[n], g) for n, g in g32.items())
    print("worst gradient relative L2", worst)
    assert worst <= 5e-2, (seed, worst)
