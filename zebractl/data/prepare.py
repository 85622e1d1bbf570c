"""``zebractl prepare``: corpora -> tokenizer -> megatron-core indexed datasets, resumable.

Output folder::

    DIR/job.json                 what is being prepared (inputs, options, tokenizer fingerprint;
                                 chat: the chat template's name, source and sha256)
    DIR/tokenizer/               the exact tokenizer used (tokenizer.json or .model + config)
    DIR/shards/NAME.SPLIT.bin/.idx   one megatron IndexedDataset per shard and split
    DIR/shards/NAME.json         a finished shard's statistics (written last: its marker)
    DIR/manifest.json            totals, per-source and per-shard facts (written when all are done)

Inputs are grouped in order into shards (about ``shard_bytes`` of input each, at least one per worker
where the inputs allow); each shard is tokenized by one worker process and written under a temporary
name, then renamed. A killed run restarted with the same arguments skips finished shards; a shard is
finished only when its marker exists and its files have the recorded sizes, so nothing half-written
ever looks complete.

Policies: by default every document ends with EOS (megatron's ``--append-eod``) and gets no BOS.
``fla_aligned`` reproduces FLA's preprocessing for parity runs: BOS before every document, no EOS,
documents concatenated in consecutive batches of 2048 and cut into rows of exactly ``seq_length``
tokens (each row one sequence of the indexed dataset), each batch's remainder dropped.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zebractl import __version__
from zebractl.data.shard_files import write_json
from zebractl.data.sources import Source, expand_inputs
from zebractl.data.text_shard import tokenize_shard
from zebractl.errors import ConfigError

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class PrepareOptions:
    """Everything that determines the output (and so must match when resuming)."""

    inputs: tuple[str, ...]
    tokenizer: str
    output: str
    text_key: str = "text"
    add_bos: bool = False
    add_eos: bool = True
    fla_aligned: bool = False
    seq_length: int | None = None
    valid_fraction: float = 0.0
    skip_bad: bool = False
    shard_bytes: int = 256 * 2**20
    format: str = "text"
    """text: one document per record; chat: a conversation per record with its loss mask."""
    chat_template: str = "auto"
    """chat: auto (the tokenizer's own, else chatml), a built-in name or a Jinja file."""
    overlong: str = "truncate"
    """chat with --seq-length: a longer conversation is truncated or dropped."""

    def identity(self) -> dict[str, Any]:
        """Options that define the dataset (the worker count and output path do not; the chat
        options only for chat data, so a text dataset's identity is what it always was)."""
        d = asdict(self)
        for key in ("inputs", "tokenizer", "output"):
            d.pop(key)
        if self.format == "text":
            for key in ("format", "chat_template", "overlong"):
                d.pop(key)
        return d


@dataclass
class Shard:
    """A group of sources tokenized together by one worker."""

    name: str
    sources: list[Source]

    @property
    def size(self) -> int:
        """Input bytes."""
        return sum(s.size for s in self.sources)


@dataclass
class Progress:
    """Running totals reported by workers."""

    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    total_bytes: int = 0
    started: float = field(default_factory=time.time)


def validate_options(opts: PrepareOptions) -> None:
    """Reject contradictory options (exit 2)."""
    if opts.format not in ("text", "chat"):
        raise ConfigError(f"--format must be text or chat, got {opts.format!r}")
    if opts.format == "chat":
        if opts.fla_aligned:
            raise ConfigError(
                "--fla-aligned packs plain text; chat data keeps one conversation per row"
            )
        if opts.overlong not in ("truncate", "drop"):
            raise ConfigError(f"--overlong must be truncate or drop, got {opts.overlong!r}")
        if opts.seq_length is not None and opts.seq_length < 2:
            raise ConfigError(f"--seq-length must be at least 2, got {opts.seq_length}")
    elif opts.fla_aligned:
        if not opts.seq_length:
            raise ConfigError(
                "--fla-aligned needs --seq-length (FLA cuts rows of exactly that "
                "many tokens, e.g. 2048)"
            )
        if opts.add_eos or not opts.add_bos:
            raise ConfigError(
                "--fla-aligned means BOS per document and no EOS; drop --add-eos/--no-add-bos"
            )
    elif opts.seq_length is not None:
        raise ConfigError(
            "--seq-length only applies with --fla-aligned or --format chat (otherwise the "
            "training recipe's data.seq_length decides)"
        )
    if not 0 <= opts.valid_fraction < 1:
        raise ConfigError(f"--valid-fraction must be in [0, 1), got {opts.valid_fraction}")
    if opts.shard_bytes <= 0:
        raise ConfigError("--shard-size must be positive")
    out = Path(opts.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out}: exists and is not a folder; choose a new --output")


def plan_shards(sources: list[Source], shard_bytes: int, workers: int) -> list[Shard]:
    """Group sources, in order, into shards of about ``shard_bytes`` (smaller to feed every worker)."""
    total = sum(s.size for s in sources)
    target = max(1, min(shard_bytes, -(-total // max(1, workers))))
    shards: list[Shard] = []
    current: list[Source] = []
    size = 0
    for src in sources:
        if current and size + src.size > target:
            shards.append(Shard(f"shard-{len(shards):05d}", current))
            current, size = [], 0
        current.append(src)
        size += src.size
    if current:
        shards.append(Shard(f"shard-{len(shards):05d}", current))
    return shards


# ---- the worker --------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _worker_init(tokenizer_dir: str, queue: Any) -> None:
    """Set up a worker: one core, the tokenizer, the queue its progress goes to (None: none)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one worker = one core
    if "tokenizer" not in _WORKER:  # forked workers inherit the parent's; spawned ones load it
        from zebractl.data.tokenizer import load_tokenizer

        _WORKER["tokenizer"] = load_tokenizer(tokenizer_dir)
    _WORKER["queue"] = queue


def _worker_run(args: tuple[Shard, PrepareOptions, str, Any]) -> dict[str, Any]:
    """Tokenize one shard in a worker, its progress put on the worker's queue."""
    shard, opts, dtype_name, template = args
    queue = _WORKER.get("queue")

    def report(docs: int, tokens: int, nbytes: int) -> None:
        if queue is not None:
            queue.put((docs, tokens, nbytes))

    return tokenize(shard, opts, _WORKER["tokenizer"], dtype_name, report, template)


def tokenize(
    shard: Shard,
    opts: PrepareOptions,
    tok: Any,
    dtype_name: str,
    report: Callable[[int, int, int], None],
    template: Any = None,
) -> dict[str, Any]:
    """One shard, as its format says (:func:`zebractl.data.text_shard.tokenize_shard`, or the chat
    one with ``template``, the :class:`zebractl.data.chat_template.ChatTemplate` chosen once for
    the whole run)."""
    if opts.format == "chat":
        from zebractl.data.chat_shard import tokenize_chat_shard

        return tokenize_chat_shard(shard, opts, tok, dtype_name, report, template)
    return tokenize_shard(shard, opts, tok, dtype_name, report)


# ---- orchestration -----------------------------------------------------------------------------


def _shard_done(out: Path, shard: Shard) -> dict[str, Any] | None:
    """A finished shard's stats: its marker exists and its files have the recorded sizes; else None."""
    marker = out / "shards" / f"{shard.name}.json"
    if not marker.is_file():
        return None
    try:
        stats = json.loads(marker.read_text(encoding="utf-8"))
    except ValueError:
        return None
    for o in stats.get("outputs", []):
        for ext, meta in o["files"].items():
            path = out / f"{o['prefix']}.{ext}"
            if not path.is_file() or path.stat().st_size != meta["bytes"]:
                return None
    return stats


def prepare(
    opts: PrepareOptions, workers: int = 1, on_progress: Callable[[Progress], None] | None = None
) -> dict[str, Any]:
    """Run (or resume) a preparation; return the manifest."""
    validate_options(opts)
    from zebractl.data.tokenizer import load_tokenizer

    out = Path(opts.output)
    sources = expand_inputs(list(opts.inputs))
    tok = load_tokenizer(opts.tokenizer)
    dtype = _token_dtype(tok.vocab_size)
    template = _chat_template(opts, tok)
    job = _job(opts, tok, dtype, sources, template)
    shards = _shard_layout(out, job, sources, opts.shard_bytes, workers)
    _start_output(out, job, shards, tok)
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for sh in shards:
        done = _shard_done(out, sh)
        if done is not None:
            results[sh.name] = done
        else:
            todo.append(sh)
    update = _progress(sum(sh.size for sh in todo), on_progress)
    started = time.time()
    if todo:
        results |= _tokenize_all(todo, opts, tok, dtype, workers, update, template)
    manifest = _manifest(
        opts,
        tok,
        dtype,
        [results[sh.name] for sh in shards],
        out,
        time.time() - started,
        fresh={sh.name for sh in todo},
        template=template,
    )
    _refuse_empty(manifest["totals"], sources, manifest.get("chat"))
    write_json(out / "manifest.json", manifest)
    if not any((out / ".tmp").iterdir()):
        (out / ".tmp").rmdir()
    return manifest


def _token_dtype(vocab_size: int) -> str:
    """The smallest numpy dtype that holds every token id (megatron's choice)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType

    return np.dtype(DType.optimal_dtype(vocab_size)).name


def _chat_template(opts: PrepareOptions, tok: Any) -> Any:
    """Chat data's template, chosen (and a Jinja file checked) once, before any record; else None."""
    if opts.format != "chat":
        return None
    from zebractl.data.chat_template import resolve

    return resolve(opts.chat_template, tok)


def _job(
    opts: PrepareOptions, tok: Any, dtype: str, sources: list[Source], template: Any
) -> dict[str, Any]:
    """What is being prepared (``job.json``, less its shards): what a resumed run must match."""
    job = {
        "zebractl_version": __version__,
        "tokenizer": tok.describe(),
        "dtype": dtype,
        "options": opts.identity(),
        "sources": [
            {"path": s.path, "size": s.size, "mtime_ns": Path(s.path).stat().st_mtime_ns}
            for s in sources
        ],
    }
    if template is not None:
        job["chat_template"] = template.identity()
    return job


def _shard_layout(
    out: Path, job: dict[str, Any], sources: list[Source], shard_bytes: int, workers: int
) -> list[Shard]:
    """The shards: as first planned for this output (whatever --workers is now), else a new plan."""
    job_path = out / "job.json"
    if not job_path.is_file():
        return plan_shards(sources, shard_bytes, workers)
    old = json.loads(job_path.read_text(encoding="utf-8"))
    _check_same_job(out, old, job)
    by_path = {s.path: s for s in sources}
    return [Shard(sh["name"], [by_path[p] for p in sh["sources"]]) for sh in old["shards"]]


def _check_same_job(out: Path, old: dict[str, Any], job: dict[str, Any]) -> None:
    """Refuse to resume ``out`` with another tokenizer, chat template, inputs or options."""
    was_tok = old.get("tokenizer", {})
    if was_tok.get("fingerprint") != job["tokenizer"]["fingerprint"]:
        raise ConfigError(
            f"{out} was prepared with another tokenizer "
            f"({was_tok.get('source')}, fingerprint "
            f"{str(was_tok.get('fingerprint'))[:12]}); refusing "
            "to mix tokenizations: choose a new --output"
        )
    if "chat_template" in job and old.get("chat_template") != job["chat_template"]:
        was, now = old.get("chat_template") or {}, job["chat_template"]
        raise ConfigError(
            f"{out} was prepared with another chat template ({was.get('name')}, sha256 "
            f"{str(was.get('sha256'))[:12]}; now {now['name']}, sha256 "
            f"{now['sha256'][:12]}); refusing to mix renderings: choose a new --output"
        )
    keys = ("dtype", "options", "sources")
    if {k: old.get(k) for k in keys} != {k: job[k] for k in keys}:
        raise ConfigError(
            f"{out} holds a preparation of other inputs or options; resume only "
            "with the same arguments, or choose a new --output"
        )


def _start_output(out: Path, job: dict[str, Any], shards: list[Shard], tok: Any) -> None:
    """The output folder, its ``.tmp/``, ``job.json`` (on the first run) and the tokenizer copy."""
    out.mkdir(parents=True, exist_ok=True)
    (out / ".tmp").mkdir(exist_ok=True)
    job_path = out / "job.json"
    if not job_path.is_file():
        layout = [{"name": sh.name, "sources": [s.path for s in sh.sources]} for sh in shards]
        write_json(job_path, job | {"shards": layout})
    tok.save(out / "tokenizer")


def _progress(
    total_bytes: int, on_progress: Callable[[Progress], None] | None
) -> Callable[[int, int, int], None]:
    """A report function for the workers: adds their counts to a :class:`Progress`, shown."""
    progress = Progress(total_bytes=total_bytes)

    def update(docs: int, tokens: int, nbytes: int) -> None:
        progress.documents += docs
        progress.tokens += tokens
        progress.bytes += nbytes
        if on_progress:
            on_progress(progress)

    return update


def _tokenize_all(
    todo: list[Shard],
    opts: PrepareOptions,
    tok: Any,
    dtype: str,
    workers: int,
    update: Callable[[int, int, int], None],
    template: Any,
) -> dict[str, dict[str, Any]]:
    """Tokenize the shards not yet done, here or in a pool of workers; their stats by name."""
    out = Path(opts.output)
    _WORKER["tokenizer"] = tok
    if workers > 1 and len(todo) > 1:
        return _run_pool(todo, opts, dtype, workers, out, update, template)
    _worker_init(str(out / "tokenizer"), None)
    return {
        sh.name: tokenize(sh, opts, _WORKER["tokenizer"], dtype, update, template) for sh in todo
    }


def _refuse_empty(
    totals: dict[str, Any], sources: list[Source], chat: dict[str, Any] | None = None
) -> None:
    """No token at all is a usage error naming the inputs (exit 2) and why: conversations the
    over-long policy dropped, or records skipped and documents empty."""
    if totals["tokens"] != 0:
        return
    files = (
        f"{', '.join(s.path for s in sources[:3])}{' ...' if len(sources) > 3 else ''}: "
        f"{len(sources)} file(s) read"
    )
    if chat and chat.get("dropped"):
        raise ConfigError(
            f"no conversations left in {files}: all {chat['dropped']} of "
            f"{chat['conversations']} were dropped by --overlong drop (longer than --seq-length "
            f"{chat['seq_length']} tokens); nothing to prepare (raise --seq-length, or "
            "--overlong truncate to keep their beginnings)"
        )
    skipped = sum(totals["skipped"].values())
    raise ConfigError(
        f"no documents in {files}, {totals['empty_documents']} empty document(s), {skipped} "
        "record(s) skipped; nothing to prepare (check --text-key and the input files)"
    )


def _run_pool(
    todo: list[Shard],
    opts: PrepareOptions,
    dtype: str,
    workers: int,
    out: Path,
    update: Callable[[int, int, int], None],
    template: Any = None,
) -> dict[str, dict[str, Any]]:
    """Tokenize ``todo`` in a pool of workers, passing their progress on; their stats by name."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()  # handed to workers at their creation (initargs), so a plain queue works
    results: dict[str, dict[str, Any]] = {}
    with ctx.Pool(
        min(workers, len(todo)), initializer=_worker_init, initargs=(str(out / "tokenizer"), q)
    ) as pool:
        pending = pool.imap_unordered(_worker_run, [(sh, opts, dtype, template) for sh in todo])
        remaining = len(todo)
        while remaining:
            try:
                while True:
                    update(*q.get_nowait())
            except queue_mod.Empty:
                pass
            try:
                stats = pending.next(timeout=0.2)
            except mp.TimeoutError:
                continue
            results[stats["name"]] = stats
            remaining -= 1
        try:
            while True:
                update(*q.get_nowait())
        except queue_mod.Empty:
            pass
    return results


def _manifest(
    opts: PrepareOptions,
    tok: Any,
    dtype: str,
    shard_stats: list[dict[str, Any]],
    out: Path,
    seconds: float,
    fresh: set[str],
    template: Any = None,
) -> dict[str, Any]:
    """The manifest: totals, splits, every shard output and source, and this run's facts."""
    skipped: Counter = Counter()
    outputs, sources = [], []
    for st in shard_stats:
        skipped.update(st["skipped"])
        outputs.extend(st["outputs"])
        sources.extend(st["sources"])
    splits: dict[str, list[str]] = {}
    data = [o for o in outputs if o.get("kind", "tokens") == "tokens"]  # chat: masks beside them
    for o in data:
        splits.setdefault(o["split"], []).append(o["prefix"])
    totals = {
        "documents": sum(o["documents"] for o in data),
        "tokens": sum(o["tokens"] for o in data),
        "empty_documents": sum(st["empty_documents"] for st in shard_stats),
        "skipped": dict(skipped),
        "dropped_tokens": sum(st["dropped_tokens"] for st in shard_stats),
        "by_split": {
            s: {
                "documents": sum(o["documents"] for o in data if o["split"] == s),
                "tokens": sum(o["tokens"] for o in data if o["split"] == s),
            }
            for s in splits
        },
    }
    extra = {}
    if opts.format == "chat":
        from zebractl.data.chat_shard import manifest_section

        extra["chat"] = manifest_section(opts, shard_stats, totals["tokens"], template)
    return extra | {
        "schema_version": MANIFEST_VERSION,
        "zebractl_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokenizer": tok.describe() | {"path": "tokenizer"},
        "dtype": dtype,
        "options": opts.identity(),
        "totals": totals,
        "splits": splits,
        "shards": outputs,
        "sources": sources,
        "run": {
            "seconds": round(seconds, 2),
            "shards_resumed": len(shard_stats) - len(fresh),
            "tokens_this_run": sum(
                o["tokens"]
                for st in shard_stats
                if st["name"] in fresh
                for o in st["outputs"]
                if o.get("kind", "tokens") == "tokens"
            ),
        },
    }
