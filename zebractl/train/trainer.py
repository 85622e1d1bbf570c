"""The Trainer: one process per device (CPU, one GPU, or a rank of torchrun / Slurm).

``setup`` builds everything from the resolved config: the model held by one of two engines
(:mod:`zebractl.train.engine`), megatron's GPTDataset over the prepared data read by a DataLoader in
consumed-samples order, megatron's ``OptimizerParamScheduler`` (linear warmup from 0, then the decay
style, counted in samples), and resumes from the newest intact checkpoint of the run directory
(:mod:`zebractl.run`). ``train_step`` is one optimizer step (gradient accumulation up to the global
batch, clipping, the non-finite guard); ``evaluate`` is the loss on the held-out data; ``save`` writes a
checkpoint; ``fit`` runs them with metrics, validation and checkpoint intervals.

Checkpoints are the :class:`~zebractl.train.checkpointer.Checkpointer`'s: when to save, sync or
async (``checkpoint.async_save``), the disk checks, which checkpoint to resume from; the Trainer
hands it its state and loads what it chooses. A run never returns (nor exits on a signal) with a
save unfinished; after an error the save in flight is abandoned incomplete.

Stopping: SIGINT, SIGTERM and SIGUSR1 set a flag that is read only between steps (agreed by all
ranks), so the checkpoint written on a stop holds exactly the last completed step, and the run
resumed from it reproduces the uninterrupted run's losses bit for bit: the data order is a function of
(seed, consumed samples) and every random state is checkpointed.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zebractl import __version__
from zebractl.errors import ConfigError, TrainingError
from zebractl.planning.flops import flops_per_token
from zebractl.run import checkpoint as ckpt
from zebractl.run.metrics import MetricsWriter
from zebractl.run.records import (
    CheckpointMarker,
    ResolvedConfigRecord,
    TrainRow,
    ValRow,
)
from zebractl.run.rundir import RunDir
from zebractl.run.tracking import open_tracker
from zebractl.runtime import dist
from zebractl.schemas.recipe import RunConfig, derive
from zebractl.train.checkpointer import Checkpointer, rng_state, set_rng_state, state_bytes
from zebractl.train.progress import Clock, NoBar, Snapshot, duration, row_line, val_line
from zebractl.train.signals import StopFlag

_CPU = torch.device("cpu")


@dataclass
class RunResult:
    """What a run did."""

    iterations: int
    resumed_from: int | None
    final_loss: float | None
    checkpoint: Path | None
    stopped: str  # "done" | "signal" | "limit"
    skipped: int = 0  # updates skipped for a non-finite loss or gradient (nonfinite.action skip)
    signal: int | None = None  # the signal that stopped the run
    val_loss: float | None = None  # the last validation loss
    total: int = 0  # the run's resolved iterations (schedule.iterations or train_tokens)
    tokens: int = 0  # tokens consumed by the run so far (samples x seq_length, resumed ones too)
    wall_s: float = 0.0  # seconds from the start of the run in this process to its end (setup too)
    tokens_per_s: float | None = None  # mean training tokens/s per process over this process's
    # steps (validation and saves excluded, the compile step included); None if it ran none


class Trainer:
    """Trains ``cfg`` into ``run``; see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        run: RunDir,
        record: ResolvedConfigRecord,
        *,
        init_from: Path | None = None,
        stop_after: int | None = None,
        console: Callable[[str], None] = print,
        bar: NoBar | None = None,
    ) -> None:
        """``stop_after`` ends this process after that many steps without saving (a simulated
        kill, for tests); ``bar`` (:class:`zebractl.train.progress.RichBar` on a terminal) shows
        the progress on rank 0 while the loop runs."""
        self.cfg, self.run, self.record = cfg, run, record
        # --init-from, else the recipe's init_from
        self.init_from = init_from if init_from is not None else _path(cfg.init_from)
        self.init_given_by = (
            "--init-from"
            if init_from is not None
            else record.provenance.get("init_from", "default")
        )
        self.stop_after = stop_after
        self._console = console
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.iteration = self.consumed = self.skipped = 0
        self.resumed_from: int | None = None
        self.graphed = None  # kernels.cuda_graph: the graphed micro-step (setup)
        self.flag = StopFlag()
        self.bar = bar if bar is not None else NoBar()
        self._bar_info = "loss n/a"  # the bar's last logged loss and tokens/s
        self.clock = Clock()

    # ---- setup ---------------------------------------------------------------------------------
    def console(self, message: str) -> None:
        """Print on rank 0 only."""
        if self.rank == 0:
            self._console(message)

    def setup(self) -> None:
        """Process group, checks, data, model and engine, schedule, resume, metrics: each step a
        function of :mod:`zebractl.train.setup` or of the Checkpointer, in this order."""
        import torch.distributed as tdist

        from zebractl.train import precompile, setup
        from zebractl.train.engine import check_engine

        cfg = self.cfg
        dist.ensure_initialized()
        self.world, self.rank = tdist.get_world_size(), tdist.get_rank()
        # the Checkpointer prints through the console function itself, not this Trainer's bound
        # method: a reference back to the Trainer would keep it (and its DataLoader's worker
        # processes) alive after the run until the cyclic garbage collector ran
        say = self._console
        rank0 = say if self.rank == 0 else _silent
        self.ckpts = Checkpointer(cfg, self.run, self.rank, self.world, rank0, say)
        self.accum = setup.check_request(cfg, self.record, self.init_from, self.world)
        self.iters = derive(cfg).iterations
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else _CPU
        check_engine(cfg, self.device, self.world)
        spec, self.eod = setup.check_data(cfg)  # eod: documents kept apart
        compiling = precompile.start(cfg, self.device)  # joined at the end of setup
        try:
            self._build(spec)
        except BaseException:
            # the compile threads run C++ (nvcc, ptxas): an interpreter exiting under them aborts
            # the process (exit 134) instead of reporting the error
            if compiling is not None:
                self.console("setup failed: waiting for the background kernel compilation to end")
                compiling.join()
            raise
        if compiling is not None:
            self.console(compiling.join())
        self.flops_tok = flops_per_token(cfg.model, cfg.data.seq_length).training
        self.peak = setup.peak_flops(self.device)

    def _build(self, spec: Any) -> None:
        """The rest of :meth:`setup`, while the kernels compile: the run directory, datasets,
        engine, scheduler, resume and metrics."""
        import torch.distributed as tdist

        from zebractl.train import setup
        from zebractl.train.cuda_graph import maybe_graphed
        from zebractl.train.data import build_datasets
        from zebractl.train.engine import build_engine

        cfg, g, val = self.cfg, self.cfg.batch.global_, self.cfg.validation
        setup.announce(self.console, cfg, self.record, self.world, self.accum, self.iters)
        setup.seed_everything(cfg.seed)
        setup.check_same_kind(self.run, self.record)
        if self.rank == 0:
            with self._writing("the resolved config", self.run.config_path):
                setup.write_config(self.run, self.record, self.console)
            self.ckpts.remove_incomplete()
        tdist.barrier()

        with self._writing("the dataset index cache (safe to delete)", self.run.data_cache):
            self.train_ds, self.valid_ds = build_datasets(
                cfg,
                spec,
                self.iters * g,
                val.iterations * g if val is not None else 0,
                self.run.data_cache,
            )
        if val is not None and self.valid_ds is None:
            raise ConfigError(
                "the held-out part of the data holds no whole sample of data.seq_length "
                f"{cfg.data.seq_length} tokens; give it a larger share (data.split or "
                "--valid-fraction) or set validation: null"
            )

        # every rank builds the same seeded initialisation; both engines average gradients over ranks
        reference = self.record.reference  # a reference run: FLA's class of the model
        self.engine = build_engine(cfg, self.device, self.world, cfg.seed, reference=reference)
        self.model = self.engine.model
        if reference is None:
            self.graphed = maybe_graphed(cfg, self.engine, self.accum, self.console)
        else:
            self.console(f"reference run: FLA's {type(self.model.hf).__name__}, zebractl's init")
            if cfg.recompute.mode != "none":
                self.console(
                    f"note: recompute.mode {cfg.recompute.mode} applies to zebractl's model; "
                    "FLA's class trains without it (the same losses, more memory)"
                )
        self.sched = setup.build_scheduler(cfg, self.engine.optimizer, self.iters)
        self.max_skipped = cfg.nonfinite.max_skipped if cfg.nonfinite.action == "skip" else None
        # an async saver's pinned host memory, reserved on a GPU while training starts
        cuda = self.device.type == "cuda"
        staged = state_bytes(self.model, self.engine.impl, self.world) if cuda else None
        self.ckpts.start_async(staged, dist.cpu_group() if self.world > 1 else None)
        self._resume()
        if self.rank == 0:  # config.history.jsonl: each start's config and iteration, appended
            with self._writing("the config history", self.run.history_path):
                self.run.record_start(
                    self.record, iteration=self.iteration, resumed=self.resumed_from is not None,
                    run_id=self.run_id, world_size=self.world,
                    device=f"cuda ({torch.cuda.get_device_name(self.device)})" if cuda else "cpu",
                )  # fmt: skip
        with self._writing("the metrics", self.run.metrics_path):
            self.metrics = MetricsWriter(
                self.run,
                resumed_at=self.iteration,
                jsonl=cfg.logging.jsonl and self.rank == 0,
                tensorboard=cfg.logging.tensorboard and self.rank == 0,
                note=self.console,
                tracker=(
                    open_tracker(self.run, self.record, cfg.logging.wandb, self.console)
                    if self.rank == 0
                    else None
                ),
            )
        self._batches = self._train_batches()

    def _train_batches(self):
        from zebractl.train.data import ConsumedSamplesSampler, loader

        c = self.cfg
        sampler = ConsumedSamplesSampler(
            len(self.train_ds), self.consumed, c.batch.micro, c.batch.global_, self.rank, self.world
        )
        return iter(loader(self.train_ds, sampler, c.data.num_workers, self.device.type == "cuda"))

    # ---- checkpoints ---------------------------------------------------------------------------
    def _state(self, is_loading: bool = False) -> dict[str, Any]:
        model_sd = self.model.sharded_state_dict(metadata=ckpt.sharded_metadata())
        return {
            "model": model_sd,
            "optimizer": self.engine.sharded_optimizer_state(model_sd, is_loading),
            "scheduler": self.sched.state_dict(),
            "rng": rng_state(),
            "iteration": self.iteration,
            "consumed_samples": self.consumed,
            "skipped_iterations": self.skipped,
            "zebractl_version": __version__,
            "config": self.record.model_dump(mode="json"),
        }

    def _resume(self) -> None:
        cfg, root = self.cfg, self.run.checkpoints
        if cfg.checkpoint.resume != "never":
            self.resumed_from = self.ckpts.resume_newest_intact(self._load_checkpoint)
        if self.resumed_from is not None:
            self.console(
                f"resumed from {ckpt.checkpoint_dir(root, self.resumed_from)} (iteration "
                f"{self.iteration} of {self.iters}, {self.consumed:,} samples consumed)"
            )
            return
        if cfg.checkpoint.resume == "require":
            raise ConfigError(
                f"checkpoint.resume is 'require' but {root} holds no complete checkpoint"
            )
        if self.init_from is not None:
            from zebractl.train.setup import init_weights

            loaded = init_weights(self.model, self.engine, self.init_from, cfg.model)
            where = loaded.folder if loaded is not None else self.init_from
            self.console(f"initialised weights from {where} (fresh optimizer and schedule)")
            if self.rank == 0:  # what compare's before/after report pairs the run with
                self._write_init(loaded)
        elif self.rank == 0 and self.run.init_path.is_file():  # a fresh start: not from those
            with self._writing("the init record", self.run.init_path):
                self.run.init_path.unlink()

    def _write_init(self, loaded: ckpt.Checkpoint | None) -> None:
        """``RUN/init.json``: the weights this run started from (:class:`InitRecord`)."""
        from zebractl.train.setup import init_record

        assert self.init_from is not None
        record = init_record(self.init_from, self.init_given_by, loaded, self.run_id)
        with self._writing("the init record", self.run.init_path):
            self.run.write_init(record)

    def _load_checkpoint(self, found: ckpt.Checkpoint) -> None:
        m = found.marker
        saved = (m.optimizer_impl, m.distributed_optimizer)
        if saved != (self.engine.impl, self.engine.distributed):
            raise ConfigError(
                f"{found.folder} holds the optimizer state of optimizer.impl '{saved[0]}' with "
                f"parallelism.distributed_optimizer {str(saved[1]).lower()}, but this run uses "
                f"'{self.engine.impl}' with {str(self.engine.distributed).lower()}; resume with "
                "the same settings, or start a new output directory with --init-from to keep the "
                "weights"
            )
        loaded = ckpt.load(found.folder, self._state(is_loading=True))
        ckpt.load_model_state(self.model, loaded["model"])
        self.engine.load_optimizer_state(loaded["optimizer"])
        self.sched.load_state_dict(loaded["scheduler"])
        set_rng_state(loaded["rng"])
        self.iteration = loaded["iteration"]
        self.consumed = loaded["consumed_samples"]
        self.skipped = loaded.get("skipped_iterations", 0)

    def _marker(self) -> CheckpointMarker:
        return CheckpointMarker(
            iteration=self.iteration,
            consumed_samples=self.consumed,
            skipped_iterations=self.skipped,
            optimizer_impl=self.engine.impl,
            distributed_optimizer=self.engine.distributed,
            world_size=self.world,
            run_id=self.run_id,
            zebractl_version=__version__,
        )

    def save(self) -> Path:
        """Checkpoint the current step (collective); returns its folder (async: being written)."""
        return self.ckpts.save(self.iteration, self._state(), self._marker(), self._params())

    def _params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def _writing(
        self, what: str, path: Path, need: float = 0.0
    ) -> contextlib.AbstractContextManager:
        """A write of this run: a full or read-only disk becomes a :class:`disk.DiskError`."""
        return self.ckpts.writing(what, path, need)

    # ---- steps ---------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.engine.autocast)

    def train_step(self) -> tuple[torch.Tensor | None, Any]:
        """One optimizer step over a global batch; returns (loss, grad norm), loss None if the
        update was skipped for a non-finite value. Counters advance only when the step is done."""
        engine, device = self.engine, self.device
        self.model.train()
        engine.zero_grad()
        loss_acc = torch.zeros((), device=device)
        batches = [self._next_batch() for _ in range(self.accum)]
        scale = self._chat_scale(batches) if self.cfg.data.format == "chat" else None
        for n_mb, mb in enumerate(batches, 1):
            # reduce gradients across ranks once, on the last micro-batch of the step
            if self.graphed is not None:  # one GPU: nothing to reduce across ranks
                loss_acc += self.graphed(mb["tokens"], mb["labels"], mb["loss_mask"])
                continue
            ctx = contextlib.nullcontext() if n_mb == self.accum else engine.no_sync()
            with ctx, self._autocast():
                loss_sum, ntok = engine.forward(
                    mb["tokens"], labels=mb["labels"], loss_mask=mb["loss_mask"], **mb["extra"]
                )
                if scale is None:  # every token trained on: the micro-batch means, averaged
                    loss = loss_sum / ntok.clamp(min=1) / self.accum
                else:  # the mean over the global batch's marked tokens (ranks average gradients)
                    loss = loss_sum * scale
                loss.backward()
            loss_acc += loss.detach()
        engine.finish_grads()
        result: tuple[torch.Tensor | None, Any]
        if self.max_skipped is not None and not self._all_finite(loss_acc):
            # one host sync per step, the price of deciding before the update
            self.skipped += 1
            result = (None, None)
        else:
            grad_norm = engine.step()
            self.sched.step(increment=self.cfg.batch.global_)
            result = (loss_acc, grad_norm)
        self.iteration += 1
        self.consumed += self.cfg.batch.global_
        return result

    def _next_batch(self) -> dict[str, torch.Tensor]:
        """This rank's next micro-batch, on the device."""
        try:
            mb = next(self._batches)
        except StopIteration:
            raise TrainingError(
                f"out of data: the step after {self.consumed:,} samples needs "
                f"{self.cfg.batch.global_} more but the dataset has {len(self.train_ds):,}"
            ) from None
        return self._on_device(mb)

    def _on_device(self, mb: dict[str, Any]) -> dict[str, Any]:
        """A loader's micro-batch on the device; ``extra`` holds the model's other arguments
        (``segments`` when documents are kept apart)."""
        from zebractl.train.data import keep_documents_apart

        out: dict[str, Any] = {k: v.to(self.device, non_blocking=True) for k, v in mb.items()}
        out["extra"] = {}
        if self.eod is not None:
            out["extra"]["segments"] = keep_documents_apart(out, self.eod)
        return out

    def _chat_scale(self, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """``world / marked tokens of the global batch`` (data.format chat): each micro-batch's
        summed loss times it gives, after the ranks average their gradients, the mean over every
        marked token of the step, whatever the micro-batch and accumulation split."""
        import torch.distributed as tdist

        marked = sum(mb["loss_mask"].sum() for mb in batches).float()
        if self.world > 1:
            tdist.all_reduce(marked)
        return self.world / marked.clamp(min=1)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """Whether the step's loss and every gradient are finite on every rank."""
        import torch.distributed as tdist

        bad = (~(torch.isfinite(loss) & self.engine.grads_finite())).to(torch.float32).reshape(1)
        if self.world > 1:
            tdist.all_reduce(bad)
        return bad.item() == 0

    @torch.no_grad()
    def evaluate(self) -> ValRow:
        """Mean loss over ``validation.iterations`` global batches of held-out data (the same
        samples every time), over all ranks."""
        import torch.distributed as tdist

        from zebractl.train.data import ConsumedSamplesSampler, loader

        c, val = self.cfg, self.cfg.validation
        assert val is not None and self.valid_ds is not None
        n = min(len(self.valid_ds), val.iterations * c.batch.global_)
        sampler = ConsumedSamplesSampler(
            n, 0, c.batch.micro, c.batch.global_, self.rank, self.world
        )
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        self.model.eval()
        try:
            for mb in loader(
                self.valid_ds, sampler, c.data.num_workers, self.device.type == "cuda"
            ):
                mb = self._on_device(mb)
                with self._autocast():
                    loss_sum, ntok = self.engine.forward(
                        mb["tokens"], labels=mb["labels"], loss_mask=mb["loss_mask"], **mb["extra"]
                    )
                total += torch.stack([loss_sum.double(), ntok.double()])
        finally:
            self.model.train()
        if self.world > 1:
            tdist.all_reduce(total)
        loss_sum, tokens = total.tolist()
        loss = loss_sum / tokens if tokens else math.nan
        finite = math.isfinite(loss)
        return ValRow(
            iteration=self.iteration,
            val_loss=loss if finite else None,
            val_ppl=math.exp(loss) if finite and loss < 700 else None,
            tokens=int(tokens),
            wall_time=time.time(),
            run_id=self.run_id,
        )

    def _stop_requested(self) -> int | None:
        """The stop signal, agreed by all ranks at a step boundary (one tiny CPU all-reduce)."""
        import torch.distributed as tdist

        signum = self.flag.signum or 0
        if self.world > 1:
            t = torch.tensor([signum], dtype=torch.int64)
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX, group=dist.cpu_group())
            signum = int(t.item())
        return signum or None

    # ---- the loop ------------------------------------------------------------------------------
    def fit(self) -> RunResult:
        """Set up, train to the end (or a stop), validate and checkpoint; returns what happened."""
        from zebractl.run import lock
        from zebractl.runtime.dist import launched_world

        writer = launched_world()[0] == 0  # rank 0 holds the run directory's lock
        held = (
            lock.hold(self.run.root, "train", self._console, self.run.checkpoints)
            if writer
            else contextlib.nullcontext()
        )
        # the process group and megatron's parallel state the run creates end with it (a process
        # that trains twice, or trains and then converts, starts each from a clean state)
        with held, self.flag, dist.scoped():
            self.clock = Clock()  # the run starts in this process
            try:
                self.setup()
                return self._loop()
            except BaseException:
                if hasattr(self, "ckpts"):  # no collective now: a save in flight stays a .tmp
                    self.ckpts.abort()
                raise
            finally:
                self.bar.stop()
                if hasattr(self, "metrics"):  # (W&B: failed while an exception propagates)
                    self.metrics.close(failed=sys.exc_info()[0] is not None)
                # the data loader's worker processes end now, not when the Trainer is collected
                self._batches = None

    def _loop(self) -> RunResult:
        cfg = self.cfg
        val_every = cfg.validation.interval if cfg.validation is not None else None
        window_loss, window_steps, window_skipped = torch.zeros((), device=self.device), 0, 0
        grad_norm: Any = None
        t_last = time.perf_counter()
        final_loss = val_loss = None
        saved: Path | None = None
        stopped, signum, run_steps = "done", None, 0
        last_val: int | None = None
        self.clock.begin()
        if self.rank == 0:
            self.bar.start(self.iteration, self.iters)
        while self.iteration < self.iters:
            self.ckpts.poll()
            signum = self._stop_requested()
            if signum is not None:
                stopped = "signal"
                break
            if self.stop_after is not None and run_steps >= self.stop_after:
                stopped = "limit"
                break
            loss, norm = self.train_step()
            run_steps += 1
            if run_steps == 1 and self.device.type == "cuda":
                torch.cuda.synchronize()  # the ETA starts after the first (compiling) step
            self.clock.step_done()
            if loss is None:
                window_skipped += 1
                self.console(
                    f"iteration {self.iteration}: non-finite loss or gradient; update skipped"
                )
                if self.max_skipped and self.skipped > self.max_skipped:
                    raise TrainingError(
                        f"{self.skipped} updates skipped for non-finite values by iteration "
                        f"{self.iteration} (nonfinite.max_skipped is {self.max_skipped}); stopping"
                    )
            else:
                window_loss += loss
                window_steps += 1
                grad_norm = norm
            it = self.iteration
            # iteration 1 is logged alone: the loss at initialisation a parity report compares
            if (it % cfg.logging.interval == 0 or it in (1, self.iters)) and window_steps:
                row = self._train_row(
                    window_loss / window_steps, grad_norm, window_steps, window_skipped, t_last
                )
                self._log(row)
                final_loss = row.loss
                window_loss, window_steps, window_skipped = torch.zeros_like(window_loss), 0, 0
                t_last = time.perf_counter()
            if self.rank == 0:  # the bar's ETA moves every step, its loss when one is logged
                eta = self.clock.eta(self.iters - it)
                self.bar.advance(
                    it, f"{self._bar_info} | ETA {'n/a' if eta is None else duration(eta)}"
                )
            paused = time.perf_counter()  # validation and saves are not training throughput
            if val_every is not None and (it % val_every == 0 or it == self.iters):
                val_loss = self._validate()
                last_val = it
            last = it == self.iters
            saved = (
                self.ckpts.maybe_save(it, last, self._state, self._marker, self._params) or saved
            )
            t_last += time.perf_counter() - paused
            self.clock.pause(time.perf_counter() - paused)
        self.bar.stop()  # (fit stops it after an error)
        if stopped == "signal":
            saved = self._save_on_stop(signum) or saved
        if stopped == "done" and val_every is not None and last_val != self.iteration:
            val_loss = self._validate()
        self.ckpts.wait()  # also the one a stop wrote: complete before the process exits
        return self._result(stopped, signum, final_loss, val_loss, saved, run_steps)

    def _save_on_stop(self, signum: int | None) -> Path | None:
        """A stop by signal: save the last completed step unless it is saved (or being saved)."""
        stopping = f"stopping on {_signame(signum)} after iteration {self.iteration}"
        if not self.cfg.checkpoint.enabled:
            self.console(f"{stopping}: nothing saved (checkpoint.enabled is false)")
            return None
        if self.ckpts.last_saved != self.iteration:
            self.console(f"{stopping}: saving a checkpoint")
            return self.save()
        pending = self.ckpts.pending(self.iteration)
        self.console(stopping + (": completing its checkpoint" if pending else ""))
        return None

    def _result(
        self,
        stopped: str,
        signum: int | None,
        final_loss: float | None,
        val_loss: float | None,
        saved: Path | None,
        run_steps: int,
    ) -> RunResult:
        cfg, seq, training = self.cfg, self.cfg.data.seq_length, self.clock.training()
        return RunResult(
            self.iteration,
            self.resumed_from,
            final_loss,
            saved or self.ckpts.newest(),
            stopped,
            self.skipped,
            signum,
            val_loss,
            total=self.iters,
            tokens=self.consumed * seq,
            wall_s=self.clock.elapsed(),
            tokens_per_s=(
                run_steps * cfg.batch.global_ * seq / (training * self.world)
                if run_steps and training > 0
                else None
            ),
        )

    def _train_row(
        self, mean: torch.Tensor, grad_norm: Any, steps: int, skipped: int, t_last: float
    ) -> TrainRow:
        import torch.distributed as tdist

        if self.world > 1:  # SUM then divide: gloo has no AVG
            tdist.all_reduce(mean)
            mean = mean / self.world
        value = mean.item()  # the one host sync per interval
        norm = float(grad_norm)
        for what, x in (("loss", value), ("gradient norm", norm)):
            if not math.isfinite(x):
                raise TrainingError(
                    f"the {what} is {x} at iteration {self.iteration} (the loss averaged over "
                    "the last logging interval); stopping (--set nonfinite.action=skip drops "
                    "such updates instead)"
                )
        tps = (steps + skipped) * self.cfg.batch.global_ * self.cfg.data.seq_length
        tps /= (time.perf_counter() - t_last) * self.world
        cuda = self.device.type == "cuda"
        tflops = tps * self.flops_tok / 1e12
        return TrainRow(
            iteration=self.iteration,
            loss=value,
            lr=self.engine.optimizer.param_groups[0]["lr"],
            grad_norm=norm,
            tokens_per_s=tps,
            tflops_per_gpu=tflops if cuda else None,
            mfu=tflops * 1e12 / self.peak if self.peak else None,
            memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            consumed_samples=self.consumed,
            skipped=skipped,
            wall_time=time.time(),
            run_id=self.run_id,
        )

    def _log(self, row: TrainRow) -> None:
        if self.rank == 0:
            with self._writing("the metrics", self.run.metrics_path):
                self.metrics.write(row)
        line, self._bar_info = row_line(row, self._snapshot(row))
        self.console(line)

    def _snapshot(self, row: TrainRow) -> Snapshot:
        """The progress fields of a logged row; the step time is the interval's (as its
        tokens/s: steps only)."""
        c = self.cfg
        step = c.batch.global_ * c.data.seq_length / (row.tokens_per_s * self.world)
        return self.clock.snapshot(
            row.iteration, self.iters, row.consumed_samples * c.data.seq_length, step
        )

    def _validate(self) -> float | None:
        row = self.evaluate()
        if self.rank == 0:
            with self._writing("the metrics", self.run.metrics_path):
                self.metrics.write(row)
        self.console(val_line(row, self.iters))
        return row.val_loss


def _silent(message: str) -> None:
    """The console of a rank other than 0."""


def _signame(signum: int | None) -> str:
    from zebractl.train.signals import name

    return name(signum) if signum else "a signal"


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None
