"""`zebractl.hf`: ZebraForCausalLM computes what the training model computes, for every layout.

Fresh random weights per run (seeded by conftest's printed seed); fp32 on CPU (the torch references
on both sides), tolerance 1e-5 relative on the logits as `zebractl verify`'s CPU tier.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.convert.hf import mla_rope, model_state  # noqa: E402
from zebractl.hf import mapping  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402

RTOL = 1e-5


def _pair(recipe: str, seed: int):
    import zebractl.hf as zh

    m = resolve_recipe(recipe, []).run.model
    ours = build_model(m, seed=seed).eval()
    config = zh.ZebraConfig(zebractl_model=m.model_dump(mode="json"), mla_rope=mla_rope(ours))
    hf = zh.ZebraForCausalLM(config).eval()
    theirs = mapping.to_hf(model_state(ours), m, "zebra", keep_padding=True)
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # the LM head is tied
    return m, ours, hf


@pytest.mark.parametrize("recipe", ["tiny_hybrid", "tiny_mamba", "tiny_kda", "tiny_gdn"])
def test_logits_equal_the_training_model(recipe):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    m, ours, hf = _pair(recipe, seed)
    ids = torch.randint(0, m.vocab_size, (2, 48))
    with torch.no_grad():
        a, b = ours(ids), hf(input_ids=ids).logits
    rel = ((a - b).abs().max() / a.abs().max()).item()
    assert rel <= RTOL, (recipe, seed, rel)
    # and a loss from labels, shifted as transformers does
    loss = hf(input_ids=ids, labels=ids).loss
    ref = torch.nn.functional.cross_entropy(
        a[:, :-1].reshape(-1, a.shape[-1]), ids[:, 1:].reshape(-1)
    )
    assert torch.allclose(loss, ref, rtol=1e-5), (loss, ref)


def test_save_and_load_round_trip_through_the_auto_classes(tmp_path):
    """After `import zebractl.hf`, AutoModelForCausalLM loads a saved ZebraForCausalLM (MLA's rope
    table included: it is config, not a buffer) and computes the same logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    m, _, hf = _pair("tiny_hybrid", 7)
    hf.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "zebra"
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == "ZebraForCausalLM"
    ids = torch.randint(0, m.vocab_size, (1, 20))
    with torch.no_grad():
        assert torch.equal(hf(input_ids=ids).logits, again(input_ids=ids).logits)
    out = again.generate(ids, max_new_tokens=3, do_sample=False, use_cache=False, pad_token_id=0)
    assert out.shape == (1, 23)


def test_padding_and_a_wrong_rope_table_are_refused():
    import zebractl.hf as zh

    m, _, hf = _pair("tiny_hybrid", 3)
    ids = torch.randint(0, m.vocab_size, (2, 8))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with pytest.raises(ValueError, match="does not support padding"):
        hf(input_ids=ids, attention_mask=mask)
    bad = zh.ZebraConfig(
        zebractl_model=m.model_dump(mode="json"), mla_rope={"inv_freq": [1.0], "mscale": 1.0}
    )
    with pytest.raises(ValueError, match="frequencies"):
        zh.ZebraForCausalLM(bad)


@pytest.mark.parametrize("recipe", ["tiny_hybrid", "tiny_mamba", "tiny_kda", "tiny_gdn"])
def test_the_cache_continues_exactly(recipe):
    """A prompt then one token at a time through the cache (conv tails, recurrent states, MLA keys)
    gives the logits of the whole sequence at once; greedy generation with the cache equals greedy
    generation recomputed without it, and the cached run feeds one token per step."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    m, _, hf = _pair(recipe, seed)
    ids = torch.randint(0, m.vocab_size, (2, 30))
    with torch.no_grad():
        full = hf(input_ids=ids).logits
        first = hf(input_ids=ids[:, :17], use_cache=True)
        cache = first.get("cache", first.get("past_key_values"))
        parts = [first.logits]
        for i in range(17, 30):
            step = hf(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True)
            parts.append(step.logits)
    assert cache.seen == 30
    rel = ((torch.cat(parts, 1) - full).abs().max() / full.abs().max()).item()
    assert rel <= RTOL, (recipe, seed, rel)

    lengths = []
    forward = hf.model.forward

    def counted(*a, **k):
        lengths.append(k["input_ids"].shape[1])
        return forward(*a, **k)

    hf.model.forward = counted
    prompt = ids[:1, :9]
    cached = hf.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
    assert lengths == [9] + [1] * 11, lengths
    again = hf.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, again)


def test_the_hf_model_needs_no_megatron():
    """ZebraForCausalLM builds on the training model's mixers and norms, which are plain PyTorch:
    building and running one with each recurrent mixer imports no megatron-core."""
    code = (
        "import sys, torch, zebractl.hf as zh\n"
        "from zebractl.config.resolve import resolve_recipe\n"
        "for r in ('tiny_kda', 'tiny_gdn', 'tiny_mamba'):\n"
        "    m = resolve_recipe(r, []).run.model\n"
        "    hf = zh.ZebraForCausalLM(zh.ZebraConfig(zebractl_model=m.model_dump(mode='json')))\n"
        "    hf(input_ids=torch.zeros(1, 4, dtype=torch.long))\n"
        "assert not [n for n in sys.modules if n.startswith('megatron')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
