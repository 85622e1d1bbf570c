"""Training data: a recipe's prepared datasets as megatron-core GPTDatasets.

``data.paths`` entries name a ``zebractl prepare`` output folder (its manifest lists the shards) or a
raw megatron ``.bin/.idx`` prefix. Every shard of every entry joins one blend; a shard's weight is its
entry's weight times the shard's share of that entry's tokens, so an entry's weight is the fraction of
training samples it contributes whatever its shard layout. ``data.split`` is megatron's per-dataset
train/valid/test split. All entries must share one tokenizer (fingerprint), whose vocabulary must fit
the model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebractl.config.errors import ConfigError
from zebractl.schemas.recipe import RunConfig


@dataclass(frozen=True)
class Shard:
    """One indexed dataset of the blend."""

    prefix: str
    tokens: int
    weight: float


@dataclass(frozen=True)
class DataSpec:
    """The resolved blend and the tokenizer facts GPTDataset needs."""

    shards: list[Shard]
    vocab_size: int
    eod: int
    tokenizer_fingerprint: str | None


def _entry_shards(path: str, base: Path) -> tuple[list[tuple[str, int]], dict[str, Any] | None]:
    root = Path(path) if Path(path).is_absolute() else base / path
    manifest = root / "manifest.json"
    if manifest.is_file():
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        outs = [o for o in doc["shards"] if o["split"] == "train"]
        if not outs:
            raise ConfigError(f"{path}: the prepared dataset has no train split")
        return [(str(root / o["prefix"]), int(o["tokens"])) for o in outs], doc["tokenizer"]
    if root.is_dir():
        raise ConfigError(
            f"{path}: a folder without manifest.json (not a finished `zebractl prepare` "
            "output; run `zebractl prepare ... --output` to finish it, or give a "
            ".bin/.idx prefix)"
        )
    if Path(f"{root}.bin").is_file() and Path(f"{root}.idx").is_file():
        size = Path(f"{root}.bin").stat().st_size
        return [(str(root), size)], None
    raise ConfigError(
        f"{path}: no prepared dataset here (expected a `zebractl prepare` folder or a "
        f"{path}.bin/.idx pair); `zebractl prepare --demo --output data/demo` builds the "
        "demo one"
    )


def resolve_data(cfg: RunConfig, base: Path | None = None) -> DataSpec:
    """Find every shard of the recipe's datasets and check their tokenizers agree with the model."""
    base = base or Path.cwd()
    shards: list[Shard] = []
    tokenizers: list[dict[str, Any]] = []
    for entry in cfg.data.paths:
        found, tok = _entry_shards(entry.path, base)
        total = sum(t for _, t in found) or 1
        shards += [Shard(p, t, entry.weight * t / total) for p, t in found]
        if tok is not None:
            tokenizers.append(tok)
    prints = {t["fingerprint"] for t in tokenizers}
    if len(prints) > 1:
        raise ConfigError(
            "data.paths mixes datasets made with different tokenizers "
            f"({', '.join(sorted(t['source'] for t in tokenizers))}); prepare them with "
            "one tokenizer"
        )
    if tokenizers:
        tok = tokenizers[0]
        vocab, eod = int(tok["vocab_size"]), tok.get("eos_id")
        if vocab > cfg.model.padded_vocab_size:
            raise ConfigError(
                f"the data's tokenizer has {vocab} tokens but the model's vocabulary "
                f"is {cfg.model.vocab_size} (padded {cfg.model.padded_vocab_size}); set "
                f"model.vocab_size: {vocab}"
            )
        if eod is None:
            eod = tok.get("bos_id")
    else:
        vocab, eod = cfg.model.vocab_size, None
    return DataSpec(
        shards,
        vocab,
        -1 if eod is None else int(eod),
        tokenizers[0]["fingerprint"] if tokenizers else None,
    )


class _TokenizerFacts:
    """The duck-typed tokenizer megatron's GPTDataset reads (ids only; no text here)."""

    def __init__(self, spec: DataSpec) -> None:
        self.vocab_size = spec.vocab_size
        self.eod = spec.eod
        self.pad = -1
        self.unique_identifiers = {
            "class": "zebractl",
            "fingerprint": spec.tokenizer_fingerprint,
            "vocab_size": spec.vocab_size,
            "eod": spec.eod,
        }


def build_datasets(
    cfg: RunConfig, spec: DataSpec, num_samples: tuple[int, int, int], cache_dir: Path
) -> list[Any]:
    """[train, valid, test] megatron GPTDatasets (None where a split is empty)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    cache_dir.mkdir(parents=True, exist_ok=True)
    split = ",".join(f"{x:g}" for x in cfg.data.split)
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.data.seq_length,
        blend=([s.prefix for s in spec.shards], [s.weight for s in spec.shards]),
        split=split,
        path_to_cache=str(cache_dir),
        tokenizer=_TokenizerFacts(spec),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )
    return BlendedMegatronDatasetBuilder(
        GPTDataset, list(num_samples), lambda: True, config
    ).build()
