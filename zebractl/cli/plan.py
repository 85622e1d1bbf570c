"""`zebractl plan RECIPE`: parameters, pattern, FLOPs, tokens, memory and batch layout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from zebractl.cli._common import (
    JSON_HELP,
    SET_HELP,
    complete_recipe,
    complete_set,
    emit_json,
    guarded,
)

if TYPE_CHECKING:  # pydantic models load only when the command runs
    from zebractl.schemas.reports import PlanParameters, PlanReport


def _n(x: float) -> str:
    return f"{x:,.0f}"


@guarded
def plan(
    recipe: str = typer.Argument(
        ..., help="Recipe: a shipped name or a .yaml path.", autocompletion=complete_recipe
    ),
    set_: list[str] = typer.Option(
        [], "--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set
    ),
    fit: bool = typer.Option(
        False,
        "--fit",
        help="Also find the largest micro-batch whose memory estimate fits one GPU "
        "(--gpu-memory, or this machine's GPU).",
    ),
    gpu_memory: float = typer.Option(
        None, "--gpu-memory", metavar="GIB", help="GPU memory to fit into, GiB (implies --fit)."
    ),
    build: bool = typer.Option(
        False,
        "--build",
        help="Also build the model on the meta device and check its parameter count against the "
        "plan's (imports torch and megatron-core: seconds).",
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Exact parameter count, resolved pattern, FLOPs/token, tokens, memory/GPU, batch layout.

    Computed from the config alone (the parameter layout of zebractl.layout): nothing heavy is
    imported and no model is built unless --build asks for the cross-check (or --fit without
    --gpu-memory asks torch for this GPU's memory).
    """

    from zebractl.config.catalog import locate
    from zebractl.config.resolve import resolve_recipe
    from zebractl.errors import ConfigError
    from zebractl.planning.plan import Plan

    ref = locate(recipe)
    r = resolve_recipe(ref, set_)
    capacity = None
    if gpu_memory is not None:
        if not (0 < gpu_memory < 1e6):
            raise ConfigError(f"--gpu-memory must be a positive number of GiB, not {gpu_memory}")
        capacity = gpu_memory
    elif fit:
        capacity = _this_gpu_gib()
        if capacity is None:
            raise ConfigError(
                "--fit needs the GPU's memory: this machine has no CUDA GPU to ask, so give "
                "--gpu-memory GIB (e.g. 139 for an H200, 79 for an H100 80GB)"
            )
    built = _built(r.run.model) if build else None
    report = Plan(r.source, r.run, fit_gib=capacity, built=built).report()
    if json_out:
        emit_json(report)
        return
    _print(report)


def _built(m) -> int | None:
    """The parameters of the model built on the meta device (None without megatron-core)."""
    try:
        from zebractl.model.model import built_parameter_count
    except ImportError:
        return None
    return built_parameter_count(m)


def _this_gpu_gib() -> float | None:
    """Total memory of this machine's first CUDA GPU in GiB (None without torch or CUDA)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 1024**3


def _params_table(p: PlanParameters) -> Any:
    """The exact parameter count, part by part (and the built model's, with --build)."""
    from zebractl.cli import _tables

    params = _tables.table(
        "parameters (exact)",
        [("part", "key"), ("count", "number"), ("each", "number"), ("total", "number")],
    )
    params.add_row("embedding", "", "", _n(p.embedding))
    for kind, row in p.by_sublayer.items():
        params.add_row(f"{kind} sublayers", str(row.count), _n(row.each), _n(row.total))
    params.add_row("final norm", "", "", _n(p.final_norm))
    params.add_row("output layer", "", "", "tied" if not p.output_layer else _n(p.output_layer))
    params.add_row("[bold]total[/bold]", "", "", f"[bold]{_n(p.total)}[/bold]")
    if p.built is not None:
        check = "equal" if p.built == p.total else "MISMATCH"
        params.add_row("built model (meta)", "", "", f"{_n(p.built)} ({check})")
    return params


def _print(doc: PlanReport) -> None:
    """The plan as tables and lines (rich on stdout)."""
    from zebractl.cli import _tables

    console = _tables.console()
    p, f, t, b, mem = doc.parameters, doc.flops, doc.tokens, doc.batch, doc.memory_per_gpu
    console.print(f"[bold]plan[/bold] {doc.recipe} (preset {doc.preset})")
    for text in (doc.description, doc.preset_description):
        if text:
            console.print(f"  {text}", markup=False)
    sq = doc.sequence
    console.print(
        f"sequence length {_n(sq.length)} (the model takes up to {_n(sq.max)}: {sq.limited_by})"
    )
    console.print(_params_table(p))
    sub = doc.pattern.blocks
    console.print(
        f"pattern ({len(sub)} blocks, {len(doc.pattern.sublayers)} sublayers): " + " ".join(sub)
    )
    br = f.forward_breakdown
    console.print(
        f"FLOPs/token at seq {f.seq_length}: forward {_n(f.per_token_forward)} "
        f"(linear {_n(br.linear)}, recurrent {_n(br.recurrent)}, attention "
        f"{_n(br.attention)}, conv {_n(br.conv)}, lm head {_n(br.lm_head)}); "
        f"training {_n(f.per_token_training)} (6N = {_n(f.six_n_per_token)})"
    )
    console.print(
        f"tokens: {_n(t.per_step)}/step x {_n(t.iterations)} iterations = "
        f"{_n(t.total)}; training FLOPs {f.total_training:.3e}"
    )
    console.print(
        f"batch: micro {b.micro} x data-parallel {b.data_parallel} x accumulation "
        f"{b.grad_accumulation} = global {b.global_} "
        f"({b.num_gpus} GPUs, tp {b.tp}, pp {b.pp}, cp {b.cp})"
    )
    console.print(
        f"memory/GPU (estimate): params+grads {mem.params_and_grads_gib} GiB, "
        f"optimizer {mem.optimizer_gib} GiB, activations {mem.activations_gib} "
        f"GiB (recompute {mem.recompute}), LM head {mem.lm_head_gib} GiB, total "
        f"{mem.total_gib} GiB ({mem.scheme})",
        markup=False,
    )
    tt = doc.time_to_train
    if tt.hours is not None:
        console.print(
            f"time to train (estimate): {tt.hours:,.1f} h at {_n(tt.tokens_per_s or 0)} tokens/s "
            f"on {b.num_gpus} x {tt.gpu}, from the measured {tt.measured} ({tt.source}); "
            f"{tt.note}",
            markup=False,
        )
    else:
        console.print(f"time to train: no estimate ({tt.note})", markup=False)
    ft = doc.fit
    if ft is not None:
        if ft.micro == 0:
            console.print(
                f"fit: not even micro-batch 1 fits {ft.usable_gib} GiB of {ft.capacity_gib} GiB "
                f"(fixed state alone {ft.fixed_gib} GiB)",
                markup=False,
            )
        else:
            console.print(
                f"fit: micro-batch {ft.micro} ({ft.estimate_gib} GiB of {ft.usable_gib} GiB usable "
                f"of {ft.capacity_gib} GiB); largest dividing the global batch: "
                f"{ft.micro_dividing_global} ({ft.estimate_dividing_gib} GiB) -> "
                f"--set batch.micro={ft.micro_dividing_global}",
                markup=False,
            )
        modes = ", ".join(f"{m} {n}" for m, n in ft.by_recompute.items())
        console.print(f"fit by recompute.mode (largest micro-batch): {modes}", markup=False)
