"""`zebractl.generate.engine`: cached generation equals recomputing the whole sequence, MLA keeps
only its compressed latent, and the sampler does what its settings say. The fixed-shape decode
step (`ZebraForCausalLM.decode_step`) computes what a one-token forward with the cache computes and
updates every buffer in place (fp32, relative and absolute 1e-5: MLA attends over its whole buffer
with the rows past the position masked, a sum in another order); on the GPU its CUDA graph
(`zebractl.generate.graph`) gives the eager steps' logits, one capture per set of buffers.

Random weights (the conftest seed, printed); fp32 on CPU. Greedy decoding through the cache must
choose, at every one of 32 steps, the argmax of a full no-cache forward over everything so far.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.convert.hf import mla_rope, model_state  # noqa: E402
from zebractl.generate import graph  # noqa: E402
from zebractl.generate.engine import Decoder, generate, pick  # noqa: E402
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
    """A stand-in tokenizer: a token's text is its id in brackets."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"[{i}]" for i in ids)


def _hf(recipe: str, seed: int):
    import zebractl.hf as zh

    m = resolve_recipe(recipe, []).run.model
    ours = build_model(m, seed=seed).eval()
    config = zh.ZebraConfig(zebractl_model=m.model_dump(mode="json"), mla_rope=mla_rope(ours))
    hf = zh.ZebraForCausalLM(config).eval()
    hf.load_state_dict(
        mapping.to_hf(model_state(ours), m, "zebra", keep_padding=True), strict=False
    )
    return m, hf


@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_greedy_generation_is_the_argmax_of_the_full_forward(recipe):
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    m, hf = _hf(recipe, seed)
    prompt = torch.randint(0, m.vocab_size, (11,)).tolist()
    dec = Decoder(hf, m.max_position_embeddings)
    out = generate(dec, _Tok(), prompt, max_new_tokens=32, sampling=Sampling(), stop_ids=set())
    assert len(out.ids) == 32 and out.stop_reason == "length"
    seq = list(prompt)
    with torch.no_grad():
        for step, token in enumerate(out.ids):
            logits = hf(input_ids=torch.tensor([seq])).logits[0, -1]
            assert token == int(logits.argmax()), (recipe, seed, step)
            seq.append(token)
    assert dec.fed == len(prompt) + 31  # the prompt once, then one token per step
    mla = [
        layer
        for layer, block in zip(dec.cache.layers, hf.model.layers, strict=True)
        if block.kind == "mla"
    ]
    assert bool(mla) == (recipe == "tiny_hybrid")
    for layer in mla:  # the compressed latent and the rope key, nothing else, per token
        a = m.mla
        assert layer["latent_len"] == len(prompt) + 31
        assert layer["latent"].shape[-1] == a.kv_lora_rank + a.qk_pos_emb_head_dim
        assert layer["latent"].shape[1] == len(prompt) + 32  # made once for the whole generation
        assert not {"k", "v"} & layer.keys()


def test_the_latent_buffer_grows_by_doubling_without_a_capacity():
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    m, hf = _hf("tiny_hybrid", seed)
    dec = Decoder(hf, m.max_position_embeddings)
    dec.reset(0)
    sizes = []
    with torch.no_grad():
        dec.feed([1, 2, 3])
        for t in range(10):
            dec.feed([t + 4])
            layer = next(
                c for c, b in zip(dec.cache.layers, hf.model.layers, strict=True) if b.kind == "mla"
            )
            sizes.append(layer["latent"].shape[1])
    assert sizes == [6, 6, 6, 12, 12, 12, 12, 12, 12, 24]


def test_pick_greedy_top_k_top_p_and_the_seed():
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0, 1.0])
    assert pick(logits, Sampling(), None) == 1
    draws = lambda s, n=200: {  # noqa: E731
        pick(logits, s, g) for g in [torch.Generator().manual_seed(i) for i in range(n)]
    }
    assert draws(Sampling(temperature=1.0, top_k=2)) == {1, 2}
    # top-p: the most likely token alone holds under 0.5 of the mass, the first two hold more
    assert draws(Sampling(temperature=1.0, top_p=0.5)) == {1, 2}
    assert draws(Sampling(temperature=1.0, top_p=0.01)) == {1}
    assert len(draws(Sampling(temperature=5.0))) == 5
    again = [
        pick(logits, Sampling(temperature=1.0), torch.Generator().manual_seed(7)) for _ in range(3)
    ]
    assert len(set(again)) == 1


def test_stop_text_cuts_and_holds_back_its_beginning():
    m, hf = _hf("tiny_kda", 1234)
    dec = Decoder(hf, m.max_position_embeddings)
    prompt = [5, 6, 7]
    full = generate(dec, _Tok(), prompt, max_new_tokens=6, sampling=Sampling(), stop_ids=set())
    third = f"[{full.ids[2]}]"
    shown: list[str] = []
    cut = generate(
        dec,
        _Tok(),
        prompt,
        max_new_tokens=6,
        sampling=Sampling(),
        stop=[third],
        stop_ids=set(),
        on_text=shown.append,
    )
    assert cut.stop_reason == "stop"
    assert cut.text == full.text[: full.text.find(third)] and len(cut.ids) <= 3
    assert "".join(shown) == cut.text  # nothing of the stop text was shown
    ended = generate(
        dec, _Tok(), prompt, max_new_tokens=6, sampling=Sampling(), stop_ids={full.ids[1]}
    )
    first = full.ids.index(full.ids[1])  # the first time that token comes
    assert ended.stop_reason == "eos" and ended.ids == full.ids[:first]
    assert ended.unfed == [full.ids[1]]


def test_generation_stops_at_the_last_position():
    m, hf = _hf("tiny_kda", 1234)
    dec = Decoder(hf, 8)
    out = generate(
        dec, _Tok(), [1, 2, 3, 4, 5], max_new_tokens=20, sampling=Sampling(), stop_ids=set()
    )
    assert out.stop_reason == "max_positions" and dec.seen == 8


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_greedy_generation_on_the_gpu_is_the_argmax_of_the_full_forward(recipe, monkeypatch):
    """On a CUDA GPU: cached generation, whose recurrent blocks step their states with FLA's fused
    recurrent kernels, equals recomputing the whole sequence with FLA's chunk kernels (the claim of
    the test above, on the GPU's kernels).

    Random weights (a printed seed), fp32 on the GPU: greedy decoding through the cache must
    choose, at every one of 32 steps, the argmax of a full no-cache forward over everything so
    far, or a token whose logit there is within TIE of that maximum (a near-tie: FLA's chunk
    kernels multiply in tf32, about 1e-3 relative, so they may break a tie the other way; the
    logits' spread is about 0.2 at this init); each step of each recurrent block must have gone
    through a fused recurrent kernel
    (counted), and the no-cache forwards through none.
    """
    pytest.importorskip("fla.ops.kda")
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    m, hf = _hf(recipe, seed)
    hf = hf.cuda()
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


GRAPH_RECIPES = ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"]


def _seed() -> int:
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    return seed


@pytest.mark.parametrize("recipe", GRAPH_RECIPES)
def test_the_fixed_shape_step_is_a_cached_forward_and_updates_in_place(recipe):
    seed = _seed()
    m, hf = _hf(recipe, seed)
    prompt = torch.randint(0, m.vocab_size, (11,)).tolist()
    a, b = Decoder(hf, m.max_position_embeddings), Decoder(hf, m.max_position_embeddings)
    for d in (a, b):
        d.reset(len(prompt) + 16)
    la, _ = a.feed(prompt), b.feed(prompt)
    held = graph.signature(b.cache)
    token, position = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        for step in range(16):
            t = int(la.argmax())
            la = a.feed([t])
            token.fill_(t)
            position.fill_(b.cache.seen)
            b.cache.reserve(b.cache.seen + 1)
            lb = hf.decode_step(token, position, b.cache)[0]
            b.cache.advance()
            err = float((la - lb).abs().max())
            assert torch.allclose(la, lb, rtol=1e-5, atol=1e-5), (recipe, seed, step, err)
            assert graph.signature(b.cache) == held, (recipe, step)  # every buffer in place
    assert a.cache.seen == b.cache.seen == len(prompt) + 16
    for da, db in zip(a.cache.layers, b.cache.layers, strict=True):
        assert da.get("latent_len") == db.get("latent_len")


def test_reserve_grows_the_latent_buffers_and_keeps_their_rows():
    m, hf = _hf("tiny_hybrid", _seed())
    dec = Decoder(hf, m.max_position_embeddings)
    dec.reset(0)
    dec.feed([1, 2, 3])
    mla = [d for d in dec.cache.layers if "latent" in d]
    before = [d["latent"][:, :3].clone() for d in mla]
    dec.cache.reserve(10)
    for d, rows in zip(mla, before, strict=True):
        assert d["latent"].shape[1] == 10 and torch.equal(d["latent"][:, :3], rows)
        assert not d["latent"][:, 3:].any()  # zero-filled: masked rows are never NaN


def test_cuda_graph_is_off_on_a_cpu_and_generation_is_unchanged():
    m, hf = _hf("tiny_hybrid", _seed())
    prompt = [5, 6, 7]
    dec = Decoder(hf, m.max_position_embeddings, cuda_graph=True)
    assert dec.graphed is None
    got = generate(dec, _Tok(), prompt, max_new_tokens=6, sampling=Sampling(), stop_ids=set())
    want = generate(
        Decoder(hf, m.max_position_embeddings),
        _Tok(),
        prompt,
        max_new_tokens=6,
        sampling=Sampling(),
        stop_ids=set(),
    )
    assert got.ids == want.ids


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GRAPH_RECIPES)
def test_graphed_steps_give_the_eager_steps_logits_on_the_gpu(recipe):
    """fp32; relative and absolute 1e-4 (the eager path attends over the held rows, the graph over
    the whole buffer). A restore replaces the buffers: the step is captured again."""
    pytest.importorskip("fla.ops.kda")
    seed = _seed()
    m, hf = _hf(recipe, seed)
    hf = hf.cuda()
    prompt = torch.randint(0, m.vocab_size, (11,)).tolist()
    a = Decoder(hf, m.max_position_embeddings)
    b = Decoder(hf, m.max_position_embeddings, cuda_graph=True)
    for d in (a, b):
        d.reset(len(prompt) + 24)
    after_prompt, _ = a.feed(prompt), b.feed(prompt)
    snap_a, snap_b = a.snapshot(), b.snapshot()
    first: list[torch.Tensor] = []
    for again in (False, True):
        la = after_prompt
        for step in range(12):
            t = int(la.argmax())
            la, lb = a.feed([t]), b.feed([t])
            err = float((la - lb).abs().max())
            assert torch.allclose(la, lb, rtol=1e-4, atol=1e-4), (recipe, seed, again, step, err)
            if again:  # the same steps again, from the restored state through a new capture
                assert torch.allclose(lb, first[step], rtol=1e-5, atol=1e-5), (recipe, seed, step)
            else:
                first.append(lb.clone())
        a.restore(snap_a)
        b.restore(snap_b)
    g = b.graphed
    assert g is not None and g.failed is None, g and g.failed
    assert g.eager_steps == graph.WARMUP and g.captures == 2, (g.eager_steps, g.captures)
    assert g.replays == 24 - graph.WARMUP


class _FakeGraph:
    """A stand-in CUDA graph: its pool lives while a graph that uses it is alive (as in torch's
    allocator, where the last graph's destructor frees its private pool)."""

    pools: dict[int, int] = {}  # pool id -> graphs using it

    def __init__(self) -> None:
        self.pool_id: int | None = None

    def pool(self) -> int:
        assert self.pool_id is not None
        return self.pool_id

    def replay(self) -> None:
        pass

    def __del__(self) -> None:
        if self.pool_id is not None:
            _FakeGraph.pools[self.pool_id] -= 1


class _fake_capture:
    def __init__(self, g: _FakeGraph, pool: int | None = None) -> None:
        if pool is not None:  # torch: INTERNAL ASSERT use_count > 0 on a pool already freed
            assert _FakeGraph.pools.get(pool, 0) > 0, "capture began on a freed pool"
        g.pool_id = pool if pool is not None else len(_FakeGraph.pools) + 1
        _FakeGraph.pools[g.pool_id] = _FakeGraph.pools.get(g.pool_id, 0) + 1

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_new_capture_shares_the_pool_while_the_graph_before_still_holds_it(monkeypatch):
    """A restore replaced the buffers: the step is captured again on the same private pool. The
    first graph must still be alive when the second capture begins (on 775f8db it was dropped
    first, its pool with it: the capture on the H100 failed inside torch's allocator)."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _fake_capture)
    monkeypatch.setattr(_FakeGraph, "pools", {})

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def decode_step(self, token, position, cache):
            return torch.zeros(1, 3)

    class Cache:
        def __init__(self) -> None:
            self.layers = [{"state": torch.zeros(2)}]
            self.seen = 4

        def reserve(self, rows: int) -> None:
            pass

        def advance(self) -> None:
            self.seen += 1

    g = graph.GraphedDecode(Model())
    g.eager_steps = graph.WARMUP  # past the eager warm-up
    cache = Cache()
    g.step(cache, 1)
    g.step(cache, 2)
    cache.layers = [{"state": torch.zeros(2)}]  # new buffers (a restore): captured again
    g.step(cache, 3)
    assert g.failed is None, g.failed
    assert (g.captures, g.replays) == (2, 3)
    assert _FakeGraph.pools == {1: 1}, _FakeGraph.pools  # one pool, held by the live graph
