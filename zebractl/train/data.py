"""Training data: a recipe's prepared datasets as megatron-core GPTDatasets, fed by a DataLoader.

``data.paths`` entries name a ``zebractl prepare`` output folder (its manifest lists the shards) or a
raw megatron ``.bin/.idx`` prefix. Every shard of every entry joins one blend; a shard's weight is its
entry's weight times the shard's share of that entry's tokens, so an entry's weight is the fraction of
training samples it contributes whatever its shard layout.

Held-out data: ``data.split`` carves train/valid/test parts out of each dataset (megatron's split);
left unset, the validation shards ``zebractl prepare --valid-fraction`` wrote are the held-out data.

All entries must share one tokenizer (fingerprint), whose vocabulary must fit the model's, and that
``data.tokenizer`` (when set) names.

The loader: a :class:`ConsumedSamplesSampler` yields this rank's micro-batches of every global batch
from a consumed-samples offset, so the data order depends only on (seed, consumed samples) and a
resumed run reads exactly what the uninterrupted one would have, with any ``data.num_workers``.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError
from zebractl.schemas.recipe import RunConfig


@dataclass(frozen=True)
class Shard:
    """One indexed dataset of a blend."""

    prefix: str
    tokens: int
    weight: float


@dataclass(frozen=True)
class DataSpec:
    """The resolved blends and the tokenizer facts GPTDataset needs."""

    train: list[Shard]
    valid: list[Shard]
    """Validation shards written by `zebractl prepare --valid-fraction` (empty if none)."""
    vocab_size: int
    eod: int
    tokenizer_fingerprint: str | None
    tokenizer_source: str | None


@dataclass(frozen=True)
class _Entry:
    root: Path
    train: list[tuple[str, int]]
    valid: list[tuple[str, int]]
    tokenizer: dict[str, Any] | None
    chat: bool = False  # prepared with --format chat: loss masks beside the tokens


def _entry(path: str, base: Path) -> _Entry:
    root = Path(path) if Path(path).is_absolute() else base / path
    manifest = root / "manifest.json"
    if manifest.is_file():
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            shards = [
                (o["split"], str(root / o["prefix"]), int(o["tokens"]))
                for o in doc["shards"]
                if o.get("kind", "tokens") == "tokens"  # a chat dataset's masks lie beside them
            ]
            tok = doc["tokenizer"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{manifest}: not a valid prepare manifest ({exc})") from None
        train = [(p, t) for s, p, t in shards if s == "train"]
        valid = [(p, t) for s, p, t in shards if s == "valid"]
        if not train:
            raise ConfigError(f"{path}: the prepared dataset has no train split")
        return _Entry(root, train, valid, tok, chat=bool(doc.get("chat")))
    if root.is_dir():
        raise ConfigError(
            f"{path}: a folder without manifest.json (not a finished `zebractl prepare` "
            "output; run `zebractl prepare ... --output` to finish it, or give a "
            ".bin/.idx prefix)"
        )
    if Path(f"{root}.bin").is_file() and Path(f"{root}.idx").is_file():
        size = Path(f"{root}.bin").stat().st_size
        return _Entry(root, [(str(root), size)], [], None)
    raise ConfigError(
        f"{path}: no prepared dataset here (expected a `zebractl prepare` folder or a "
        f"{path}.bin/.idx pair); `zebractl prepare --demo --output data/demo` builds the "
        "demo one"
    )


def _weighted(found: list[tuple[str, int]], weight: float) -> list[Shard]:
    total = sum(t for _, t in found) or 1
    return [Shard(p, t, weight * t / total) for p, t in found]


def resolve_data(cfg: RunConfig, base: Path | None = None) -> DataSpec:
    """Find every shard of the recipe's datasets; check tokenizers and held-out data."""
    base = base or Path.cwd()
    train: list[Shard] = []
    valid: list[Shard] = []
    tokenizers: list[tuple[str, dict[str, Any]]] = []
    for entry in cfg.data.paths:
        e = _entry(entry.path, base)
        if cfg.data.format == "chat" and not e.chat:
            raise ConfigError(
                f"data.format is chat but {entry.path} has no loss masks (not prepared with "
                "`zebractl prepare --format chat`); prepare it so, or set data.format: text"
            )
        train += _weighted(e.train, entry.weight)
        valid += _weighted(e.valid, entry.weight)
        if e.tokenizer is not None:
            tokenizers.append((entry.path, e.tokenizer))
    prints = {t["fingerprint"] for _, t in tokenizers}
    if len(prints) > 1:
        raise ConfigError(
            "data.paths mixes datasets made with different tokenizers "
            f"({', '.join(sorted(t['source'] for _, t in tokenizers))}); prepare them with "
            "one tokenizer"
        )
    if valid and cfg.data.split is not None:
        raise ConfigError(
            f"data.split is {cfg.data.split} but the prepared data already has a validation "
            "split (`zebractl prepare --valid-fraction`); remove data.split to validate on "
            "it, or prepare without --valid-fraction"
        )
    named = check_tokenizer(cfg.data.tokenizer, tokenizers)
    if tokenizers:
        tok = tokenizers[0][1]
        vocab, eod = int(tok["vocab_size"]), tok.get("eos_id")
        if eod is None:
            eod = tok.get("bos_id")
        fingerprint, source = tok["fingerprint"], tok.get("source")
    elif named is not None:  # raw .bin/.idx prefixes: the named tokenizer supplies the facts
        vocab, fingerprint, source = named.vocab_size, named.fingerprint, named.source
        eod = named.eos_id if named.eos_id is not None else named.bos_id
    else:
        vocab, eod, fingerprint, source = cfg.model.vocab_size, None, None, None
    if vocab > cfg.model.padded_vocab_size:
        raise ConfigError(
            f"the data's tokenizer has {vocab} tokens but the model's vocabulary "
            f"is {cfg.model.vocab_size} (padded {cfg.model.padded_vocab_size}); set "
            f"model.vocab_size: {vocab}"
        )
    return DataSpec(train, valid, vocab, -1 if eod is None else int(eod), fingerprint, source)


def check_tokenizer(name: str | None, tokenizers: list[tuple[str, dict[str, Any]]]) -> Any:
    """Check ``data.tokenizer`` against the datasets' manifests (name, then fingerprint).

    Returns the loaded tokenizer when it had to be loaded (a local path, or datasets without a
    manifest), else None. A mismatch, or a name that cannot be loaded here to compare, is exit 2
    naming both.
    """
    if name is None:
        return None
    from zebractl.data.tokenizer import load_tokenizer

    if tokenizers and all(t.get("source") == name for _, t in tokenizers):
        local = Path(name).expanduser()
        if not local.exists():
            return None  # the very name the data was prepared with (a Hub id): same tokenizer
    try:
        tok = load_tokenizer(name)
    except ConfigError as exc:
        if not tokenizers:
            raise ConfigError(f"data.tokenizer: {exc}") from None
        path, t = tokenizers[0]
        raise ConfigError(
            f"data.tokenizer '{name}' cannot be loaded here to compare with the tokenizer "
            f"{path} was prepared with ('{t.get('source')}', fingerprint "
            f"{str(t.get('fingerprint'))[:12]}): {exc}; leave data.tokenizer unset to use the "
            "dataset's own"
        ) from None
    for path, t in tokenizers:
        if t.get("fingerprint") != tok.fingerprint:
            raise ConfigError(
                f"data.tokenizer '{name}' (fingerprint {tok.fingerprint[:12]}) is not the "
                f"tokenizer {path} was prepared with ('{t.get('source')}', fingerprint "
                f"{str(t.get('fingerprint'))[:12]}); prepare the data with it, or fix "
                "data.tokenizer"
            )
    return tok


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


def _blend(shards: list[Shard]) -> tuple[list[str], list[float]]:
    return [s.prefix for s in shards], [s.weight for s in shards]


def build_datasets(
    cfg: RunConfig, spec: DataSpec, train_samples: int, valid_samples: int, cache_dir: Path
) -> tuple[Any, Any | None]:
    """(train, valid) megatron GPTDatasets; valid is None without held-out data."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    cache_dir.mkdir(parents=True, exist_ok=True)
    drop_torn_cache(cache_dir)
    if cfg.data.split is None and spec.valid:
        where: dict[str, Any] = {"blend_per_split": [_blend(spec.train), _blend(spec.valid), None]}
    else:
        split = cfg.data.split or [1.0, 0.0, 0.0]
        where = {"blend": _blend(spec.train), "split": ",".join(f"{x:g}" for x in split)}
    has_valid = bool(spec.valid) if cfg.data.split is None else cfg.data.split[1] > 0
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.data.seq_length,
        path_to_cache=str(cache_dir),
        tokenizer=_TokenizerFacts(spec),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
        **where,
    )
    sizes = [train_samples, valid_samples if has_valid else 0, 0]
    cls = GPTDataset
    if cfg.data.format == "chat":
        from zebractl.train.masked_data import MaskedGPTDataset

        cls = MaskedGPTDataset
    train, valid, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    if valid is not None and len(valid) == 0:
        valid = None
    return train, valid if has_valid else None


def drop_torn_cache(cache_dir: Path) -> list[Path]:
    """Delete index-cache files a killed run left half-written (and their siblings), so megatron
    rebuilds them instead of failing to memory-map a short file. Returns what was deleted."""
    import numpy as np

    torn: set[str] = set()
    for npy in cache_dir.glob("*.npy"):
        try:
            with npy.open("rb") as f:
                fmt = np.lib.format
                major, _ = fmt.read_magic(f)
                read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
                shape, _, dtype = read(f)
                need = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            ok = npy.stat().st_size >= need
        except (OSError, ValueError, EOFError, SyntaxError):
            ok = False
        if not ok:
            torn.add(npy.name.split("-", 1)[0])  # megatron names them HASH-Class-split-what.npy
    gone = [p for p in cache_dir.iterdir() if p.name.split("-", 1)[0] in torn]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


class ConsumedSamplesSampler:
    """Batch sampler: this rank's micro-batches of each global batch, from ``consumed`` on.

    Global batch ``k`` covers samples ``[k*G, (k+1)*G)``; rank ``r`` of ``W`` takes its contiguous
    ``G/W`` of them in micro-batches of ``micro``.
    """

    def __init__(
        self, size: int, consumed: int, micro: int, global_: int, rank: int, world: int
    ) -> None:
        self.size, self.consumed = size, consumed
        self.micro, self.global_, self.rank, self.world = micro, global_, rank, world

    def __iter__(self) -> Iterator[list[int]]:
        per_rank = self.global_ // self.world
        start = self.consumed
        while start + self.global_ <= self.size:
            first = start + self.rank * per_rank
            for m in range(per_rank // self.micro):
                yield list(range(first + m * self.micro, first + (m + 1) * self.micro))
            start += self.global_

    def __len__(self) -> int:
        steps = max(0, (self.size - self.consumed) // self.global_)
        return steps * (self.global_ // self.world) // self.micro


def _quiet_worker(_: int) -> None:
    # Stop signals are for the training process: it finishes the step and saves. A worker that
    # died from Ctrl-C or Slurm's SIGTERM would fail that last step instead.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def loader(dataset: Any, sampler: ConsumedSamplesSampler, num_workers: int, pin: bool) -> Any:
    """A DataLoader over ``dataset`` in ``sampler``'s order, stacking tokens/labels/loss_mask."""
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin,
        collate_fn=_collate,
        worker_init_fn=_quiet_worker if num_workers else None,
    )


def _collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {
        k: torch.stack([torch.as_tensor(it[k]) for it in items])
        for k in ("tokens", "labels", "loss_mask")
    }


def keep_documents_apart(mb: dict[str, Any], eod: int) -> Any:
    """``data.packing: isolated``: the micro-batch's documents (a
    :class:`~zebractl.model.segments.Segments` for the model) and its ``loss_mask`` without the
    labels that follow an end-of-document token (the next document's first token), in place."""
    from zebractl.model.segments import Segments

    tokens = mb["tokens"]
    mb["loss_mask"] = mb["loss_mask"] * (tokens != eod).to(mb["loss_mask"].dtype)
    return Segments.from_tokens(tokens, eod)
