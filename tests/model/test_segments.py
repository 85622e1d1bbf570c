"""Documents packed into a row and kept apart (``data.packing: isolated``, zebractl.model.segments).

A document packed among others must be computed exactly as if it were alone in its row: the same
hidden states, the same loss, the same gradients. Without isolation the same rows differ (the
check can fail). CPU: fp32, the torch kernels, tolerance 1e-5. GPU: FLA's variable-length kernels
against the same documents alone, bf16, tolerance stated in the test.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.segments import Segments  # noqa: E402
from zebractl.schemas.recipe import RecomputeConfig  # noqa: E402

EOD = 0
SEED = 11
LENGTHS = [[13, 40, 11], [64], [1, 30, 33]]  # three rows of 64 tokens; a one-token document too


def _rows(vocab: int, lengths=LENGTHS, seed: int = SEED, device: str = "cpu"):
    """(ids [B, T], the documents) with each document closed by EOD (seed printed on failure)."""
    g = torch.Generator().manual_seed(seed)
    docs, rows = [], []
    for row in lengths:
        parts = []
        for n in row:
            d = torch.randint(1, vocab, (n,), generator=g)
            d[-1] = EOD
            parts.append(d)
        docs += parts
        rows.append(torch.cat(parts))
    return torch.stack(rows).to(device), [d.to(device) for d in docs]


def test_segments_from_tokens():
    ids = torch.tensor([[5, 0, 7, 8, 0, 0], [0, 3, 4, 5, 6, 0]])
    s = Segments.from_tokens(ids, 0)
    assert s.cu_seqlens.tolist() == [0, 2, 5, 6, 7, 12]  # row ends are boundaries; 0 0 -> [0]
    assert s.doc.tolist() == [[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]]
    bias = s.attention_bias(torch.float32)
    assert bias.shape == (2, 1, 6, 6) and s.attention_bias(torch.float32) is bias
    allowed = (bias[0, 0] == 0).int().tolist()
    assert allowed[3] == [0, 0, 1, 1, 0, 0]  # its own document, causally
    assert allowed[5] == [0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("name", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_a_packed_document_is_computed_as_if_alone(name):
    m = resolve_preset(name).config
    model = build_model(m, seed=SEED)
    ids, docs = _rows(m.vocab_size)
    print(f"seed {SEED}")
    with torch.no_grad():
        packed = model.hidden_states(ids, Segments.from_tokens(ids, EOD)).reshape(-1, m.hidden_size)
        crossed = model.hidden_states(ids).reshape(-1, m.hidden_size)
        alone = torch.cat([model.hidden_states(d[None])[0] for d in docs])
    assert (packed - alone).abs().max() < 1e-5
    assert (crossed - alone).abs().max() > 1e-2  # without isolation the rows do differ


@pytest.mark.parametrize("name", ["tiny_mamba", "tiny_hybrid"])
def test_loss_and_gradients_are_those_of_the_documents_alone(name):
    m = resolve_preset(name).config
    ids, docs = _rows(m.vocab_size)
    labels = torch.roll(ids, -1, 1)

    def grads(model):
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    model = build_model(m, seed=SEED)
    seg = Segments.from_tokens(ids, EOD)
    mask = (ids != EOD).float()  # no label across a boundary (the trainer's rule)
    loss, n = model(ids, labels=labels, loss_mask=mask, segments=seg)
    loss.backward()
    packed = grads(model)

    ref = build_model(m, seed=SEED)
    total, count = 0.0, 0
    for d in docs:  # each alone: its labels within itself, the last (EOD) one not trained on
        if d.numel() < 2:
            continue
        s, k = ref(d[None, :-1], labels=d[None, 1:])
        s.backward()
        total, count = total + s.detach(), count + int(k)
    alone = grads(ref)
    assert int(n) == count
    assert torch.allclose(loss.detach(), torch.as_tensor(total), rtol=1e-6)
    for k, g in packed.items():  # relative to the gradient's norm: fp32 sums in another order
        assert (g - alone[k]).norm() <= 1e-5 * alone[k].norm() + 1e-7, k


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_with_segments_changes_nothing(mode):
    m = resolve_preset("tiny_hybrid").config
    ids, _ = _rows(m.vocab_size)

    def step(rc):
        model = build_model(m, seed=SEED, recompute=RecomputeConfig(mode=rc))
        loss, n = model(ids, labels=torch.roll(ids, -1, 1), segments=Segments.from_tokens(ids, EOD))
        (loss / n).backward()
        return loss.detach(), {k: p.grad for k, p in model.named_parameters()}

    loss, g = step("none")
    loss2, g2 = step(mode)
    assert torch.equal(loss, loss2)
    assert all(torch.equal(g[k], g2[k]) for k in g)


def _per_document_kernel(takes_scale: bool):
    """A CPU stand-in for flash's variable-length kernel: SDPA over each document, causal."""

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, **causal):
        assert causal in ({"is_causal": True}, {"window_size": (-1, 0)})
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
        lengths = (cu_q[1:] - cu_q[:-1]).tolist()
        assert max_q == max_k == max(lengths) and q.shape[-1] % 8 == 0
        outs = []
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            d = [t[a:b].transpose(0, 1) for t in (q, k, v)]  # [H, n, D]
            o = torch.nn.functional.scaled_dot_product_attention(*d, is_causal=True, scale=scale)
            outs.append(o.transpose(0, 1))
        return torch.cat(outs)

    if takes_scale:
        return kernel, {"window_size": (-1, 0)}, True
    return (lambda *a, **kw: kernel(*a, **kw)), {"is_causal": True}, False


@pytest.mark.parametrize("takes_scale", [True, False], ids=["scale", "no_scale"])
def test_variable_length_attention_equals_the_bias(monkeypatch, takes_scale):
    """MLA's variable-length path (the batch flattened, values padded to the query size, the
    scale passed or folded into q) gives the bias path's hidden states and gradients: fp32 on the
    CPU with a per-document SDPA standing in for flash's kernel, tolerance 1e-5 relative."""
    from zebractl.model import attention
    from zebractl.model import model as model_mod

    m = resolve_preset("tiny_hybrid").config
    ids, _ = _rows(m.vocab_size)
    print(f"seed {SEED}")

    def run():
        model = build_model(m, seed=SEED)
        loss, n = model(ids, labels=torch.roll(ids, -1, 1), segments=Segments.from_tokens(ids, EOD))
        (loss / n).backward()
        return loss.detach(), {k: p.grad for k, p in model.named_parameters()}

    loss, grads = run()
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: _per_document_kernel(takes_scale))
    calls = []

    def usable(device, dtype, dropout_p):
        calls.append(dtype)
        return True

    monkeypatch.setattr(attention, "varlen_usable", usable)
    monkeypatch.setattr(model_mod, "varlen_usable", usable)
    loss2, grads2 = run()
    assert calls  # the variable-length path ran
    assert torch.allclose(loss, loss2, rtol=1e-5)
    for k, g in grads.items():
        assert (g - grads2[k]).norm() <= 1e-5 * g.norm() + 1e-7, k


def test_variable_length_attention_is_for_cuda_half_precision_without_dropout():
    from zebractl.model.attention import varlen_usable

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not varlen_usable(cpu, torch.bfloat16, 0.0)
    assert not varlen_usable(cuda, torch.float32, 0.0)
    assert not varlen_usable(cuda, torch.bfloat16, 0.1)


@pytest.mark.gpu
def test_flash_variable_length_attention_on_the_gpu():
    """On the GPU, documents kept apart run flash's variable-length kernel (this torch has one). At
    MLA's shapes (q/k 192, v 128) in bf16, its output and its q/k/v gradients are as close to an
    fp32 block-diagonal reference as SDPA with the bf16 bias is (within 2x its error + 1e-3 of the
    reference's largest magnitude)."""
    import torch.nn.functional as F

    from zebractl.model import attention

    assert attention.varlen_usable(torch.device("cuda"), torch.bfloat16, 0.0)
    ids, _ = _rows(1000, [[100, 300, 112], [512], [64, 64, 384]], device="cuda")
    seg = Segments.from_tokens(ids, EOD)
    s, b, n, scale = ids.shape[1], ids.shape[0], 8, 0.1
    g = torch.Generator(device="cuda").manual_seed(SEED)
    print(f"seed {SEED}")
    leaves = [torch.randn(s, b, n, d, generator=g, device="cuda") for d in (192, 192, 128)]
    grad_out = torch.randn(s, b, n * 128, generator=g, device="cuda")

    def biased(q, k, v, dtype):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=seg.attention_bias(dtype), scale=scale
        )
        return o.permute(2, 0, 1, 3).reshape(s, b, -1)

    def run(fn, dtype):
        xs = [t.detach().clone().to(dtype).requires_grad_() for t in leaves]
        out = fn(*xs)
        out.backward(grad_out.to(dtype))
        return [out.float()] + [x.grad.float() for x in xs]

    ref = run(lambda q, k, v: biased(q, k, v, torch.float32), torch.float32)
    flash = run(lambda q, k, v: attention.varlen_attention(q, k, v, seg, scale), torch.bfloat16)
    bias = run(lambda q, k, v: biased(q, k, v, torch.bfloat16), torch.bfloat16)
    for name, r, f, m in zip(("out", "dq", "dk", "dv"), ref, flash, bias, strict=True):
        err_f, err_m = (f - r).abs().max().item(), (m - r).abs().max().item()
        print(f"{name}: |flash - fp32| {err_f:.3g}, |bias bf16 - fp32| {err_m:.3g}")
        assert err_f <= 2 * err_m + 1e-3 * r.abs().max().item(), (name, err_f, err_m)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_fla_variable_length_kernels_keep_documents_apart(name):
    """FLA's kernels with cu_seqlens (bf16 autocast on the GPU) against each document alone:
    hidden states within 5% of their largest magnitude (bf16 rounding; MLA's masked attention runs
    another SDPA kernel than the causal one), and at least 5 times further apart without
    isolation."""
    m = resolve_preset(name).config
    model = build_model(m, seed=SEED, device="cuda")
    assert model.opts.backend == "fla"
    lengths = [[100, 300, 112], [512], [64, 64, 384]]
    ids, docs = _rows(m.vocab_size, lengths, device="cuda")
    print(f"seed {SEED}")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        packed = model.hidden_states(ids, Segments.from_tokens(ids, EOD))
        crossed = model.hidden_states(ids)
        alone = torch.cat([model.hidden_states(d[None])[0] for d in docs])
    packed, crossed = packed.float().reshape(alone.shape), crossed.float().reshape(alone.shape)
    scale = alone.abs().max().item()
    err, crossed_err = ((x - alone).abs().max().item() for x in (packed, crossed))
    print(
        f"max |packed - alone| {err:.3g}, |crossed - alone| {crossed_err:.3g}, max |h| {scale:.3g}"
    )
    assert err <= 5e-2 * scale, (err, scale)
    assert crossed_err > 5 * err, (crossed_err, err)
