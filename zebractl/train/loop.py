"""The training loop: one process per device (CPU, one GPU, or torchrun data parallelism).

Pieces: the model from :mod:`zebractl.model` held by one of two engines
(:mod:`zebractl.train.engine`: megatron-core DDP + the Megatron optimizer with bf16 parameters and fp32
main parameters, or torch DDP + fused ``torch.optim.AdamW`` over fp32 parameters under bf16 autocast as
FLA trains), megatron-core's GPTDataset over the prepared data with consumed-samples bookkeeping,
megatron's ``OptimizerParamScheduler`` (linear warmup from 0, then the decay style, counted in
samples), gradient accumulation up to the global batch, global-norm clipping, torch_dist checkpoints
(:mod:`zebractl.train.checkpoint`), metrics (console, ``metrics.jsonl``, TensorBoard) and the
non-finite guard (stop, or skip the update and count it).

Determinism: the data order is a function of (seed, consumed samples) and every random state is
checkpointed, so a run killed and resumed from a checkpoint reproduces the uninterrupted run's losses
bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zebractl import __version__
from zebractl.config.errors import ConfigError
from zebractl.planning.flops import flops_per_token
from zebractl.schemas.recipe import RunConfig
from zebractl.train import checkpoint as ckpt

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}


class TrainingError(RuntimeError):
    """A run stopped for a reason the user must see (NaN loss, data exhausted, ...): exit 1."""


@dataclass
class RunResult:
    """What a run did."""

    iterations: int
    resumed_from: int | None
    final_loss: float | None
    checkpoint: Path | None
    stopped: str  # "done" | "interrupted" | "limit"
    skipped: int = 0  # updates skipped for a non-finite loss or gradient (nonfinite.action skip)


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class _Batches:
    """Micro-batches of the global batch for this rank, starting at a consumed-samples offset."""

    def __init__(self, dataset: Any, micro: int, global_: int, rank: int, world: int) -> None:
        self.dataset, self.micro, self.global_ = dataset, micro, global_
        self.rank, self.world = rank, world

    def step(self, consumed: int) -> Iterator[dict[str, torch.Tensor]]:
        per_rank = self.global_ // self.world
        start = consumed + self.rank * per_rank
        if consumed + self.global_ > len(self.dataset):
            raise TrainingError(
                f"out of data: the step after {consumed:,} samples needs "
                f"{self.global_} more but the dataset has {len(self.dataset):,}"
            )
        for m in range(per_rank // self.micro):
            idx = range(start + m * self.micro, start + (m + 1) * self.micro)
            items = [self.dataset[i] for i in idx]
            yield {
                k: torch.stack([torch.as_tensor(it[k]) for it in items])
                for k in ("tokens", "labels", "loss_mask")
            }


class Metrics:
    """Console (rank 0), OUTPUT/metrics.jsonl and TensorBoard event files."""

    def __init__(
        self, output: Path, cfg: RunConfig, resumed_at: int, console: Callable, write: bool = True
    ) -> None:
        self.console = console
        self.path = output / "metrics.jsonl" if cfg.logging.jsonl and write else None
        if self.path is not None and self.path.exists():
            keep = [
                ln
                for ln in self.path.read_text(encoding="utf-8").splitlines()
                if ln and json.loads(ln).get("iteration", 0) <= resumed_at
            ]
            self.path.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
        self.tb = None
        if cfg.logging.tensorboard and write:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(output / "tensorboard"), purge_step=resumed_at + 1)
            except ImportError:
                console(
                    "note: TensorBoard is not installed; logging to metrics.jsonl only "
                    "(pip install tensorboard)"
                )

    def log(self, row: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "iteration" and isinstance(v, int | float) and v is not None:
                    self.tb.add_scalar(f"train/{k}", v, row["iteration"])
            self.tb.flush()
        parts = [
            f"iter {row['iteration']:>6}",
            f"loss {row['loss']:.4f}",
            f"lr {row['lr']:.3e}",
            f"grad {row['grad_norm']:.3f}",
            f"{row['tokens_per_s']:,.0f} tok/s",
        ]
        if row.get("tflops_per_gpu") is not None:
            parts.append(f"{row['tflops_per_gpu']:.1f} TFLOP/s")
        if row.get("mfu") is not None:
            parts.append(f"MFU {100 * row['mfu']:.1f}%")
        if row.get("memory_gib") is not None:
            parts.append(f"mem {row['memory_gib']:.1f} GiB")
        self.console(" | ".join(parts))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def run(
    cfg: RunConfig,
    output: Path,
    *,
    config_doc: dict[str, Any],
    init_from: Path | None = None,
    stop_after: int | None = None,
    console: Callable[[str], None] = print,
) -> RunResult:
    """Train ``cfg`` into ``output``; resumes per ``checkpoint.resume``. ``stop_after`` ends this
    process after that many iterations (tests simulate a kill with it)."""
    from megatron.core import parallel_state
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from zebractl.runtime import dist, megatron_compat
    from zebractl.train.data import build_datasets, resolve_data
    from zebractl.train.engine import build_engine, check_engine

    megatron_compat.apply()
    p = cfg.parallelism
    if (p.tp, p.pp, p.cp) != (1, 1, 1):
        raise ConfigError(
            "tensor, pipeline and context parallelism are not supported by "
            "`zebractl train` yet; use parallelism.tp=pp=cp=1"
        )
    dist.ensure_initialized()
    import torch.distributed as tdist

    world, rank = tdist.get_world_size(), tdist.get_rank()
    g, micro = cfg.batch.global_, cfg.batch.micro
    if g % (micro * world):
        raise ConfigError(
            f"batch.global {g} is not a multiple of batch.micro {micro} x {world} process(es)"
        )
    if p.num_gpus != world:
        console(
            f"note: the recipe plans {p.num_gpus} GPUs; running on {world} process(es), so "
            f"each step accumulates {g // (micro * world)} micro-batches of {micro} to keep "
            f"the global batch of {g}"
        )
    iters = cfg.schedule.iterations or -(
        -(cfg.schedule.train_tokens or 0) // (g * cfg.data.seq_length)
    )
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )

    check_engine(cfg, device)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    output.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else output / "checkpoints"

    spec = resolve_data(cfg)
    train_ds, _, _ = build_datasets(cfg, spec, (iters * g, 0, 0), output / "data_cache")
    batches = _Batches(train_ds, micro, g, rank, world)

    # every rank builds the same seeded initialisation; both engines average gradients over ranks
    engine = build_engine(cfg, device, world, cfg.seed)
    model, opt = engine.model, engine.optimizer
    s = cfg.schedule
    sched = OptimizerParamScheduler(
        opt,
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

    md = {
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
    }

    def state(iteration: int, consumed: int, skipped: int) -> dict[str, Any]:
        return {
            "model": model.sharded_state_dict(metadata=md),
            # the same on every rank for both engines: common state, resumable on any DP size
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": _rng_state(),
            "iteration": iteration,
            "consumed_samples": consumed,
            "skipped_iterations": skipped,
            "zebractl_version": __version__,
            "config": config_doc,
        }

    iteration = consumed = skipped = 0
    resumed_from = None
    found = ckpt.valid_checkpoints(ckpt_root) if cfg.checkpoint.resume != "never" else []
    if cfg.checkpoint.resume == "require" and not found:
        raise ConfigError(
            f"checkpoint.resume is 'require' but {ckpt_root} holds no complete checkpoint"
        )
    if found:
        it0, folder = found[-1]
        marker = ckpt.read_marker(folder)
        saved = (
            marker.get("optimizer_impl", "torch_fused"),
            marker.get("distributed_optimizer", False),
        )
        if saved != (engine.impl, engine.distributed):
            raise ConfigError(
                f"{folder} holds the optimizer state of optimizer.impl '{saved[0]}' with "
                f"parallelism.distributed_optimizer {str(saved[1]).lower()}, but this run uses "
                f"'{engine.impl}' with {str(engine.distributed).lower()}; resume with the same "
                "settings, or start a new output directory with --init-from to keep the weights"
            )
        loaded = ckpt.load(folder, state(0, 0, 0))
        model.load_state_dict(loaded["model"], strict=False)
        opt.load_state_dict(loaded["optimizer"])
        sched.load_state_dict(loaded["scheduler"])
        _set_rng_state(loaded["rng"])
        iteration, consumed, resumed_from = loaded["iteration"], loaded["consumed_samples"], it0
        skipped = loaded.get("skipped_iterations", 0)
        console(f"resumed from {folder} (iteration {iteration}, {consumed:,} samples consumed)")
    elif init_from is not None:
        weights = ckpt.valid_checkpoints(init_from) if init_from.is_dir() else []
        folder = weights[-1][1] if weights else init_from
        template = {"model": model.sharded_state_dict(metadata=md)}
        model.load_state_dict(ckpt.load(folder, template)["model"], strict=False)
        engine.reload_model_params()
        console(f"initialised weights from {folder} (fresh optimizer and schedule)")

    flops_tok = flops_per_token(cfg.model, cfg.data.seq_length).training
    peak = next(
        (
            v
            for k, v in PEAK_BF16_FLOPS.items()
            if device.type == "cuda" and k in torch.cuda.get_device_name()
        ),
        None,
    )
    metrics = Metrics(
        output, cfg, iteration, console if rank == 0 else (lambda _: None), write=rank == 0
    )
    accum = g // (micro * world)
    guard = cfg.nonfinite
    window_loss, window_steps, window_skipped, t_last = 0.0, 0, 0, time.perf_counter()
    final_loss = None
    saved: Path | None = None
    stopped = "done"
    run_steps = 0

    def save_now() -> Path:
        return ckpt.save(
            ckpt_root,
            iteration,
            state(iteration, consumed, skipped),
            {
                "iteration": iteration,
                "consumed_samples": consumed,
                "optimizer_impl": engine.impl,
                "distributed_optimizer": engine.distributed,
                "zebractl_version": __version__,
            },
            cfg.checkpoint.keep_last,
            is_writer=rank == 0,
        )

    try:
        while iteration < iters:
            if stop_after is not None and run_steps >= stop_after:
                stopped = "limit"
                break
            model.train()
            engine.zero_grad()
            loss_acc = torch.zeros((), device=device)
            for n_mb, mb in enumerate(batches.step(consumed), 1):
                mb = {k: v.to(device, non_blocking=True) for k, v in mb.items()}
                # reduce gradients across ranks once, on the last micro-batch of the step
                ctx = contextlib.nullcontext() if n_mb == accum else engine.no_sync()
                with (
                    ctx,
                    torch.autocast(device.type, dtype=torch.bfloat16, enabled=engine.autocast),
                ):
                    loss_sum, ntok = engine.forward(
                        mb["tokens"], labels=mb["labels"], loss_mask=mb["loss_mask"]
                    )
                    loss = loss_sum / ntok.clamp(min=1) / accum
                    loss.backward()
                loss_acc += loss.detach()
            engine.finish_grads()
            iteration += 1
            run_steps += 1
            consumed += g
            if guard.action == "skip" and not _all_finite(loss_acc, engine, world):
                # one host sync per step, the price of deciding before the update
                skipped += 1
                window_skipped += 1
                console(f"iteration {iteration}: non-finite loss or gradient; update skipped")
                if guard.max_skipped and skipped > guard.max_skipped:
                    raise TrainingError(
                        f"{skipped} updates skipped for non-finite values by iteration "
                        f"{iteration} (nonfinite.max_skipped is {guard.max_skipped}); stopping"
                    )
            else:
                grad_norm = engine.step()
                sched.step(increment=g)
                window_loss += loss_acc
                window_steps += 1
            if (iteration % cfg.logging.interval == 0 or iteration == iters) and window_steps:
                mean = window_loss / window_steps
                if world > 1:  # SUM then divide: gloo has no AVG
                    tdist.all_reduce(mean)
                    mean = mean / world
                value = mean.item()  # the one host sync per interval
                if not math.isfinite(value):
                    raise TrainingError(
                        f"the loss is {value} at iteration {iteration} (averaged over the last "
                        "logging interval); stopping (--set nonfinite.action=skip drops such "
                        "updates instead)"
                    )
                now = time.perf_counter()
                tps = (
                    (window_steps + window_skipped)
                    * g
                    * cfg.data.seq_length
                    / (now - t_last)
                    / world
                )
                tflops = tps * flops_tok / 1e12
                row = {
                    "iteration": iteration,
                    "loss": value,
                    "lr": opt.param_groups[0]["lr"],
                    "grad_norm": float(grad_norm),
                    "tokens_per_s": tps,
                    "tflops_per_gpu": tflops if device.type == "cuda" else None,
                    "mfu": tflops * 1e12 / peak if peak else None,
                    "memory_gib": (
                        torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
                    ),
                    "consumed_samples": consumed,
                    "skipped": window_skipped,
                }
                if rank == 0:
                    metrics.log(row)
                final_loss = value
                window_loss, window_steps, window_skipped = 0.0, 0, 0
                t_last = time.perf_counter()
            if iteration % cfg.checkpoint.interval == 0 or iteration == iters:
                saved = save_now()
    except KeyboardInterrupt:
        console(f"interrupted at iteration {iteration}: saving a checkpoint")
        saved = save_now()
        stopped = "interrupted"
    finally:
        metrics.close()
    return RunResult(iteration, resumed_from, final_loss, saved, stopped, skipped)


def _all_finite(loss: torch.Tensor, engine: Any, world: int) -> bool:
    """Whether the step's loss and every gradient are finite on every rank."""
    import torch.distributed as tdist

    bad = (~(torch.isfinite(loss) & engine.grads_finite())).to(torch.float32).reshape(1)
    if world > 1:
        tdist.all_reduce(bad)
    return bad.item() == 0
