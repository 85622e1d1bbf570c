"""`zebractl convert` and `zebractl verify`: a checkpoint to a Hugging Face folder, and the proof."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zebractl.cli._common import EXIT_CHECK, JsonOpt, complete_preset, emit_json, err, guarded
from zebractl.cli.completion import choices
from zebractl.deps import require

SourceArg = Annotated[
    Path, typer.Argument(help="Run directory, its checkpoints folder or a checkpoint.")
]
OutputArg = Annotated[Path, typer.Argument(help="Output folder (new or empty).")]
ToOpt = Annotated[
    str,
    typer.Option(
        "--to",
        metavar="TARGET",
        help="hf: export a checkpoint; megatron: import an HF folder (ours or FLA's).",
        autocompletion=choices("hf", "megatron"),
    ),
]
PresetOpt = Annotated[
    str,
    typer.Option(
        "--preset",
        help="--to megatron: the architecture of an HF folder zebractl did not write, or of a "
        "Primus checkpoint (checked).",
        autocompletion=complete_preset,
    ),
]
IterationOpt = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        "--iteration",
        metavar="ITER|PATH",
        help="The checkpoint to export: an iteration of the run or one of its checkpoint folders (default: the newest intact one).",
    ),
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="Export dtype: bf16 or fp32.", autocompletion=choices("bf16", "fp32")
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="auto (fla where FLA has a class, else zebra) | fla (pure KDA/GDN: FLA's classes) | "
        "zebra (any model: zebractl.hf's ZebraForCausalLM).",
        autocompletion=choices("auto", "fla", "zebra"),
    ),
]


@guarded
def convert(
    source: SourceArg,
    output: OutputArg,
    to: ToOpt = "hf",
    preset: PresetOpt = None,
    iteration: IterationOpt = None,
    dtype: DtypeOpt = "bf16",
    fmt: FormatOpt = "auto",
    json_out: JsonOpt = False,
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
            report = primus.import_primus(source, output, preset=preset, console=say)
        else:
            report = import_hf(source, output, preset=preset, console=say)
        say(
            f"wrote {report.output}: {report.architecture}, {report.parameters:,} parameters; "
            f"train from it with `zebractl train RECIPE --init-from {Path(report.output).parent}`"
        )
    else:
        if preset is not None:
            raise ConfigError(
                "--preset applies to --to megatron (the run's config names the model)"
            )
        report = export_hf(source, output, iteration=iteration, dtype=dtype, fmt=fmt, console=say)
        say(
            f"wrote {report.output}: {report.architecture} ({report.format}), iteration "
            f"{report.iteration}, {report.parameters:,} parameters in {report.dtype}, "
            f"{len(report.shards)} safetensors file(s), {report.seconds:.1f} s"
        )
    if json_out:
        emit_json(report)


@guarded
def verify(
    source: Annotated[
        Path, typer.Argument(help="The run directory or checkpoint that was converted.")
    ],
    converted: Annotated[
        Path, typer.Argument(help="The Hugging Face folder `zebractl convert` wrote.")
    ],
    tokens: Annotated[
        int, typer.Option("--tokens", help="Tokens of real text for the logits tier.")
    ] = 128,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            help="auto | cpu (fp32, tolerance 1e-5) | cuda (bf16, tolerance 2e-2).",
            autocompletion=choices("auto", "cpu", "cuda"),
        ),
    ] = "auto",
    checkpoint: IterationOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check a conversion tier by tier: structure, weights (bitwise), logits, greedy generation.

    Exit 3 naming the first tier that fails.
    """
    require("verify")
    from zebractl.convert.verify import verify_conversion as run

    say = err if json_out else print
    report = run(
        source, converted, tokens=tokens, device=device, console=say, checkpoint=checkpoint
    )
    for t in report.tiers:
        say(f"{t.name:<11} {t.status:<8} {t.detail}")
    if json_out:
        emit_json(report)
    failed = next((t for t in report.tiers if t.status == "fail"), None)
    if failed is not None:
        err(f"verify: tier {failed.name} failed: {failed.detail}")
        raise typer.Exit(EXIT_CHECK)
