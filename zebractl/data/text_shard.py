"""One shard of plain text (``zebractl prepare``, ``--format text``): documents to tokens.

The shard's files are read in order (:func:`zebractl.data.sources.documents`; a bad record: exit 2
naming ``file:line``, or counted and skipped with ``--skip-bad``; an empty document is counted, not
written), encoded ``ENCODE_BATCH`` documents per tokenizer call and written one per document of
``shards/NAME.SPLIT.bin/.idx`` with BOS/EOS as the options say, or, ``fla_aligned``, packed as FLA's
preprocessing packs them: consecutive batches of ``FLA_MAP_BATCH`` documents cut into rows of
exactly ``seq_length`` tokens, each batch's remainder dropped (and counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zebractl.data.shard_files import (
    RECORD_PROBLEMS,
    ShardWriter,
    SourceTally,
    skip_bad_record,
    whole_file,
)
from zebractl.data.sources import InputError, Source, documents
from zebractl.errors import ConfigError

if TYPE_CHECKING:
    from zebractl.data.prepare import PrepareOptions, Shard

FLA_MAP_BATCH = 2048  # documents per batch in FLA's legacy preprocess (datasets.map)
ENCODE_BATCH = 256  # documents per tokenizer call

Report = Callable[[int, int, int], None]


def tokenize_shard(
    shard: Shard,
    opts: PrepareOptions,
    tok: Any,
    dtype_name: str,
    report: Report,
) -> dict[str, Any]:
    """Tokenize one shard into ``shards/NAME.SPLIT.bin/.idx`` and write its marker; return stats."""
    markers = _markers(opts, tok)  # before any file is opened: a refusal leaves nothing behind
    writer = ShardWriter(opts.output, shard.name, opts.valid_fraction, dtype_name)
    docs = _Documents(opts, writer, *markers)
    with writer.unfinished():
        for src in shard.sources:
            writer.add_source(_read_source(src, opts, tok, docs, report))
        docs.finish()
    return writer.finish(dropped_tokens=docs.dropped)


def _markers(opts: PrepareOptions, tok: Any) -> tuple[list[int], list[int]]:
    """The BOS and the EOS put around every document (empty where the options add none)."""
    bos = [tok.bos_id] if opts.add_bos and tok.bos_id is not None else []
    eos = [tok.eos_id] if opts.add_eos and tok.eos_id is not None else []
    missing = [
        (name, flag)
        for name, flag, asked, tid in (
            ("BOS", "--no-add-bos", opts.add_bos, tok.bos_id),
            ("EOS", "--no-add-eos", opts.add_eos, tok.eos_id),
        )
        if asked and tid is None
    ]
    if missing:
        raise ConfigError(
            f"tokenizer {tok.source} has no {' and no '.join(n for n, _ in missing)} token; use "
            f"{' and '.join(f for _, f in missing)}"
        )
    return bos, eos


def _read_source(
    src: Source, opts: PrepareOptions, tok: Any, docs: _Documents, report: Report
) -> SourceTally:
    """One input file's documents, encoded in batches of ``ENCODE_BATCH`` into ``docs``; its counts."""
    tally = SourceTally(src)
    batch = _Batch()
    with whole_file(opts.skip_bad, tally.skipped):
        for text, _where in _checked(documents(src, opts.text_key), opts.skip_bad, tally.skipped):
            if not text.strip():
                tally.empty += 1
                continue
            batch.add(text, docs.next_index())
            tally.documents += 1
            if len(batch.texts) >= ENCODE_BATCH:
                tally.tokens += batch.encode(tok, docs, report)
    tally.tokens += batch.encode(tok, docs, report)
    return tally


def _checked(docs: Iterable[Any], skip_bad: bool, skipped: Counter) -> Iterator[tuple[str, str]]:
    """Pass documents through; a bad record raises, or with skip_bad is counted and skipped (the
    rest of its file is still read). Whole-file problems raise from ``docs`` itself."""
    for item in docs:
        if isinstance(item, InputError):
            skip_bad_record(item, skip_bad, RECORD_PROBLEMS, skipped)
            continue
        yield item


@dataclass
class _Batch:
    """Documents waiting for one tokenizer call: their texts, indices and characters."""

    texts: list[str] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    chars: int = 0

    def add(self, text: str, index: int) -> None:
        """One more document."""
        self.texts.append(text)
        self.chars += len(text)
        self.indices.append(index)

    def encode(self, tok: Any, docs: _Documents, report: Report) -> int:
        """Encode the documents into ``docs``, report them and start anew; return the tokens."""
        tokens = docs.add(tok.encode_batch(self.texts), self.indices) if self.texts else 0
        report(len(self.texts), tokens, self.chars)
        self.texts, self.indices, self.chars = [], [], 0
        return tokens


class _Documents:
    """Where encoded documents go: each its own document of the shard, or (``fla_aligned``) FLA's
    rows of exactly ``seq_length`` tokens, cut from each batch of ``FLA_MAP_BATCH`` documents."""

    def __init__(
        self, opts: PrepareOptions, writer: ShardWriter, bos: list[int], eos: list[int]
    ) -> None:
        self.opts, self.writer, self.bos, self.eos = opts, writer, bos, eos
        self.count = 0  # documents so far (a document's index decides its split)
        self.row_buffer: list[int] = []  # fla_aligned: the tokens of this batch's documents
        self.docs_in_batch = 0
        self.row_index = 0  # fla_aligned: rows so far (a row's index decides its split)
        self.dropped = 0  # fla_aligned: tokens of the batches' remainders

    def next_index(self) -> int:
        """The index of a new document."""
        self.count += 1
        return self.count - 1

    def add(self, ids_batch: list[list[int]], indices: list[int]) -> int:
        """Write encoded documents (of these indices) with BOS/EOS; return their token count."""
        written = 0
        for ids, index in zip(ids_batch, indices, strict=True):
            doc = self.bos + ids + self.eos
            if self.opts.fla_aligned:
                self.row_buffer.extend(doc)
                self.docs_in_batch += 1
                if self.docs_in_batch == FLA_MAP_BATCH:
                    self._flush_rows()
            else:
                self.writer.add(self.writer.split_of(index), doc)
            written += len(doc)
        return written

    def finish(self) -> None:
        """Cut the last (partial) batch into rows."""
        if self.opts.fla_aligned and self.row_buffer:
            self._flush_rows()

    def _flush_rows(self) -> None:
        """Write this batch's full rows, drop its remainder and start a new batch."""
        n = self.opts.seq_length or 0
        full = len(self.row_buffer) // n
        for r in range(full):
            self.writer.add(
                self.writer.split_of(self.row_index), self.row_buffer[r * n : (r + 1) * n]
            )
            self.row_index += 1
        self.dropped += len(self.row_buffer) - full * n
        self.row_buffer, self.docs_in_batch = [], 0
