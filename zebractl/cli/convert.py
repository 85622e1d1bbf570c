"""`zebractl convert` and `zebractl verify`: a checkpoint to a Hugging Face folder, and the proof."""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import (
    EXIT_CHECK,
    JSON_HELP,
    complete_preset,
    emit_json,
    err,
    guarded,
)
from zebractl.cli.completion import choices
from zebractl.deps import require


@guarded
def convert(
    source: Path = typer.Argument(
        ..., help="Run directory, its checkpoints folder or a checkpoint."
    ),
    output: Path = typer.Argument(..., help="Output folder (new or empty)."),
    to: str = typer.Option(
        "hf",
        "--to",
        metavar="TARGET",
        help="hf: export a checkpoint; megatron: import an HF folder (ours or FLA's).",
        autocompletion=choices("hf", "megatron"),
    ),
    preset: str = typer.Option(
        None,
        "--preset",
        help="--to megatron: the architecture of an HF folder zebractl did not write, or of a "
        "Primus checkpoint (checked).",
        autocompletion=complete_preset,
    ),
    iteration: int = typer.Option(
        None, "--iteration", help="Checkpoint iteration (default: newest)."
    ),
    dtype: str = typer.Option(
        "bf16",
        "--dtype",
        help="Export dtype: bf16 or fp32.",
        autocompletion=choices("bf16", "fp32"),
    ),
    fmt: str = typer.Option(
        "auto",
        "--format",
        help="auto (fla where FLA has a class, else zebra) | fla (pure KDA/GDN: FLA's classes) | "
        "zebra (any model: zebractl.hf's ZebraForCausalLM).",
        autocompletion=choices("auto", "fla", "zebra"),
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Export a checkpoint to a Hugging Face folder (safetensors, config, tokenizer, model card), or
    (--to megatron) import a Hugging Face folder or a Primus/Megatron-LM checkpoint (TP = PP = 1,
    `ITER/mp_rank_00/model_optim_rng.pt`; with --preset) into a checkpoint for `train --init-from`.

    Pure KDA and GDN models become FLA's KDAForCausalLM / GatedDeltaNetForCausalLM (`import fla`),
    hybrids and Mamba2 zebractl's ZebraForCausalLM (`import zebractl.hf`); then
    `AutoModelForCausalLM.from_pretrained(OUTPUT)`. Check the result with `zebractl verify`.
    """
    from zebractl.errors import ConfigError

    if to not in ("hf", "megatron"):
        raise ConfigError(f"--to {to}: expected hf or megatron")
    if fmt not in ("auto", "fla", "zebra"):
        raise ConfigError(f"--format {fmt}: expected auto, fla or zebra")
    require("convert")
    from zebractl.convert.hf import export_hf, import_hf

    say = err if json_out else print
    if to == "megatron":
        from zebractl.convert import primus

        if primus.find_file(source) is not None:  # a Primus / Megatron-LM torch checkpoint
            imp = primus.import_primus(source, output, preset=preset, console=say)
        else:
            imp = import_hf(source, output, preset=preset, console=say)
        say(
            f"wrote {imp.checkpoint}: {imp.architecture}, {imp.parameters:,} parameters; train "
            f"from it with `zebractl train RECIPE --init-from {imp.output}`"
        )
        if json_out:
            from zebractl.schemas.reports import ConvertReport

            emit_json(
                ConvertReport(
                    output=str(imp.checkpoint),
                    format="megatron",
                    architecture=imp.architecture,
                    iteration=0,
                    dtype="fp32",
                    tensors=imp.tensors,
                    parameters=imp.parameters,
                    bytes=4 * imp.parameters,
                    shards=[],
                    tokenizer=None,
                    files=sorted(p.name for p in imp.checkpoint.iterdir()),
                    seconds=imp.seconds,
                    peak_rss_gib=None,
                )
            )
        return
    if preset is not None:
        raise ConfigError("--preset applies to --to megatron (the run's config names the model)")
    res = export_hf(source, output, iteration=iteration, dtype=dtype, fmt=fmt, console=say)
    say(
        f"wrote {res.output}: {res.architecture} ({res.format}), iteration {res.iteration}, "
        f"{res.parameters:,} parameters in {res.dtype}, {len(res.shards)} safetensors file(s), "
        f"{res.seconds:.1f} s"
    )
    if json_out:
        from zebractl.schemas.reports import ConvertReport

        emit_json(
            ConvertReport(
                output=str(res.output),
                format=res.format,
                architecture=res.architecture,
                iteration=res.iteration,
                dtype=res.dtype,
                tensors=res.tensors,
                parameters=res.parameters,
                bytes=res.bytes,
                shards=res.shards,
                tokenizer=res.tokenizer,
                files=res.files,
                seconds=res.seconds,
                peak_rss_gib=res.peak_rss_gib,
            )
        )


@guarded
def verify(
    source: Path = typer.Argument(..., help="The run directory or checkpoint that was converted."),
    converted: Path = typer.Argument(..., help="The Hugging Face folder `zebractl convert` wrote."),
    tokens: int = typer.Option(128, "--tokens", help="Tokens of real text for the logits tier."),
    device: str = typer.Option(
        "auto",
        "--device",
        help="auto | cpu (fp32, tolerance 1e-5) | cuda (bf16, tolerance 2e-2).",
        autocompletion=choices("auto", "cpu", "cuda"),
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check a conversion tier by tier: structure, weights (bitwise), logits, greedy generation.

    Exit 3 naming the first tier that fails.
    """
    require("verify")
    from zebractl.convert.verify import verify as run

    say = err if json_out else print
    src, tiers = run(source, converted, tokens=tokens, device=device, console=say)
    for t in tiers:
        say(f"{t.name:<11} {t.status:<8} {t.detail}")
    failed = next((t for t in tiers if t.status == "fail"), None)
    if json_out:
        from zebractl.schemas.reports import ModelVerifyReport, VerifyTier

        emit_json(
            ModelVerifyReport(
                source=str(src.checkpoint.folder),
                converted=str(converted),
                ok=failed is None,
                first_failure=failed.name if failed else None,
                tiers=[
                    VerifyTier(name=t.name, status=t.status, detail=t.detail, metrics=t.metrics)
                    for t in tiers
                ],
            )
        )
    if failed is not None:
        err(f"verify: tier {failed.name} failed: {failed.detail}")
        raise typer.Exit(EXIT_CHECK)
