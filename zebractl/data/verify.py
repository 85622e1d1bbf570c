"""``zebractl prepare --verify DIR``: re-read every shard and check it against the manifest.

Checks per output: both files exist; sizes and sha256 match; the ``.idx`` parses (megatron's reader)
with the manifest's dtype, document and sequence counts; the ``.bin`` holds exactly the indexed number
of tokens; every token id is below the tokenizer's vocabulary size. Totals must add up. Chat data:
each mask has its token dataset's lengths and only 0/1 values, and the chat template's recorded
text has its recorded sha256.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from zebractl.errors import ConfigError
from zebractl.schemas.reports import Manifest, VerifyChecked, VerifyReport
from zebractl.util import sha256_file


def verify_prepared(folder: str | Path) -> VerifyReport:
    """Check ``folder`` (see the module docstring); a missing manifest is a usage error (exit 2)."""
    import numpy as np

    root = Path(folder)
    manifest = _read_manifest(root)
    vocab = manifest["tokenizer"]["vocab_size"]
    seen = _Seen(np.dtype(manifest["dtype"]), vocab)
    problems: list[str] = []
    for out in manifest["shards"]:
        problems += _output_problems(root, out, seen)
    problems += _tokenizer_problems(root, manifest["tokenizer"])
    problems += _template_problems(manifest.get("chat"))
    totals = manifest["totals"]
    if not problems and (seen.documents, seen.tokens) != (totals["documents"], totals["tokens"]):
        problems.append(
            f"totals: {seen.documents} documents / {seen.tokens} tokens, manifest says "
            f"{totals['documents']} / {totals['tokens']}"
        )
    return VerifyReport(
        folder=str(folder),
        ok=not problems,
        problems=problems,
        checked=VerifyChecked(
            outputs=len(manifest["shards"]),
            documents=seen.documents,
            tokens=seen.tokens,
            max_token_id=seen.max_id,
            vocab_size=vocab,
            dtype=seen.dtype.name,
        ),
    )


def _read_manifest(root: Path) -> dict[str, Any]:
    """The folder's manifest; none, or an unreadable one, is a usage error (exit 2)."""
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(
            f"{root}: no manifest.json (not a finished `zebractl prepare` output; "
            "rerun prepare with the same arguments to finish it)"
        )
    try:
        doc = json.loads(manifest_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{manifest_path}: unreadable ({exc})") from None
    try:  # what the checks below read is typed as they read it
        Manifest.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(k) for k in first["loc"]) or "(top level)"
        raise ConfigError(
            f"{manifest_path}: not a manifest this zebractl reads ({exc.error_count()} "
            f"problem(s); {where}: {first['msg']}); it was changed after `zebractl prepare` "
            "wrote it, or written by another version: prepare the data again"
        ) from None
    return doc


@dataclass
class _Seen:
    """What the token datasets checked so far hold, and what they must: the manifest's dtype and
    vocabulary size."""

    dtype: Any
    vocab: int
    documents: int = 0
    tokens: int = 0
    max_id: int = -1
    lengths: dict[str, Any] = field(default_factory=dict)  # sequence lengths, for their masks


def _output_problems(root: Path, out: dict[str, Any], seen: _Seen) -> list[str]:
    """One output of the manifest: its files, its index, and its tokens (or its mask values)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import _IndexReader

    prefix = root / out["prefix"]
    name = out["prefix"]
    mask = out.get("kind", "tokens") == "mask"
    want = np.dtype(np.uint8) if mask else seen.dtype
    problems, bad = _file_problems(name, prefix, out["files"])
    if bad:
        return problems
    try:
        index = _IndexReader(f"{prefix}.idx", multimodal=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a finding
        return [*problems, f"{name}.idx: unreadable index ({type(exc).__name__}: {exc})"]
    if np.dtype(index.dtype) != want:
        problems.append(
            f"{name}.idx: dtype {np.dtype(index.dtype).name}, manifest says {want.name}"
        )
    n_docs = len(index.document_indices) - 1
    n_tokens = int(np.asarray(index.sequence_lengths, dtype=np.int64).sum())
    if n_docs != out["documents"]:
        problems.append(f"{name}: {n_docs} documents, manifest says {out['documents']}")
    if n_tokens != out["tokens"]:
        problems.append(f"{name}: {n_tokens} tokens indexed, manifest says {out['tokens']}")
    bin_path = Path(f"{prefix}.bin")
    if mask:
        return problems + _mask_problems(
            name, bin_path, index, seen.lengths.get(name[: -len(".mask")])
        )
    seen.lengths[name] = np.array(index.sequence_lengths)  # a copy: the index unmaps its buffer
    problems += _token_problems(name, bin_path, n_tokens, seen)
    seen.documents += n_docs
    seen.tokens += n_tokens
    return problems


def _file_problems(name: str, prefix: Path, files: dict[str, Any]) -> tuple[list[str], bool]:
    """An output's files against the manifest's sizes and sha256s; and whether one is missing or
    of another size (then nothing more of it is read)."""
    problems: list[str] = []
    bad = False
    for ext, meta in files.items():
        path = Path(f"{prefix}.{ext}")
        if not path.is_file():
            problems.append(f"{name}.{ext}: missing")
            bad = True
        elif path.stat().st_size != meta["bytes"]:
            problems.append(
                f"{name}.{ext}: {path.stat().st_size} bytes, manifest says {meta['bytes']}"
            )
            bad = True
        elif sha256_file(path) != meta["sha256"]:
            problems.append(f"{name}.{ext}: content differs from the manifest (sha256)")
    return problems, bad


def _token_problems(name: str, bin_path: Path, n_tokens: int, seen: _Seen) -> list[str]:
    """A token dataset's ``.bin``: exactly its indexed tokens, every id below the vocabulary size."""
    import numpy as np

    dtype, vocab = seen.dtype, seen.vocab
    if bin_path.stat().st_size != n_tokens * dtype.itemsize:
        return [
            f"{name}.bin: {bin_path.stat().st_size} bytes for {n_tokens} "
            f"{dtype.name} tokens ({n_tokens * dtype.itemsize} expected)"
        ]
    if not n_tokens:
        return []
    data = np.memmap(bin_path, dtype=dtype, mode="r")
    top = max(int(data[i : i + (1 << 24)].max()) for i in range(0, len(data), 1 << 24))
    seen.max_id = max(seen.max_id, top)
    if top >= vocab:
        return [f"{name}.bin: token id {top} >= vocabulary size {vocab}"]
    return []


def _mask_problems(name: str, bin_path: Path, index: Any, token_lengths: Any) -> list[str]:
    """A chat dataset's loss mask: one 0/1 byte per token of the token dataset beside it."""
    import numpy as np

    lengths = np.array(index.sequence_lengths)
    if token_lengths is None:
        return [f"{name}: a loss mask without its token dataset in the manifest"]
    if lengths.shape != token_lengths.shape or not np.array_equal(lengths, token_lengths):
        return [f"{name}: its documents' lengths differ from the token dataset's"]
    n = int(lengths.sum())
    if bin_path.stat().st_size != n:
        return [f"{name}.bin: {bin_path.stat().st_size} bytes for {n} mask values"]
    if n and int(np.memmap(bin_path, dtype=np.uint8, mode="r").max()) > 1:
        return [f"{name}.bin: a mask value other than 0 or 1"]
    return []


def _template_problems(chat: dict[str, Any] | None) -> list[str]:
    """The chat template's recorded text must be the one its sha256 names."""
    import hashlib

    template = (chat or {}).get("template") or {}
    if "text" not in template or "sha256" not in template:
        return []
    if hashlib.sha256(template["text"].encode("utf-8")).hexdigest() != template["sha256"]:
        return ["manifest chat.template: its text does not match its sha256"]
    return []


def _tokenizer_problems(root: Path, recorded: dict[str, Any]) -> list[str]:
    """The dataset's own tokenizer copy must exist and be the one the manifest names."""
    from zebractl.data.tokenizer import load_tokenizer

    folder = root / recorded.get("path", "tokenizer")
    if not folder.is_dir():
        return [f"{folder.name}/: missing (the tokenizer the data was made with)"]
    try:
        tok = load_tokenizer(str(folder))
    except ConfigError as exc:
        return [f"{folder.name}/: unreadable ({exc})"]
    if tok.fingerprint != recorded.get("fingerprint"):
        return [
            f"{folder.name}/: fingerprint {tok.fingerprint[:12]}, manifest says "
            f"{str(recorded.get('fingerprint'))[:12]}"
        ]
    return []
