"""`zebractl generate` and `zebractl chat`: talk to a trained model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from zebractl.cli._common import JsonOpt, emit_json, err, guarded, stdout_to_stderr
from zebractl.cli.eval import DeviceOpt, DtypeOpt
from zebractl.cli.eval import IterationOpt as CheckpointOpt
from zebractl.deps import require
from zebractl.errors import ConfigError

SourceArg = Annotated[
    Path,
    typer.Argument(
        help="A run directory or checkpoint (converted in memory, the newest intact checkpoint by "
        "default) or a Hugging Face folder (ours, or FLA's for pure KDA/GDN).",
    ),
]
PromptOpt = Annotated[str, typer.Option("--prompt", help="The text to continue.")]
PromptFileOpt = Annotated[
    Path, typer.Option("--prompt-file", help="Read the prompt from this UTF-8 file.")
]
MaxNewOpt = Annotated[int, typer.Option("--max-new-tokens", help="Most tokens to generate.")]
TemperatureOpt = Annotated[
    float, typer.Option("--temperature", help="0: greedy; above 0: sample at this temperature.")
]
TopKOpt = Annotated[
    int, typer.Option("--top-k", help="Sample among the k most likely tokens (0: all).")
]
TopPOpt = Annotated[
    float,
    typer.Option("--top-p", help="Sample among the most likely tokens up to this probability."),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="The sampler's random seed.")]
GraphOpt = Annotated[
    bool | None,
    typer.Option(
        "--cuda-graph/--no-cuda-graph",
        help="Replay each one-token step of zebractl's models as a CUDA graph (one launch per "
        "token instead of hundreds). Default: on for zebractl's models on a CUDA GPU, off "
        "elsewhere; a failed capture says why and decodes without it.",
        show_default=False,
    ),
]
StopOpt = Annotated[
    list[str], typer.Option("--stop", help="End at this text (not printed); repeatable.")
]
SystemOpt = Annotated[str, typer.Option("--system", help="A system message opening the chat.")]
TemplateOpt = Annotated[
    str,
    typer.Option(
        "--chat-template",
        help="auto (the template the run's chat data was prepared with, else the tokenizer's, "
        "else ChatML) | chatml | a Jinja file.",
    ),
]


def _sampling(temperature: float, top_k: int, top_p: float, seed: int):
    import math

    from zebractl.generate.options import Sampling

    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"--temperature {temperature}: a finite number >= 0 (0: greedy)")
    if top_k < 0:
        raise ConfigError(f"--top-k {top_k}: 0 (all tokens) or more")
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise ConfigError(f"--top-p {top_p}: a probability in (0, 1]")
    return Sampling(temperature, top_k, top_p, seed)


def _prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if (prompt is None) == (prompt_file is None):
        raise ConfigError("give the prompt with exactly one of --prompt TEXT or --prompt-file FILE")
    if prompt_file is not None:
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"--prompt-file {prompt_file}: cannot read it as UTF-8 text ({exc})"
            ) from None
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty: there is nothing to continue")
    return prompt


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@guarded
def generate(
    source: SourceArg,
    prompt: PromptOpt = None,
    prompt_file: PromptFileOpt = None,
    max_new_tokens: MaxNewOpt = 128,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    stop: StopOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    checkpoint: CheckpointOpt = None,
    cuda_graph: GraphOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Continue a prompt with a trained model, streaming the text as it is generated.

    The prompt is pre-filled in one forward pass; each new token then runs through the generation
    cache (the recurrent layers' fixed-size states, MLA's compressed latents), so a token costs the
    same at any context length for the recurrent layers. Greedy by default; --temperature, --top-k
    and --top-p sample with --seed. --json prints one report (the text, token counts, prefill and
    decode tokens/s) instead of streaming.
    """
    text = _prompt(prompt, prompt_file)
    sampling = _sampling(temperature, top_k, top_p, seed)
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {max_new_tokens}: at least 1")
    require("generate")
    from zebractl.generate import run

    with stdout_to_stderr(json_out):
        report = run.generate(
            source,
            text,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=list(stop or []),
            device=device,
            dtype=dtype,
            checkpoint=checkpoint,
            on_text=None if json_out else _write,
            console=err,
            cuda_graph=cuda_graph,
        )
    if json_out:
        emit_json(report)
        return
    _write("\n")
    err(
        f"[{report.new_tokens} tokens, {report.stop_reason}; prefill {report.prompt_tokens} tokens "
        f"in {report.prefill_seconds:.2f} s, decode "
        + (
            f"{report.decode_tokens_per_second:.1f} tokens/s]"
            if report.decode_tokens_per_second
            else "-]"
        )
    )
    if report.stop_reason == "interrupted":
        raise typer.Exit(130)


@guarded
def chat(
    source: SourceArg,
    system: SystemOpt = None,
    chat_template: TemplateOpt = "auto",
    max_new_tokens: MaxNewOpt = 512,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    checkpoint: CheckpointOpt = None,
    cuda_graph: GraphOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Chat with a model, one message per line (a terminal or a pipe); /reset starts over, /exit
    (or the end of the input) ends.

    Turns are rendered with the chat template the run's SFT data was prepared with (from its data
    manifest; --chat-template to choose another). The conversation stays in the generation cache:
    each turn pre-fills only its own new tokens, and the reply ends at the template's end-of-turn
    text. --json: the replies are not streamed; one report of every turn is printed at the end.
    """
    sampling = _sampling(temperature, top_k, top_p, seed)
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {max_new_tokens}: at least 1")
    require("generate")
    from zebractl.generate import run

    tty = sys.stdin.isatty() and not json_out
    with stdout_to_stderr(json_out):
        session = run.open_chat(
            source,
            system=system,
            template=chat_template,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            device=device,
            dtype=dtype,
            checkpoint=checkpoint,
            console=err,
            cuda_graph=cuda_graph,
        )
    report = run.chat_report(source, session)
    if tty:
        err("type a message; /reset starts over, /exit ends")
    while True:
        if tty:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        line = line.rstrip("\n")
        if line.strip() == "/reset":
            session.reset()
            err("(conversation reset)")
            continue
        if not line.strip():
            continue
        turn = session.turn(line, on_text=None if json_out else _write)
        report.turns.append(run.chat_turn(line, turn))
        if not json_out:
            _write("\n")
        if tty:
            err(f"[{turn.new_tokens} tokens, {turn.stop_reason}; fed {turn.prefill_tokens}]")
        if turn.stop_reason == "interrupted":
            raise typer.Exit(130)
    if json_out:
        emit_json(report)
