"""The Trainer's setup, step by step: each function takes what it needs and returns what it makes,
so :meth:`zebractl.train.trainer.Trainer.setup` reads as the list of its steps.

Checks that end a run before anything heavy starts come first (:func:`check_request`,
:func:`check_data`); then what is said on the console (:func:`announce`), the run directory
(:func:`write_config`), the seeds, the datasets (:func:`build_datasets`), the engine
(:func:`build_engine`), the learning-rate schedule (:func:`build_scheduler`), the weights a fresh
run starts from (:func:`init_weights`, :func:`init_record`), the metrics (:func:`open_metrics`) and
the GPU's peak (:func:`peak_flops`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError
from zebractl.run.records import InitRecord, ResolvedConfigRecord
from zebractl.run.rundir import RunDir
from zebractl.schemas.recipe import RunConfig
from zebractl.train.progress import count

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}


def check_request(
    cfg: RunConfig, record: ResolvedConfigRecord, init_from: Path | None, world: int
) -> int:
    """What no setup can fix: parallelism, the batch over the processes, a reference run's
    limits, ``init_from`` missing. Returns the micro-batches each step accumulates."""
    p = cfg.parallelism
    if (p.tp, p.pp, p.cp) != (1, 1, 1):
        raise ConfigError(
            "tensor, pipeline and context parallelism are not supported by "
            "`zebractl train` yet; use parallelism.tp=pp=cp=1"
        )
    g, micro = cfg.batch.global_, cfg.batch.micro
    if g % (micro * world):
        raise ConfigError(
            f"batch.global {g} is not a multiple of batch.micro {micro} x {world} process(es)"
        )
    if record.reference is not None:
        from zebractl.train import reference as ref

        ref.check(cfg, record.reference)
        if init_from is not None:
            raise ConfigError(
                "--reference starts from zebractl's own initialisation of the recipe; "
                "--init-from does not apply"
            )
    if init_from is not None and not init_from.exists():
        raise ConfigError(
            f"init_from {init_from}: no such run directory, checkpoint or Hugging Face "
            "folder (train the run it names first, or give --init-from PATH)"
        )
    return g // (micro * world)


def check_data(cfg: RunConfig) -> tuple[Any, int | None]:
    """The data's own mistakes (a vocabulary larger than the model's, no end-of-document token
    to keep documents apart, no held-out part to validate on), before any kernel compiles.
    Returns the dataset contract (:class:`zebractl.data.spec.DataSpec`) and the end-of-document
    token when documents are kept apart (else None)."""
    from zebractl.data.spec import resolve_data

    spec = resolve_data(cfg)
    eod = spec.eod if cfg.data.isolated else None
    if eod is not None and eod < 0:
        raise ConfigError(
            "data.packing is isolated but the data names no end-of-document token (raw "
            ".bin/.idx prefixes without data.tokenizer); set data.tokenizer, or "
            "data.packing: concat"
        )
    val = cfg.validation
    has_held_out = bool(spec.valid) if cfg.data.split is None else cfg.data.split[1] > 0
    if val is not None and not has_held_out:
        raise ConfigError(
            f"validation is on (every {val.interval} iterations) but the data has no held-out "
            "part: prepare it with --valid-fraction, set data.split (e.g. [99, 1, 0]), or set "
            "validation: null"
        )
    return spec, eod


def run_line(cfg: RunConfig, record: ResolvedConfigRecord, iters: int) -> str:
    """The resolved run, after --set: ``run: 10 iterations (schedule.iterations from --set) of
    16 x 128 tokens = 20.5k tokens`` (a recipe's description may name other numbers)."""
    prov = record.provenance
    if cfg.schedule.iterations is not None:
        why = f"schedule.iterations from {prov.get('schedule.iterations', 'default')}"
    else:
        src = prov.get("schedule.train_tokens", "default")
        why = f"schedule.train_tokens {count(cfg.schedule.train_tokens or 0)} from {src}"
    g, seq = cfg.batch.global_, cfg.data.seq_length
    return (
        f"run: {iters:,} iterations ({why}) of {g} x {seq} tokens = {count(iters * g * seq)} tokens"
    )


def announce(
    console: Callable[[str], None],
    cfg: RunConfig,
    record: ResolvedConfigRecord,
    world: int,
    accum: int,
    iters: int,
) -> None:
    """What the run trains, for how long, and what it will not do (no checkpoints, fewer GPUs
    than the recipe plans)."""
    console(f"training {record.name}: {cfg.description or '(no description)'}")
    console(f"model {cfg.preset}: {cfg.model.description or '(no description)'}")
    console(run_line(cfg, record, iters))
    if not cfg.checkpoint.enabled:
        console(
            "warning: checkpoint.enabled is false: this run saves no checkpoint; a crash or a "
            "stop loses it"
        )
    p, g, micro = cfg.parallelism, cfg.batch.global_, cfg.batch.micro
    if p.num_gpus != world:
        console(
            f"note: the recipe plans {p.num_gpus} GPUs; running on {world} process(es), "
            f"so each step accumulates {accum} micro-batches of {micro} to keep the "
            f"global batch of {g}"
        )


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators (every rank the same: the same initialisation)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_same_kind(run: RunDir, record: ResolvedConfigRecord) -> None:
    """A run directory holds one kind of run: zebractl's model, or a reference (FLA's class)."""
    if not run.config_path.is_file():
        return
    try:
        before = run.read_config().reference
    except Exception:  # noqa: BLE001 - an unreadable record is reported when it is rewritten
        before = record.reference
    if before != record.reference:

        def what(ref: str | None) -> str:
            return "zebractl's model" if ref is None else f"the {ref} reference"

        raise ConfigError(
            f"{run.root} holds a run of {what(before)}; this one trains "
            f"{what(record.reference)}: choose another --output"
        )


def write_config(run: RunDir, record: ResolvedConfigRecord, console: Callable[[str], None]) -> None:
    """Rank 0: the run directory and its resolved config, noting what differs from the config
    the directory was started with."""
    run.create()
    changed = run.config_changes(record)
    if changed:
        console(
            "note: the config differs from the one this run directory was started "
            "with: " + ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")
        )
    run.write_config(record)


def build_datasets(cfg: RunConfig, spec: Any, iters: int, cache: Path) -> tuple[Any, Any]:
    """The training and held-out datasets (megatron's GPTDataset, or the masked one for chat
    data) for ``iters`` steps and the validation's; a held-out part too small for one sample is a
    :class:`ConfigError`."""
    from zebractl.train.data import build_datasets as build

    g, val = cfg.batch.global_, cfg.validation
    train_ds, valid_ds = build(
        cfg, spec, iters * g, val.iterations * g if val is not None else 0, cache
    )
    if val is not None and valid_ds is None:
        raise ConfigError(
            "the held-out part of the data holds no whole sample of data.seq_length "
            f"{cfg.data.seq_length} tokens; give it a larger share (data.split or "
            "--valid-fraction) or set validation: null"
        )
    return train_ds, valid_ds


def build_engine(
    cfg: RunConfig,
    record: ResolvedConfigRecord,
    device: Any,
    world: int,
    accum: int,
    console: Callable[[str], None],
) -> tuple[Any, Any]:
    """The engine holding the model (FLA's class for a reference run) and, where
    ``kernels.cuda_graph`` serves, the CUDA-graphed micro-step (else None)."""
    from zebractl.train.cuda_graph import maybe_graphed
    from zebractl.train.engine import build_engine as build

    reference = record.reference  # a reference run: FLA's class of the model
    engine = build(cfg, device, world, cfg.seed, reference=reference)
    if reference is None:
        return engine, maybe_graphed(cfg, engine, accum, console)
    console(f"reference run: FLA's {type(engine.model.hf).__name__}, zebractl's init")
    if cfg.recompute.mode != "none":
        console(
            f"note: recompute.mode {cfg.recompute.mode} applies to zebractl's model; "
            "FLA's class trains without it (the same losses, more memory)"
        )
    return engine, None


def device_name(device: Any) -> str:
    """``cuda (NAME)`` or ``cpu``, for the config history."""
    if device.type != "cuda":
        return "cpu"
    import torch

    return f"cuda ({torch.cuda.get_device_name(device)})"


def open_metrics(
    cfg: RunConfig,
    run: RunDir,
    record: ResolvedConfigRecord,
    iteration: int,
    rank: int,
    console: Callable[[str], None],
) -> Any:
    """The run's :class:`~zebractl.run.metrics.MetricsWriter` (files and W&B on rank 0 only)."""
    from zebractl.run.metrics import MetricsWriter
    from zebractl.run.tracking import open_tracker

    log = cfg.logging
    return MetricsWriter(
        run,
        resumed_at=iteration,
        jsonl=log.jsonl and rank == 0,
        tensorboard=log.tensorboard and rank == 0,
        note=console,
        tracker=open_tracker(run, record, log.wandb, console) if rank == 0 else None,
        lineage=run.lineage(),
    )


def build_scheduler(cfg: RunConfig, optimizer: Any, iters: int) -> Any:
    """megatron's ``OptimizerParamScheduler``, counted in samples: linear warmup from 0, then the
    decay style down to ``min_lr``; constant weight decay."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    s, g = cfg.schedule, cfg.batch.global_
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=s.lr,
        min_lr=s.min_lr,
        lr_warmup_steps=s.warmup_iterations * g,
        lr_decay_steps=max(iters * g, s.warmup_iterations * g + 1),
        lr_decay_style=s.decay_style,
        start_wd=cfg.optimizer.weight_decay,
        end_wd=cfg.optimizer.weight_decay,
        wd_incr_steps=iters * g,
        wd_incr_style="constant",
    )


def peak_flops(device: Any) -> float | None:
    """The GPU's dense bf16 peak (FLOP/s) for MFU, where it is known (None on CPU or elsewhere)."""
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def init_weights(
    model: Any, engine: Any, init_from: Path, m: Any, warn: Callable[[str], None] = print
) -> Any:
    """``init_from``: a run, a checkpoint or a Hugging Face folder's weights into the built model
    (a fresh optimizer and schedule). Returns the checkpoint it came from (None: an HF folder);
    each damaged checkpoint passed over to reach it is named through ``warn``."""
    from zebractl.hf import load as hf_load
    from zebractl.run import checkpoint as ckpt

    loaded = None
    if hf_load.is_hf_folder(init_from):  # a Hugging Face export (ours or FLA's)
        ckpt.load_model_state(model, hf_load.state_for(model, init_from, m))
    else:
        skipped: list[str] = []
        loaded = ckpt.load_weights(init_from, model, skipped)
        for line in skipped:
            warn(f"warning: init_from: skipped damaged checkpoint {line}")
    engine.reload_model_params()
    return loaded


def init_record(init_from: Path, given_by: str, loaded: Any, run_id: str) -> InitRecord:
    """``RUN/init.json``: the weights a run started from (``loaded``: the checkpoint, None for a
    Hugging Face folder) and the run that wrote them."""
    import time

    folder = loaded.folder.resolve() if loaded is not None else None
    run = RunDir.containing(folder) if folder is not None else None
    return InitRecord(
        init_from=str(init_from),
        given_by=given_by,
        path=str(init_from.resolve()),
        kind="hf" if loaded is None else "checkpoint",
        checkpoint=str(folder) if folder is not None else None,
        iteration=loaded.iteration if loaded is not None else None,
        run=str(run) if run is not None else None,
        run_id=run_id,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
