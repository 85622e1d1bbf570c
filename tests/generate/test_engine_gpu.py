"""`zebractl.generate.engine` on a CUDA GPU: cached generation, whose recurrent blocks step their
states with FLA's fused recurrent kernels, equals recomputing the whole sequence with FLA's chunk
kernels (the CPU test's claim, tests/generate/test_engine.py, on the GPU's kernels).

Random weights (a printed seed), fp32 on the GPU: greedy decoding through the cache must choose, at
every one of 32 steps, the argmax of a full no-cache forward over everything so far, or a token
whose logit there is within TIE of that maximum (a near-tie: FLA's chunk kernels multiply in tf32,
about 1e-3 relative, so they may break a tie the other way; the logits' spread is about 0.2 at
this init); each step of each recurrent block must have gone through a fused recurrent kernel
(counted), and the no-cache forwards through none.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytest.importorskip("fla.ops.kda")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.convert.hf import mla_rope, model_state  # noqa: E402
from zebractl.generate.engine import Decoder, generate  # noqa: E402
from zebractl.generate.options import Sampling  # noqa: E402
from zebractl.hf import mapping  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402

TIE = 2e-3
"""The largest logit gap (fp32, absolute) under which the other token of a near-tie may be chosen."""
FUSED = {
    "kda": ("fla.ops.kda", "fused_recurrent_kda"),
    "gdn": ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "mamba2": ("fla.ops.simple_gla", "fused_recurrent_simple_gla"),
}


class _Tok:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"[{i}]" for i in ids)


def _hf_on_gpu(recipe: str, seed: int):
    import zebractl.hf as zh

    m = resolve_recipe(recipe, []).run.model
    ours = build_model(m, seed=seed).eval()
    config = zh.ZebraConfig(zebractl_model=m.model_dump(mode="json"), mla_rope=mla_rope(ours))
    hf = zh.ZebraForCausalLM(config).eval()
    hf.load_state_dict(
        mapping.to_hf(model_state(ours), m, "zebra", keep_padding=True), strict=False
    )
    return m, hf.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_greedy_generation_on_the_gpu_is_the_argmax_of_the_full_forward(recipe, monkeypatch):
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    m, hf = _hf_on_gpu(recipe, seed)
    steps: dict[str, int] = {}
    for kind, (module, name) in FUSED.items():
        mod = importlib.import_module(module)
        real = getattr(mod, name)

        def counted(*a, _real=real, _kind=kind, **k):
            steps[_kind] = steps.get(_kind, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(mod, name, counted)
    prompt = torch.randint(0, m.vocab_size, (11,)).tolist()
    dec = Decoder(hf, m.max_position_embeddings)
    out = generate(dec, _Tok(), prompt, max_new_tokens=32, sampling=Sampling(), stop_ids=set())
    assert len(out.ids) == 32 and out.stop_reason == "length"
    blocks = [b.kind for b in hf.model.layers]
    expected = {k: 32 * blocks.count(k) for k in FUSED if k in blocks}  # the prompt, 31 tokens
    assert steps == expected, (recipe, steps, expected)
    seq = list(prompt)
    with torch.no_grad():
        for step, token in enumerate(out.ids):
            logits = hf(input_ids=torch.tensor([seq], device="cuda")).logits[0, -1]
            gap = float(logits.max() - logits[token])
            assert token == int(logits.argmax()) or gap <= TIE, (recipe, seed, step, gap)
            seq.append(token)
    assert steps == expected  # the no-cache forwards took the chunk kernels
