"""Training data: prepared datasets -> blend -> megatron GPTDataset samples."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.data import demo  # noqa: E402
from zebractl.data.prepare import PrepareOptions, prepare  # noqa: E402
from zebractl.data.spec import resolve_data  # noqa: E402
from zebractl.errors import ConfigError  # noqa: E402
from zebractl.train.data import build_datasets  # noqa: E402

TEXT = ["The quick brown fox jumps over the lazy dog. " * 20 + str(i) for i in range(60)]


def _prepared(tmp_path, name, docs, tokenizer=None):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / name
    prepare(
        PrepareOptions(
            inputs=(str(src),), tokenizer=tokenizer or str(demo.tokenizer_dir()), output=str(out)
        )
    )
    return out


def _cfg(*paths, weights=None):
    entries = ", ".join(
        f"{{path: {p}, weight: {w}}}"
        for p, w in zip(paths, weights or [1.0] * len(paths), strict=True)
    )
    return resolve_recipe("tiny_kda", [f"data.paths=[{entries}]"]).run


def test_blend_weights_follow_entries_not_shards(tmp_path):
    a = _prepared(tmp_path, "a", TEXT)
    b = _prepared(tmp_path, "b", TEXT[:10])
    spec = resolve_data(_cfg(a, b, weights=[3.0, 1.0]))
    by_entry = {}
    for s in spec.train:
        by_entry.setdefault(s.prefix.split("/shards/")[0], 0.0)
        by_entry[s.prefix.split("/shards/")[0]] += s.weight
    assert by_entry == {str(a): pytest.approx(3.0), str(b): pytest.approx(1.0)}
    assert (spec.vocab_size, spec.eod) == (50257, 50256)


def test_gpt_dataset_samples(tmp_path, process_group):
    out = _prepared(tmp_path, "a", TEXT)
    cfg = _cfg(out)
    train, valid = build_datasets(cfg, resolve_data(cfg), 40, 4, tmp_path / "cache")
    assert len(train) >= 40 and len(valid) >= 4  # the recipe's 98/2/0 split
    sample = train[0]
    assert sample["tokens"].shape == (128,) and sample["labels"].shape == (128,)
    assert torch.equal(sample["tokens"][1:], sample["labels"][:-1])  # next-token labels
    again, _ = build_datasets(cfg, resolve_data(cfg), 40, 4, tmp_path / "cache2")
    assert torch.equal(again[5]["tokens"], train[5]["tokens"])  # deterministic order (seeded)


def test_missing_dataset_says_how_to_make_it(tmp_path):
    with pytest.raises(ConfigError, match="zebractl prepare --demo --output data/demo"):
        resolve_data(_cfg(tmp_path / "nothing"))
    (tmp_path / "half").mkdir()
    with pytest.raises(ConfigError, match="without manifest.json"):
        resolve_data(_cfg(tmp_path / "half"))


def test_mixed_tokenizers_and_too_small_vocab_are_refused(tmp_path):
    a = _prepared(tmp_path, "a", TEXT)
    tok = tmp_path / "tok"
    tok.mkdir()
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, "the": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tok / "tokenizer.json"))
    b = _prepared(tmp_path, "b", TEXT, tokenizer=str(tok))
    with pytest.raises(ConfigError, match="different tokenizers"):
        resolve_data(_cfg(a, b))
    small = resolve_recipe("tiny_kda", [f"data.paths=[{{path: {a}}}]", "model.vocab_size=1000"]).run
    with pytest.raises(ConfigError, match="set model.vocab_size: 50257"):
        resolve_data(small)


def test_the_sampler_gives_each_rank_its_share_of_every_global_batch():
    from zebractl.train.data import ConsumedSamplesSampler

    def batches(rank, world, consumed=0):
        return list(ConsumedSamplesSampler(20, consumed, 2, 8, rank, world))

    assert batches(0, 1) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert batches(0, 2)[:2] == [[0, 1], [2, 3]] and batches(1, 2)[:2] == [[4, 5], [6, 7]]
    # resuming at 8 consumed samples continues with the second global batch; 16..19 cannot make
    # a whole global batch and are never served
    assert batches(0, 1, consumed=8) == batches(0, 1)[4:]
    assert len(ConsumedSamplesSampler(20, 8, 2, 8, 0, 1)) == 4


def test_a_torn_index_cache_file_is_dropped_with_its_siblings(tmp_path):
    import numpy as np

    from zebractl.train.data import drop_torn_cache

    for name in ("aaa-GPTDataset-train-doc.npy", "aaa-GPTDataset-train-sample.npy"):
        np.save(tmp_path / name, np.arange(1000))
    (tmp_path / "aaa-GPTDataset-train-description.txt").write_text("x")
    np.save(tmp_path / "bbb-GPTDataset-valid-doc.npy", np.arange(10))
    torn = tmp_path / "aaa-GPTDataset-train-sample.npy"
    torn.write_bytes(torn.read_bytes()[:500])
    gone = drop_torn_cache(tmp_path)
    assert sorted(p.name for p in gone) == [
        "aaa-GPTDataset-train-description.txt",
        "aaa-GPTDataset-train-doc.npy",
        "aaa-GPTDataset-train-sample.npy",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["bbb-GPTDataset-valid-doc.npy"]


def test_only_rank_0_tidies_the_index_cache(tmp_path, process_group, monkeypatch):
    """Rank 0 writes megatron's index cache while the other ranks wait; a rank that tidied it too
    deleted files rank 0 was still writing as torn (a two-process CI run then failed)."""
    import torch.distributed as tdist

    from zebractl.train import data

    out = _prepared(tmp_path, "a", TEXT)
    cfg = _cfg(out)
    spec, cache = resolve_data(cfg), tmp_path / "cache"
    tidied = []
    monkeypatch.setattr(data, "drop_torn_cache", lambda d: tidied.append(d) or [])
    build_datasets(cfg, spec, 40, 4, cache)  # rank 0 (of one): tidies, builds the cache
    assert tidied == [cache] and list(cache.glob("*.npy"))
    monkeypatch.setattr(tdist, "get_rank", lambda group=None: 1)  # another rank: reads it
    train, _ = build_datasets(cfg, spec, 40, 4, cache)
    assert tidied == [cache] and len(train) >= 40
