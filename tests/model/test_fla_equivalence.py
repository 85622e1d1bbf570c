"""Logit equivalence with FLA's own HF model classes, on CPU, through FLA's pure-torch references.

FLA's Triton kernels cannot run on CPU, so the FLA model is run with its kernels swapped for FLA's own
naive references (naive_recurrent_kda / naive_recurrent_gated_delta_rule, naive gates, F.conv1d for
ShortConvolution, fp32 gated RMSNorm, torch SwiGLU). Ours runs its own chunked implementation. Same
weights (through the declarative mapping), fresh random weights and tokens each run; fp32; tolerance
1e-4 absolute on logits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
fla_models = pytest.importorskip("fla.models")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.hf import mapping  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402

ATOL = 1e-4


@pytest.fixture
def fla_on_cpu():
    """Route FLA's layers through FLA's pure-torch reference implementations."""
    from zebractl.runtime.fla_cpu import on_cpu

    with on_cpu():
        yield


def _fla_model(m):
    cfg = mapping.fla_config(m)
    if mapping.family(m) == "kda":
        return fla_models.KDAForCausalLM(fla_models.KDAConfig(**cfg))
    return fla_models.GatedDeltaNetForCausalLM(fla_models.GatedDeltaNetConfig(**cfg))


@pytest.mark.parametrize("preset", ["tiny_kda", "tiny_gdn"])
@pytest.mark.parametrize("direction", ["fla_to_ours", "ours_to_fla"])
def test_logits_match_fla(fla_on_cpu, preset, direction):
    m = resolve_preset(preset).config
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    ours = build_model(m, seed=seed)
    theirs = _fla_model(m).float()
    if direction == "fla_to_ours":
        ours.load_state_dict(mapping.from_fla(theirs.state_dict(), m), strict=False)
    else:
        missing, unexpected = theirs.load_state_dict(
            mapping.to_fla(ours.state_dict(), m), strict=False
        )
        assert not unexpected and set(missing) <= {"lm_head.weight"}
    ours.eval()
    theirs.eval()
    ids = torch.randint(0, m.vocab_size, (2, 96))  # T > 64: FLA's chunk mode, not fused_recurrent
    with torch.no_grad():
        a = ours(ids)[..., : m.vocab_size]
        b = theirs(input_ids=ids).logits.float()
    err = (a - b).abs().max().item()
    print(f"{preset} {direction}: max abs logit diff {err:.3e}")
    assert err <= ATOL, f"max abs logit diff {err:.3e} > {ATOL:.0e} (seed {seed})"
    assert a.abs().max() > 0.1  # not a trivially-zero comparison


@pytest.mark.parametrize("preset", ["tiny_kda", "tiny_gdn"])
def test_mapping_round_trip_is_exact(preset):
    m = resolve_preset(preset).config
    sd = {k: v for k, v in build_model(m).state_dict().items() if not k.endswith("_extra_state")}
    back = mapping.from_fla(mapping.to_fla(sd, m), m)
    vocab_rows = {"embedding.word_embeddings.weight"}
    for k, v in sd.items():
        w = back[k]
        if k in vocab_rows:  # padding rows are not FLA's: dropped on export, zero on import
            assert torch.equal(w[: m.vocab_size], v[: m.vocab_size])
            assert not w[m.vocab_size :].any()
        else:
            assert torch.equal(w, v), k
    assert set(back) == set(sd)


def test_mapping_is_strict():
    m = resolve_preset("tiny_kda").config
    sd = {k: v for k, v in build_model(m).state_dict().items() if not k.endswith("_extra_state")}
    fla_sd = mapping.to_fla(sd, m)
    with pytest.raises(mapping.MappingError, match="missing tensor"):
        mapping.from_fla({k: v for k, v in fla_sd.items() if "q_proj" not in k}, m)
    with pytest.raises(mapping.MappingError, match="not covered by the mapping"):
        mapping.from_fla({**fla_sd, "model.layers.0.attn.extra": torch.zeros(1)}, m)
    hybrid = resolve_preset("tiny_hybrid").config
    with pytest.raises(mapping.MappingError, match="pure KDA and pure GDN"):
        mapping.fla_config(hybrid)


def test_fla_parameter_counts_equal_ours():
    for name in ("tiny_kda", "tiny_gdn"):
        m = resolve_preset(name).config
        theirs = _fla_model(m)
        ours_n = sum(p.numel() for p in build_model(m, device="meta").parameters())
        pad = (m.padded_vocab_size - m.vocab_size) * m.hidden_size
        assert sum(p.numel() for p in theirs.parameters()) + pad == ours_n
