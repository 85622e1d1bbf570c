"""`zebractl generate` / `zebractl chat` as library calls: open the model, check the input, run.

SOURCE opens as `zebractl eval` opens a model (:func:`zebractl.evaluate.harness.open_model`: a run
directory or checkpoint converted in memory, or a Hugging Face folder). A prompt longer than the
model's positions is a usage error (exit 2); generation stops at the last position.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError
from zebractl.generate.options import Sampling
from zebractl.schemas.reports.generate import ChatReport, ChatTurn, GenerateReport, GenerateSampling


def _open(
    source: Path,
    device: str,
    dtype: str,
    checkpoint: str | None,
    console: Callable[[str], None],
    cuda_graph: bool | None = None,
) -> tuple[Any, str, str, Any]:
    """(Loaded, device, dtype name, Decoder) for SOURCE (``cuda_graph``: our models' one-token
    steps replayed as a CUDA graph on a CUDA device; None: wherever that applies, False: never;
    True where it does not apply says so)."""
    from zebractl.evaluate.harness import _device, open_model
    from zebractl.generate.engine import Decoder

    dev = _device(device)
    loaded, dname = open_model(
        source, device=dev, dtype=dtype, iteration=checkpoint, console=console
    )
    if loaded.cfg is not None:
        positions = loaded.cfg.model.max_position_embeddings
    else:
        positions = int(getattr(loaded.model.config, "max_position_embeddings", 0) or 2**31 - 1)
    if loaded.fla_on_cpu:  # FLA's classes on a CPU: FLA's reference code, which keeps no state
        from zebractl.runtime.fla_cpu import on_cpu

        console(
            "FLA's classes on a CPU keep no generation state: each token recomputes the sequence"
        )
        return loaded, dev, dname, Decoder(loaded.model, positions, on_cpu, cached=False)
    kind = type(loaded.model).__name__
    if cuda_graph and (not dev.startswith("cuda") or kind != "ZebraForCausalLM"):
        console(
            f"note: --cuda-graph replays zebractl's models' steps on a CUDA GPU; {kind} on {dev} "
            "decodes without it"
        )
    graph = cuda_graph is not False  # the Decoder graphs only our models on CUDA
    return loaded, dev, dname, Decoder(loaded.model, positions, cuda_graph=graph)


def _graph_state(dec: Any) -> str | None:
    """The report's word on the CUDA graph: None (not asked or not possible), "replayed", or
    "failed: why" (the steps then ran eagerly)."""
    g = getattr(dec, "graphed", None)
    if g is None:
        return None
    if g.failed is not None:
        return f"failed: {g.failed}"
    return f"replayed ({g.replays} steps, {g.captures} capture(s))" if g.replays else "not reached"


def _prompt_ids(loaded: Any, text: str, positions: int) -> list[int]:
    ids = list(loaded.tokenizer(text)["input_ids"])
    if not ids:
        raise ConfigError("the prompt is empty after tokenization: there is nothing to continue")
    if len(ids) >= positions:
        raise ConfigError(
            f"the prompt is {len(ids):,} tokens; the model has {positions:,} positions "
            "(max_position_embeddings): shorten it"
        )
    return ids


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if tokens > 0 and seconds > 1e-6 else None


def generate(
    source: Path,
    prompt: str,
    *,
    max_new_tokens: int,
    sampling: Sampling,
    stop: list[str],
    device: str,
    dtype: str,
    checkpoint: str | None,
    on_text: Callable[[str], None] | None,
    console: Callable[[str], None],
    cuda_graph: bool | None = None,
) -> GenerateReport:
    """Continue ``prompt`` with SOURCE (see the module docstring); the report of it."""
    from zebractl.generate import engine

    loaded, dev, dname, dec = _open(source, device, dtype, checkpoint, console, cuda_graph)
    ids = _prompt_ids(loaded, prompt, dec.max_positions)
    out = engine.generate(
        dec,
        loaded.tokenizer,
        ids,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        stop=stop,
        on_text=on_text,
    )
    decoded = max(0, len(out.ids) - 1)
    return GenerateReport(
        source=str(source),
        source_kind=loaded.source,
        model_class=loaded.model_class,
        iteration=loaded.iteration,
        device=dev,
        dtype=dname,
        sampling=GenerateSampling(**sampling.__dict__),
        prompt=prompt,
        text=out.text,
        prompt_tokens=len(ids),
        new_tokens=len(out.ids),
        stop_reason=out.stop_reason,
        prefill_seconds=out.prefill_seconds,
        decode_seconds=out.decode_seconds,
        prefill_tokens_per_second=_rate(len(ids), out.prefill_seconds),
        decode_tokens_per_second=_rate(decoded, out.decode_seconds),
        cuda_graph=_graph_state(dec),
    )


def data_template(loaded: Any) -> dict | None:
    """The chat template the run's data was prepared with (its manifest's ``chat.template``)."""
    if loaded.cfg is None:
        return None
    from zebractl.convert.hf import data_chat_template

    return data_chat_template(loaded.cfg)


def open_chat(
    source: Path,
    *,
    system: str | None,
    template: str,
    sampling: Sampling,
    max_new_tokens: int,
    device: str,
    dtype: str,
    checkpoint: str | None,
    console: Callable[[str], None],
    cuda_graph: bool | None = None,
) -> Any:
    """A :class:`zebractl.generate.chat.ChatSession` on SOURCE."""
    from zebractl.generate.chat import ChatSession, template_for

    loaded, _, _, dec = _open(source, device, dtype, checkpoint, console, cuda_graph)
    tpl = template_for(template, data_template(loaded), loaded.tokenizer)
    console(f"chat template: {tpl.name}")
    return ChatSession(
        dec, loaded.tokenizer, tpl, system=system, sampling=sampling, max_new_tokens=max_new_tokens
    )


def chat_report(source: Path, session: Any) -> ChatReport:
    """An empty :class:`ChatReport` for ``session`` (the CLI appends the turns)."""
    return ChatReport(
        source=str(source),
        model_class=type(session.dec.model).__name__,
        template=session.template.name,
        system=session.conv.system,
    )


def chat_turn(user: str, turn: Any) -> ChatTurn:
    """One :class:`ChatTurn` of the report."""
    return ChatTurn(
        user=user,
        reply=turn.reply,
        prefill_tokens=turn.prefill_tokens,
        new_tokens=turn.new_tokens,
        stop_reason=turn.stop_reason,
        fed=turn.fed,
    )
