"""`zebractl prepare`: tokenize corpora into megatron indexed datasets; `--demo`; `--verify DIR`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from zebractl.cli._common import JsonOpt, emit_json, err, guarded
from zebractl.cli.completion import choices
from zebractl.deps import require
from zebractl.errors import CheckFailed

InputsArg = Annotated[
    list[str],
    typer.Argument(
        help="JSONL(.gz), Parquet, Arrow / save_to_disk folders, text files, folders, globs."
    ),
]
TokenizerOpt = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        help="tokenizer.json (file/folder), GPT-2 vocab+merges folder, "
        "SentencePiece .model, or a Hub id where the Hub is reachable.",
    ),
]
OutputOpt = Annotated[
    Path, typer.Option("-o", "--output", metavar="DIR", help="Output dataset folder.")
]
WorkersOpt = Annotated[
    int, typer.Option("--workers", help="Tokenizer processes (default: CPU count); one shard each.")
]
TextKeyOpt = Annotated[
    str,
    typer.Option(
        "--text-key",
        metavar="KEY",
        help="Field holding the text (chat: the turns). [default: text; messages]",
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="text: a document per record. chat: a 'messages' list of role/content turns per "
        "record, with a loss mask on the assistant turns.",
    ),
]
ChatTemplateOpt = Annotated[
    str,
    typer.Option(
        "--chat-template",
        metavar="TEMPLATE",
        help="chat: the template the turns are rendered with: auto (the tokenizer's own chat "
        "template, else chatml), a built-in name (chatml) or a Jinja file.",
    ),
]
OverlongOpt = Annotated[
    str,
    typer.Option(
        "--overlong",
        help="chat with --seq-length: truncate or drop a longer conversation.",
        autocompletion=choices("truncate", "drop"),
    ),
]
AddBosOpt = Annotated[
    bool,
    typer.Option(
        "--add-bos/--no-add-bos",
        help="BOS before each document (default: no; yes with --fla-aligned).",
    ),
]
AddEosOpt = Annotated[
    bool,
    typer.Option(
        "--add-eos/--no-add-eos",
        help="EOS after each document (default: yes; no with --fla-aligned).",
    ),
]
SeqLengthOpt = Annotated[
    int,
    typer.Option(
        "--seq-length", help="Row length for --fla-aligned; chat: the longest conversation."
    ),
]
FlaAlignedOpt = Annotated[
    bool,
    typer.Option(
        "--fla-aligned",
        help="Reproduce FLA's preprocessing: BOS per doc, no EOS, "
        "concatenated and cut into --seq-length rows.",
    ),
]
ValidFractionOpt = Annotated[
    float,
    typer.Option(
        "--valid-fraction",
        metavar="FRACTION",
        help="Fraction of documents (rows with --fla-aligned) held out as a 'valid' split.",
    ),
]
SkipBadOpt = Annotated[
    bool,
    typer.Option(
        "--skip-bad",
        help="Skip malformed records and count them in the manifest instead of stopping.",
    ),
]
ShardSizeOpt = Annotated[int, typer.Option("--shard-size", help="Input MB per shard.")]
DemoOpt = Annotated[
    bool,
    typer.Option(
        "--demo",
        help="Build the bundled demo dataset (State of the Union + Wikipedia, GPT-2 tokenizer); "
        "with --format chat, the demo conversations (GSM8K problems and worked answers).",
    ),
]
VerifyOpt = Annotated[
    Path, typer.Option("--verify", help="Check a prepared dataset; exit 3 on a mismatch.")
]


@guarded
def prepare(
    inputs: InputsArg = None,
    tokenizer: TokenizerOpt = None,
    output: OutputOpt = None,
    workers: WorkersOpt = None,
    text_key: TextKeyOpt = None,
    data_format: FormatOpt = "text",
    chat_template: ChatTemplateOpt = "auto",
    overlong: OverlongOpt = "truncate",
    add_bos: AddBosOpt = None,
    add_eos: AddEosOpt = None,
    seq_length: SeqLengthOpt = None,
    fla_aligned: FlaAlignedOpt = False,
    valid_fraction: ValidFractionOpt = 0.0,
    skip_bad: SkipBadOpt = False,
    shard_size_mb: ShardSizeOpt = 256,
    demo: DemoOpt = False,
    verify: VerifyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Tokenize corpora into megatron .bin/.idx datasets with a manifest (resumable)."""
    require("prepare")
    if verify is not None:
        _verify(verify, json_out)
        return
    from zebractl.errors import ConfigError

    if output is None:
        raise ConfigError("--output DIR is required (where the dataset is written)")
    if output.exists() and not output.is_dir():  # before the lock file is made inside it
        raise ConfigError(f"--output {output}: exists and is not a folder; choose a new --output")
    from zebractl.run import lock

    with lock.hold(output, "prepare", err):  # one writer per output folder (the demo's too)
        if demo:
            inputs, tokenizer = _demo_inputs(output, data_format, inputs, tokenizer)
        if not inputs:
            raise ConfigError("no INPUT given (files, folders or globs), or use --demo")
        if not tokenizer:
            raise ConfigError("--tokenizer is required (a local tokenizer file or folder)")
        from zebractl.data.prepare import PrepareOptions

        opts = PrepareOptions(
            inputs=tuple(inputs),
            tokenizer=tokenizer,
            output=str(output),
            text_key=text_key or ("messages" if data_format == "chat" else "text"),
            add_bos=fla_aligned if add_bos is None else add_bos,
            add_eos=(not fla_aligned) if add_eos is None else add_eos,
            fla_aligned=fla_aligned,
            seq_length=seq_length,
            valid_fraction=valid_fraction,
            skip_bad=skip_bad,
            shard_bytes=shard_size_mb * 2**20,
            format=data_format,
            chat_template=chat_template,
            overlong=overlong,
        )
        n = workers or os.cpu_count() or 1
        manifest = _run(opts, n, progress=not json_out and sys.stderr.isatty())
    if json_out:
        from zebractl.schemas.reports import PrepareReport

        emit_json(PrepareReport.model_validate({"output": str(output), "manifest": manifest}))
        return
    _print(manifest, output, n)


def _demo_inputs(
    output: Path, data_format: str, inputs: list[str] | None, tokenizer: str | None
) -> tuple[list[str], str]:
    """--demo: the demo sources written under OUTPUT/sources, and the demo tokenizer."""
    from zebractl.errors import ConfigError

    if inputs or tokenizer:
        raise ConfigError("--demo brings its own inputs and tokenizer; give only --output")
    from zebractl.data import demo as demo_mod

    write = demo_mod.write_chat_sources if data_format == "chat" else demo_mod.write_sources
    return [str(p) for p in write(output / "sources")], str(demo_mod.tokenizer_dir())


def _run(opts: Any, workers: int, progress: bool) -> dict[str, Any]:
    """:func:`zebractl.data.prepare.prepare` with a progress bar when asked; its manifest."""
    from zebractl.data.prepare import prepare as run

    with _progress(enabled=progress) as on_progress:
        return run(opts, workers=workers, on_progress=on_progress)


def _print(manifest: dict[str, Any], output: Path, n: int) -> None:
    """What prepare wrote: totals and rate, resumed shards, skips, chat, tokenizer."""
    t, run_info = manifest["totals"], manifest["run"]
    secs = max(run_info["seconds"], 1e-9)
    rate = (
        f" [{run_info['tokens_this_run'] / secs:,.0f} tokens/s, {n} worker(s)]"
        if run_info["tokens_this_run"]
        else ""
    )
    print(
        f"prepared {output}: {t['documents']:,} documents, {t['tokens']:,} tokens "
        f"({manifest['dtype']}, {len(manifest['shards'])} shard files) in {secs:.1f}s{rate}"
    )
    if manifest["run"]["shards_resumed"]:
        print(f"  resumed: {manifest['run']['shards_resumed']} shard(s) were already done")
    if t["empty_documents"] or t["skipped"] or t["dropped_tokens"]:
        print(
            f"  empty documents skipped: {t['empty_documents']:,}; bad records skipped: "
            f"{t['skipped'] or 0}; tokens dropped (row remainders): {t['dropped_tokens']:,}"
        )
    talk = manifest.get("chat")
    if talk:
        from zebractl.data.chat_template import describe_in_words

        print(
            f"  chat: {talk['conversations']:,} conversations rendered with "
            f"{describe_in_words(talk['template'])}; "
            f"{talk['masked_fraction']:.1%} of the tokens are trained on (assistant turns); "
            f"{talk['truncated']:,} truncated, {talk['dropped']:,} dropped "
            f"(--overlong {talk['overlong']}, --seq-length {talk['seq_length'] or 'none'})"
        )
    print(
        f"  tokenizer: {manifest['tokenizer']['source']} (vocab {manifest['tokenizer']['vocab_size']:,}) "
        f"saved in {output / 'tokenizer'}"
    )


def _verify(folder: Path, json_out: bool) -> None:
    """--verify DIR: the report on stdout (--json) or one line and the problems; exit 3 if any."""
    from zebractl.data.verify import verify_prepared

    report = verify_prepared(folder)
    if json_out:
        emit_json(report)
    else:
        c = report.checked
        status = "ok" if report.ok else "FAILED"
        print(
            f"verify {folder}: {status} ({c.outputs} shard files, {c.documents:,} "
            f"documents, {c.tokens:,} tokens, max id {c.max_token_id} < vocab "
            f"{c.vocab_size:,}, {c.dtype})"
        )
        for p in report.problems:
            err(f"  {p}")
    if not report.ok:
        raise CheckFailed("")


class _progress:
    """A rich progress bar (documents/s, tokens/s, ETA) on a terminal; nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("tokenizing"),
            BarColumn(),
            TextColumn("{task.fields[docs]:,} docs {task.fields[rate]}"),
            TimeRemainingColumn(),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("prepare", total=None, docs=0, rate="")
        return self._update

    def _update(self, p: Any) -> None:
        import time

        secs = max(time.time() - p.started, 1e-6)
        self.bar.update(
            self.task,
            total=max(p.total_bytes, 1),
            completed=min(p.bytes, p.total_bytes),
            docs=p.documents,
            rate=f"{p.documents / secs:,.0f} docs/s {p.tokens / secs:,.0f} tok/s",
        )

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
