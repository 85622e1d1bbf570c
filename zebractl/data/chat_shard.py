"""One shard of chat data (``zebractl prepare --format chat``): conversations to tokens and masks.

Each record's ``messages`` (``--text-key``, default ``messages`` for chat) is checked by
:func:`zebractl.data.chat.parse_messages` (a bad record: exit 2 naming ``file:line``, or counted and
skipped with ``--skip-bad``), rendered by the template (``--chat-template``, chosen once by
:func:`zebractl.data.chat_template.resolve`; :func:`zebractl.data.chat.encode`: the mask is 1
exactly on the assistant turns' content and end-of-turn marker) and, with
``--seq-length``, cut to it by the ``--overlong`` policy (:func:`zebractl.data.chat.fit`). One
conversation is one document of ``shards/NAME.SPLIT.bin/.idx``; its mask, one uint8 per token, the
document of the same index in ``shards/NAME.SPLIT.mask.bin/.idx`` (the same Megatron indexed
format, the same document lengths), listed in the manifest's ``shards`` with ``kind: mask`` (the
token datasets: ``kind: tokens``; ``splits`` lists only those). The shard's stats add a ``chat``
count: conversations, assistant (masked) tokens, truncated and dropped conversations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zebractl.data import chat
from zebractl.data.shard_files import (
    MASK_EXT,
    RECORD_PROBLEMS,
    ShardWriter,
    SourceTally,
    skip_bad_record,
    whole_file,
)
from zebractl.data.sources import InputError, Source, records
from zebractl.errors import ConfigError

if TYPE_CHECKING:
    from zebractl.data.prepare import PrepareOptions, Shard


def tokenize_chat_shard(
    shard: Shard,
    opts: PrepareOptions,
    tok: Any,
    dtype_name: str,
    report: Callable[[int, int, int], None],
    template: Any,
) -> dict[str, Any]:
    """Tokenize one shard of chat records with ``template`` (a
    :class:`zebractl.data.chat_template.ChatTemplate`); return its stats (as
    :func:`zebractl.data.text_shard.tokenize_shard` does, plus ``chat``)."""
    renderer = template.renderer
    eos = tok.eos_id if opts.add_eos else None
    if opts.add_eos and eos is None:
        raise ConfigError(f"tokenizer {tok.source} has no EOS token; use --no-add-eos")
    writer = ShardWriter(opts.output, shard.name, opts.valid_fraction, dtype_name, masks=True)
    talks = _Conversations(opts, tok, renderer, eos, writer, report)
    with writer.unfinished():
        for src in shard.sources:
            writer.add_source(talks.read(src))
    return writer.finish(chat={k: int(v) for k, v in talks.counts.items()})


class _Conversations:
    """A chat shard's conversations: checked, rendered, fitted to ``seq_length`` by the overlong
    policy and written with their masks; ``counts``: conversations, truncated, dropped, masked."""

    def __init__(
        self,
        opts: PrepareOptions,
        tok: Any,
        renderer: Any,
        eos: int | None,
        writer: ShardWriter,
        report: Callable[[int, int, int], None],
    ) -> None:
        self.opts, self.tok, self.renderer, self.eos = opts, tok, renderer, eos
        self.writer, self.report = writer, report
        self.counts: Counter = Counter()
        self.index = 0  # conversations written so far (an index decides the split)

    def read(self, src: Source) -> SourceTally:
        """One input file's conversations (a bad record raises or is skipped); its counts."""
        tally = SourceTally(src)
        with whole_file(self.opts.skip_bad, tally.skipped):
            for item in records(src, self.opts.text_key):
                try:
                    messages, ids, mask = self._encode(item)
                except InputError as exc:
                    problems = RECORD_PROBLEMS + chat.PROBLEMS
                    skip_bad_record(exc, self.opts.skip_bad, problems, tally.skipped)
                    continue
                self._write(messages, ids, mask, tally)
        return tally

    def _encode(self, item: Any) -> tuple[list[chat.Message], list[int], list[int]]:
        """A record's messages, token ids and mask (an :class:`InputError` for a bad record)."""
        if isinstance(item, InputError):
            raise item
        value, where = item
        messages = chat.parse_messages({"messages": value}, where)
        ids, mask = chat.encode(messages, self.tok, self.renderer, self.eos, where)
        return messages, ids, mask

    def _write(
        self, messages: list[chat.Message], ids: list[int], mask: list[int], tally: SourceTally
    ) -> None:
        """One conversation, fitted to ``seq_length`` (or dropped), into its split; counted."""
        self.counts["conversations"] += 1
        if self.opts.seq_length:
            kept = chat.fit(ids, mask, self.opts.seq_length, self.opts.overlong)
            if kept is None:
                self.counts["dropped"] += 1
                return
            self.counts["truncated"] += len(kept[0]) < len(ids)
            ids, mask = kept
        split = self.writer.split_of(self.index)
        self.index += 1
        self.writer.add(split, ids, mask)
        self.counts["masked_tokens"] += sum(mask)
        tally.documents += 1
        tally.tokens += len(ids)
        self.report(1, len(ids), sum(len(m.content) for m in messages))


def manifest_section(
    opts: Any, shard_stats: list[dict[str, Any]], tokens: int, template: Any
) -> dict[str, Any]:
    """The manifest's ``chat`` section: the template, the policy and the counts of every shard."""
    total: Counter = Counter()
    for st in shard_stats:
        total.update(st.get("chat") or {})
    return {
        "template": template.describe(),
        "mask": f"PREFIX.{MASK_EXT}.bin/.idx: uint8 per token, 1 on assistant turns",
        "seq_length": opts.seq_length,
        "overlong": opts.overlong,
        "conversations": int(total["conversations"]),
        "truncated": int(total["truncated"]),
        "dropped": int(total["dropped"]),
        "masked_tokens": int(total["masked_tokens"]),
        "masked_fraction": round(total["masked_tokens"] / tokens, 6) if tokens else 0.0,
    }
