"""``kernels.qkv_conv``: KDA's and GDN's short convolution over q | k | v as one kernel (fused) or
one per tensor (per_tensor) computes the same model: each channel's convolution is the same, only
the layout of its output differs (``zebractl.model.mixers.common.fused_qkv``).

On the CPU (torch backend) the two are compared on the tiny presets, with and without documents
kept apart; tolerance: the loss and every gradient equal to 1e-6 relative (the depthwise
convolution of a channel sums the same products either way; the tolerance leaves room for a
vectorised CPU convolution grouping channels differently)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.model.mixers.common import fused_qkv, split_in_proj  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.segments import Segments  # noqa: E402
from zebractl.schemas.recipe import KernelsConfig  # noqa: E402

SEED = 1234
EOD = 0


def _loss_and_grads(name: str, layout: str, ids, segments):
    m = resolve_preset(name).config
    model = build_model(m, kernels=KernelsConfig(qkv_conv=layout), seed=SEED)
    loss_sum, tokens = model(ids, labels=ids.roll(-1, 1), segments=segments)
    (loss_sum / tokens).backward()
    return loss_sum.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "documents"])
@pytest.mark.parametrize("name", ["tiny_kda", "tiny_gdn", "tiny_hybrid"])
def test_per_tensor_conv_trains_the_same_model(name, packed):
    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    m = resolve_preset(name).config
    ids = torch.randint(1, m.vocab_size, (2, 48), generator=gen)
    ids[0, 17] = ids[1, 30] = EOD
    segments = Segments.from_tokens(ids, EOD) if packed else None
    fused_loss, fused = _loss_and_grads(name, "fused", ids, segments)
    split_loss, split = _loss_and_grads(name, "per_tensor", ids, segments)
    torch.testing.assert_close(split_loss, fused_loss, rtol=1e-6, atol=0)
    assert fused.keys() == split.keys()
    for n, g in fused.items():
        torch.testing.assert_close(split[n], g, rtol=1e-6, atol=1e-9, msg=n)


def _splits(t) -> int:
    """Split nodes on the way from ``t`` back to the leaves (each one concatenates gradients)."""
    seen, stack, n = set(), [t.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        n += "Split" in type(node).__name__
        stack.extend(f for f, _ in node.next_functions)
    return n


def test_per_tensor_outputs_are_contiguous_and_equal_to_the_fused_split(monkeypatch):
    """What the recurrent kernel receives: per_tensor hands it contiguous q, k, v (nothing for its
    input guard to copy) split from in_proj's output in one split; fused hands it views of one
    wider output, split twice. The convolution is the torch one with FLA's contract (a
    contiguous output)."""
    from zebractl.model import ops

    torch_conv = ops.short_conv
    monkeypatch.setattr(ops, "short_conv", lambda *a, **k: torch_conv(*a, **k).contiguous())
    print(f"seed {SEED}")
    torch.manual_seed(SEED)
    m = resolve_preset("tiny_kda").config
    outs, splits = {}, {}
    for layout in ("fused", "per_tensor"):
        model = build_model(m, kernels=KernelsConfig(qkv_conv=layout), seed=SEED)
        mixer = next(mod for mod in model.modules() if type(mod).__name__ == "KDAMixer")
        torch.manual_seed(SEED)
        y = torch.randn(2, 24, sum(mixer.split), requires_grad=True)  # in_proj's output
        qkv, rest = split_in_proj(mixer, y)
        assert [t.shape[-1] for t in rest] == mixer.split[3:]
        outs[layout] = fused_qkv(mixer, qkv, None)
        splits[layout] = _splits(outs[layout][0])
    assert splits == {"fused": 2, "per_tensor": 1}
    for a, b in zip(outs["fused"], outs["per_tensor"], strict=True):
        assert b.is_contiguous() and not a.is_contiguous()
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


GPU_HEADS = {
    "tiny_kda": ["model.kda.head_k_dim=32", "model.kda.head_v_dim=64"],
    "tiny_gdn": [],
}
"""Head sizes FLA's kernels take: at tiny_kda's CPU head size of 16, FLA 0.6.0's TileLang backward
for KDA does not compile ("Get different layout for s_dw", fla/ops/kda/backends/tilelang/
chunk_bwd_dqkg.py; H100, 2026-12-07, e3be359), so KDA runs at the head sizes
tests/convert/test_convert.py's GPU test uses; tiny_gdn as it is (its case passed there)."""


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "documents"])
@pytest.mark.parametrize("name", ["tiny_kda", "tiny_gdn"])
def test_per_tensor_conv_on_flas_kernels(name, packed):
    """On the GPU with FLA's kernels, bf16 autocast as training runs: the loss equal to 1e-6
    relative and each gradient within 1e-3 relative L2 of the fused layout's (FLA's convolution
    sums its weight gradient over blocks of channels whose width it autotunes per width; the
    recurrent kernels see the same numbers in another memory layout)."""
    from zebractl.config.resolve import resolve_recipe

    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    m = resolve_recipe(name, GPU_HEADS[name]).run.model
    ids = torch.randint(1, m.vocab_size, (2, 256), generator=gen).cuda()
    ids[0, 100] = ids[1, 31] = EOD
    segments = Segments.from_tokens(ids, EOD) if packed else None
    out = {}
    for layout in ("fused", "per_tensor"):
        model = build_model(
            m, kernels=KernelsConfig(backend="fla", qkv_conv=layout), device="cuda", seed=SEED
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum, tokens = model(ids, labels=ids.roll(-1, 1), segments=segments)
        (loss_sum / tokens).backward()
        out[layout] = loss_sum.detach(), {n: p.grad for n, p in model.named_parameters()}
    (fl, fg), (sl, sg) = out["fused"], out["per_tensor"]
    torch.testing.assert_close(sl, fl, rtol=1e-6, atol=0)
    for n, g in fg.items():
        err = ((sg[n].double() - g.double()).norm() / g.double().norm().clamp_min(1e-30)).item()
        assert err <= 1e-3, (n, err)
