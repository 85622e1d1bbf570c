"""What every shard writer of ``zebractl prepare`` shares (plain text and chat alike): the record
problems it counts and how a bad record or file is skipped, an input file's counts, the held-out
split of a document, and the shard's indexed datasets (``.bin``/``.idx``), written under temporary
names, then published with the shard's JSON or discarded."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.data.sources import InputError, Source
from zebractl.util import sha256_file

RECORD_PROBLEMS = (
    "malformed_json",
    "missing_text_key",
    "invalid_utf8",
    "invalid_unicode",
    "not_text",
)
MASK_EXT = "mask"
"""The mask dataset of ``PREFIX`` is ``PREFIX.mask.bin/.idx``."""


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` as indented JSON at ``path``, written under a temporary name and renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def is_valid(key: str, index: int, fraction: float) -> bool:
    """Whether document ``index`` of source ``key`` is held out (a hash below ``fraction``)."""
    if fraction <= 0:
        return False
    return zlib.crc32(f"{key}:{index}".encode()) / 2**32 < fraction


def publish(builder: Any, tmp: Path, final: Path) -> dict[str, dict[str, Any]]:
    """Finish the indexed dataset ``builder`` wrote at ``tmp`` (.bin/.idx), move it to ``final``
    and return its files' sizes and sha256s (a shard output's ``files``)."""
    builder.finalize(f"{tmp}.idx")
    files = {}
    for ext in ("bin", "idx"):
        src = Path(f"{tmp}.{ext}")
        files[ext] = {"bytes": src.stat().st_size, "sha256": sha256_file(src)}
        src.replace(f"{final}.{ext}")
    return files


def discard(builder: Any, tmp: Path) -> None:
    """Close an unfinished indexed dataset and remove its temporary files."""
    builder.data_file.close()
    for ext in ("bin", "idx"):
        Path(f"{tmp}.{ext}").unlink(missing_ok=True)


def skip_bad_record(
    exc: InputError, skip_bad: bool, problems: tuple[str, ...], skipped: Counter
) -> None:
    """A bad record: raise ``exc``, or with ``skip_bad`` and a reason among ``problems`` count it."""
    if not skip_bad or exc.reason not in problems:
        raise exc
    skipped[exc.reason] += 1


@contextmanager
def whole_file(skip_bad: bool, skipped: Counter) -> Iterator[None]:
    """A file that cannot be read (further) raises, or with ``skip_bad`` is counted and left."""
    try:
        yield
    except InputError as exc:
        if not skip_bad:
            raise
        skipped[exc.reason] += 1  # the whole file could not be read


@dataclass
class SourceTally:
    """One input file's counts in a shard."""

    source: Source
    documents: int = 0
    tokens: int = 0
    empty: int = 0
    skipped: Counter = field(default_factory=Counter)

    def entry(self) -> dict[str, Any]:
        """The file's entry in the shard's (and the manifest's) ``sources``."""
        return {
            "path": self.source.path,
            "size": self.source.size,
            "sha256": sha256_file(Path(self.source.path)),
            "documents": self.documents,
            "tokens": self.tokens,
            "empty_documents": self.empty,
            "skipped": dict(self.skipped),
        }


class ShardWriter:
    """One shard's output: a token dataset per split (chat: a loss mask beside each), written under
    ``.tmp/`` and published to ``shards/`` with the shard's stats, its marker, written last."""

    def __init__(
        self, output: str, name: str, valid_fraction: float, dtype_name: str, masks: bool = False
    ) -> None:
        import numpy as np
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        out = Path(output)
        self.name, self.valid_fraction = name, valid_fraction
        self.final_dir = out / "shards"
        self.dtype = np.dtype(dtype_name).type
        self.masks = masks
        self.splits = ["train", "valid"] if valid_fraction > 0 else ["train"]
        self.tmp = {s: out / ".tmp" / f"{name}.{s}" for s in self.splits}
        self.suffixes = {"tokens": ""} | ({MASK_EXT: f".{MASK_EXT}"} if masks else {})
        dtypes = {"tokens": self.dtype, MASK_EXT: np.uint8}
        self.builders = {
            (s, kind): IndexedDatasetBuilder(f"{self.tmp[s]}{suffix}.bin", dtype=dtypes[kind])
            for kind, suffix in self.suffixes.items()
            for s in self.splits
        }
        self.counts = {s: Counter() for s in self.splits}
        self.sources: list[dict[str, Any]] = []
        self.empty = 0
        self.skipped: Counter = Counter()

    def split_of(self, index: int) -> str:
        """``valid`` if document (or row) ``index`` of this shard is held out, else ``train``."""
        return "valid" if is_valid(self.name, index, self.valid_fraction) else "train"

    def add(self, split: str, ids: list[int], mask: list[int] | None = None) -> None:
        """One document (and, chat, its mask) into ``split``'s datasets."""
        import numpy as np

        self.builders[split, "tokens"].add_document(np.asarray(ids, dtype=self.dtype), [len(ids)])
        if mask is not None:
            self.builders[split, MASK_EXT].add_document(
                np.asarray(mask, dtype=np.uint8), [len(mask)]
            )
        self.counts[split]["documents"] += 1
        self.counts[split]["tokens"] += len(ids)

    def add_source(self, tally: SourceTally) -> None:
        """Count a read input file into the shard's stats."""
        self.sources.append(tally.entry())
        self.empty += tally.empty
        self.skipped.update(tally.skipped)

    @contextmanager
    def unfinished(self) -> Iterator[None]:
        """Leave nothing half-written: on any failure inside, close and remove the temporary files."""
        try:
            yield
        except BaseException:
            for (s, kind), builder in self.builders.items():
                discard(builder, Path(f"{self.tmp[s]}{self.suffixes[kind]}"))
            raise

    def finish(self, dropped_tokens: int = 0, **extra: Any) -> dict[str, Any]:
        """Publish every dataset and write the marker ``shards/NAME.json``; return the stats."""
        self.final_dir.mkdir(parents=True, exist_ok=True)
        stats = {
            "name": self.name,
            "outputs": [self._publish(s, kind) for s in self.splits for kind in self.suffixes],
            "sources": self.sources,
            "empty_documents": self.empty,
            "skipped": dict(self.skipped),
            "dropped_tokens": dropped_tokens,
        } | extra
        write_json(self.final_dir / f"{self.name}.json", stats)
        return stats

    def _publish(self, split: str, kind: str) -> dict[str, Any]:
        """One dataset moved into ``shards/``: its entry in the shard's ``outputs``."""
        prefix = f"{self.name}.{split}{self.suffixes[kind]}"
        entry: dict[str, Any] = {"split": split, "prefix": f"shards/{prefix}"}
        if self.masks:  # chat outputs say their kind; plain text's are all tokens
            entry["kind"] = kind
        tmp = Path(f"{self.tmp[split]}{self.suffixes[kind]}")
        return entry | {
            "documents": self.counts[split]["documents"],
            "tokens": self.counts[split]["tokens"],
            "files": publish(self.builders[split, kind], tmp, self.final_dir / prefix),
        }
