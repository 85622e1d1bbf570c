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
from pathlib import Path
from typing import Any

from zebractl.data import chat
from zebractl.data.sources import InputError, records

MASK_EXT = "mask"
"""The mask dataset of ``PREFIX`` is ``PREFIX.mask.bin/.idx``."""


def tokenize_chat_shard(
    shard: Any,
    opts: Any,
    tok: Any,
    dtype_name: str,
    report: Callable[[int, int, int], None],
    template: Any,
) -> dict[str, Any]:
    """Tokenize one shard of chat records with ``template`` (a
    :class:`zebractl.data.chat_template.ChatTemplate`); return its stats (as
    :func:`zebractl.data.prepare.tokenize_shard` does, plus ``chat``)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from zebractl.data.shard_files import RECORD_PROBLEMS, discard, is_valid, publish, write_json
    from zebractl.util import sha256_file

    out = Path(opts.output)
    tmp_dir, final_dir = out / ".tmp", out / "shards"
    dtype = np.dtype(dtype_name).type
    renderer = template.renderer
    eos = tok.eos_id if opts.add_eos else None
    if opts.add_eos and eos is None:
        from zebractl.errors import ConfigError

        raise ConfigError(f"tokenizer {tok.source} has no EOS token; use --no-add-eos")
    splits = ["train", "valid"] if opts.valid_fraction > 0 else ["train"]
    tmp = {s: tmp_dir / f"{shard.name}.{s}" for s in splits}
    tokens_b = {s: IndexedDatasetBuilder(f"{tmp[s]}.bin", dtype=dtype) for s in splits}
    masks_b = {s: IndexedDatasetBuilder(f"{tmp[s]}.{MASK_EXT}.bin", dtype=np.uint8) for s in splits}
    counts = {s: Counter() for s in splits}
    talk: Counter = Counter()
    skipped: Counter = Counter()
    per_source: list[dict[str, Any]] = []
    try:
        index = 0
        for src in shard.sources:
            src_docs = src_tokens = 0
            src_skipped: Counter = Counter()
            try:
                for item in records(src, opts.text_key):
                    try:
                        if isinstance(item, InputError):
                            raise item
                        value, where = item
                        messages = chat.parse_messages({"messages": value}, where)
                        ids, mask = chat.encode(messages, tok, renderer, eos, where)
                    except InputError as exc:
                        if not opts.skip_bad or exc.reason not in RECORD_PROBLEMS + chat.PROBLEMS:
                            raise
                        src_skipped[exc.reason] += 1
                        continue
                    talk["conversations"] += 1
                    if opts.seq_length:
                        kept = chat.fit(ids, mask, opts.seq_length, opts.overlong)
                        if kept is None:
                            talk["dropped"] += 1
                            continue
                        talk["truncated"] += len(kept[0]) < len(ids)
                        ids, mask = kept
                    split = "valid" if is_valid(shard.name, index, opts.valid_fraction) else "train"
                    index += 1
                    tokens_b[split].add_document(np.asarray(ids, dtype=dtype), [len(ids)])
                    masks_b[split].add_document(np.asarray(mask, dtype=np.uint8), [len(mask)])
                    counts[split]["documents"] += 1
                    counts[split]["tokens"] += len(ids)
                    talk["masked_tokens"] += sum(mask)
                    src_docs += 1
                    src_tokens += len(ids)
                    report(1, len(ids), sum(len(m.content) for m in messages))
            except InputError as exc:
                if not opts.skip_bad:
                    raise
                src_skipped[exc.reason] += 1  # the whole file could not be read
            per_source.append(
                {
                    "path": src.path,
                    "size": src.size,
                    "sha256": sha256_file(Path(src.path)),
                    "documents": src_docs,
                    "tokens": src_tokens,
                    "empty_documents": 0,
                    "skipped": dict(src_skipped),
                }
            )
            skipped.update(src_skipped)
    except BaseException:
        for s in splits:
            discard(tokens_b[s], tmp[s])
            discard(masks_b[s], Path(f"{tmp[s]}.{MASK_EXT}"))
        raise

    final_dir.mkdir(parents=True, exist_ok=True)
    outputs = []
    for s in splits:
        for kind, suffix, builder in (
            ("tokens", "", tokens_b[s]),
            (MASK_EXT, f".{MASK_EXT}", masks_b[s]),
        ):
            final = final_dir / f"{shard.name}.{s}{suffix}"
            outputs.append(
                {
                    "split": s,
                    "prefix": f"shards/{shard.name}.{s}{suffix}",
                    "kind": kind,
                    "documents": counts[s]["documents"],
                    "tokens": counts[s]["tokens"],
                    "files": publish(builder, Path(f"{tmp[s]}{suffix}"), final),
                }
            )
    stats = {
        "name": shard.name,
        "outputs": outputs,
        "sources": per_source,
        "empty_documents": 0,
        "skipped": dict(skipped),
        "dropped_tokens": 0,
        "chat": {k: int(v) for k, v in talk.items()},
    }
    write_json(final_dir / f"{shard.name}.json", stats)
    return stats


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
