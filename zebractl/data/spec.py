"""The dataset contract: what a recipe's ``data.paths`` name, read without torch or megatron.

``data.paths`` entries name a ``zebractl prepare`` output folder (its manifest lists the shards) or a
raw megatron ``.bin/.idx`` prefix. Every shard of every entry joins one blend; a shard's weight is its
entry's weight times the shard's share of that entry's tokens, so an entry's weight is the fraction of
training samples it contributes whatever its shard layout.

Held-out data: ``data.split`` carves train/valid/test parts out of each dataset (megatron's split);
left unset, the validation shards ``zebractl prepare --valid-fraction`` wrote are the held-out data.

All entries must share one tokenizer (fingerprint), whose vocabulary must fit the model's, and that
``data.tokenizer`` (when set) names. :func:`resolve_data` checks all of it (exit 2 naming the entry);
``train`` builds its datasets from the result, ``verify`` and ``eval`` read real text through it.
"""

from __future__ import annotations

import json
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
