"""``zebractl prepare --json`` and ``--verify``: the dataset manifest and what was checked."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import FiniteFloat

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report, Split

# ---- zebractl prepare ------------------------------------------------------------------------------


class ManifestTokenizer(StrictModel):
    """The tokenizer a dataset was made with."""

    kind: Literal["hf", "sentencepiece"]
    """Hugging Face ``tokenizers`` or SentencePiece."""
    source: str
    """Where it was loaded from (as given to --tokenizer)."""
    fingerprint: str
    """sha256 of the canonical tokenizer content."""
    vocab_size: int
    """Vocabulary size, added tokens included; every token id is below it."""
    bos_id: int | None
    """BOS token id; null when the tokenizer has none."""
    eos_id: int | None
    """EOS token id; null when the tokenizer has none."""
    path: str
    """The saved copy, relative to the dataset folder."""


class ManifestOptions(StrictModel):
    """The options that define the dataset (a resume must repeat them)."""

    text_key: str
    """Record field holding the text."""
    add_bos: bool
    """BOS before each document."""
    add_eos: bool
    """EOS after each document."""
    fla_aligned: bool
    """FLA's preprocessing: documents concatenated and cut into rows of seq_length."""
    seq_length: int | None
    """Row length with fla_aligned; null otherwise."""
    valid_fraction: FiniteFloat
    """Fraction of documents (rows with fla_aligned) held out as the 'valid' split."""
    skip_bad: bool
    """Malformed records were skipped and counted instead of stopping."""
    shard_bytes: int
    """Input bytes per shard (about)."""
    format: Literal["chat"] | None = None
    """chat: conversations with loss masks (absent for text)."""
    chat_template: str | None = None
    """chat: --chat-template as given: auto, a built-in name or a Jinja file (chat.template
    records the one used)."""
    overlong: Literal["truncate", "drop"] | None = None
    """chat: what happened to a conversation longer than seq_length."""


class SplitTotals(StrictModel):
    """Totals of one split."""

    documents: int
    """Documents (rows with fla_aligned)."""
    tokens: int
    """Tokens."""


class ManifestTotals(StrictModel):
    """Totals over every shard."""

    documents: int
    """Documents written (rows with fla_aligned)."""
    tokens: int
    """Tokens written."""
    empty_documents: int
    """Empty or whitespace-only documents skipped."""
    skipped: dict[str, int]
    """Bad records skipped with --skip-bad, by reason (e.g. malformed_json)."""
    dropped_tokens: int
    """Tokens dropped as row remainders (fla_aligned)."""
    by_split: dict[Split, SplitTotals]
    """Documents and tokens per split."""


class FileDigest(StrictModel):
    """Size and checksum of one file."""

    bytes: int
    """Size in bytes."""
    sha256: str
    """sha256 of the content, hex."""


class ShardFiles(StrictModel):
    """The two files of one megatron indexed dataset."""

    bin: FileDigest
    """The token data (.bin)."""
    idx: FileDigest
    """The index (.idx)."""


class ManifestShard(StrictModel):
    """One megatron indexed dataset (one shard, one split)."""

    split: Split
    """Which split it belongs to."""
    prefix: str
    """Path prefix relative to the dataset folder (add .bin / .idx)."""
    kind: Literal["tokens", "mask"] = "tokens"
    """tokens: token ids; mask (chat data): one uint8 loss-mask value per token of the tokens
    dataset of the same split and shard (PREFIX.mask)."""
    documents: int
    """Documents (rows with fla_aligned)."""
    tokens: int
    """Tokens."""
    files: ShardFiles
    """Sizes and checksums of its files."""


class ManifestSource(StrictModel):
    """One input file."""

    path: str
    """The file."""
    size: int
    """Size in bytes."""
    sha256: str
    """sha256 of the content, hex."""
    documents: int
    """Non-empty documents read from it."""
    tokens: int
    """Tokens they produced (with BOS/EOS)."""
    empty_documents: int
    """Empty documents skipped."""
    skipped: dict[str, int]
    """Bad records skipped, by reason."""


class ManifestRun(StrictModel):
    """Facts about the run that wrote the manifest (not about the data)."""

    seconds: FiniteFloat
    """Wall time of this run."""
    shards_resumed: int
    """Shards found finished from an earlier, interrupted run."""
    tokens_this_run: int
    """Tokens tokenized by this run."""


class ManifestChatTemplate(StrictModel):
    """The chat template a dataset's conversations were rendered with."""

    name: str
    """A built-in's name (e.g. chatml), the Jinja file given, or the tokenizer file the template
    was read from (chat_template.jinja or tokenizer_config.json)."""
    source: Literal["builtin", "file", "tokenizer"]
    """builtin: zebractl's own; file: --chat-template FILE; tokenizer: the tokenizer's own."""
    sha256: str
    """sha256 of the template's text (UTF-8), hex; a built-in's text is its Jinja equivalent."""
    reason: str
    """Why this template (e.g. auto: the tokenizer has no chat template of its own)."""
    text: str
    """The template's Jinja text."""


class ManifestChat(StrictModel):
    """What `prepare --format chat` did with the conversations."""

    template: ManifestChatTemplate
    """The template the turns were rendered with."""
    mask: str
    """Where the loss masks are."""
    seq_length: int | None
    """The longest conversation kept (null: no limit)."""
    overlong: Literal["truncate", "drop"]
    """What happened to a longer one."""
    conversations: int
    """Valid conversations read."""
    truncated: int
    """Conversations cut to seq_length."""
    dropped: int
    """Conversations dropped (too long under drop, or no assistant token left after the cut)."""
    masked_tokens: int
    """Tokens trained on (assistant content and end-of-turn markers)."""
    masked_fraction: FiniteFloat
    """masked_tokens / tokens."""


class Manifest(StrictModel):
    """``DIR/manifest.json`` of a prepared dataset: totals, per-shard and per-source facts."""

    schema_version: Literal[1]
    """Layout version of manifest.json."""
    zebractl_version: str
    """zebractl version that wrote it."""
    created: str
    """When it was written, UTC, ISO 8601 (YYYY-MM-DDTHH:MM:SSZ)."""
    tokenizer: ManifestTokenizer
    """The tokenizer used."""
    dtype: str
    """numpy dtype of the token ids (uint16 or int32)."""
    options: ManifestOptions
    """The options that define the dataset."""
    totals: ManifestTotals
    """Totals over every shard."""
    splits: dict[Split, list[str]]
    """Path prefixes of each split's indexed datasets, in order."""
    shards: list[ManifestShard]
    """Every indexed dataset, in order."""
    sources: list[ManifestSource]
    """Every input file, in order."""
    run: ManifestRun
    """Facts about this run."""
    chat: ManifestChat | None = None
    """chat data: the template, the overlong policy and the counts."""


class PrepareReport(Report):
    """``zebractl prepare ... --json``: the dataset folder and its manifest."""

    command: ClassVar[str] = "prepare"

    output: str
    """The dataset folder."""
    manifest: Manifest
    """Its manifest.json."""


class VerifyChecked(StrictModel):
    """What ``prepare --verify`` read."""

    outputs: int
    """Indexed datasets (shard files) listed in the manifest."""
    documents: int
    """Documents found in the indexes."""
    tokens: int
    """Tokens found in the indexes."""
    max_token_id: int
    """Largest token id read; -1 when no tokens were read."""
    vocab_size: int
    """The tokenizer's vocabulary size from the manifest."""
    dtype: str
    """numpy dtype of the token ids."""


class VerifyReport(Report):
    """``zebractl prepare --verify DIR --json``: a prepared dataset checked against its manifest."""

    command: ClassVar[str] = "prepare --verify"

    folder: str
    """The dataset folder."""
    ok: bool
    """Whether everything matched (exit 0); otherwise the exit code is 3."""
    problems: list[str]
    """One line per mismatch; empty when ok."""
    checked: VerifyChecked
    """What was read."""
