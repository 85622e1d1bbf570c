"""The Trainer: one process per device (CPU, one GPU, or a rank of torchrun / Slurm).

``setup`` builds everything from the resolved config: the model held by one of two engines
(:mod:`zebractl.train.engine`), megatron's GPTDataset over the prepared data read by a DataLoader in
consumed-samples order, megatron's ``OptimizerParamScheduler`` (linear warmup from 0, then the decay
style, counted in samples), and resumes from the newest intact checkpoint of the run directory
(:mod:`zebractl.run`). ``train_step`` is one optimizer step (:class:`~zebractl.train.step.Stepper`:
gradient accumulation up to the global batch, clipping, the non-finite guard); ``evaluate`` is the
loss on the held-out data; ``save`` writes a checkpoint (:mod:`zebractl.train.state` says what it
holds); ``fit`` runs them with metrics (:mod:`zebractl.train.window`), validation and checkpoint
intervals.

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
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zebractl.errors import ConfigError, TrainingError
from zebractl.planning.flops import flops_per_token
from zebractl.run import checkpoint as ckpt
from zebractl.run.records import (
    CheckpointMarker,
    ResolvedConfigRecord,
    TrainRow,
    ValRow,
)
from zebractl.run.rundir import RunDir
from zebractl.runtime import dist
from zebractl.schemas.recipe import RunConfig, derive
from zebractl.train.checkpointer import Checkpointer, state_bytes
from zebractl.train.progress import Clock, NoBar, Snapshot, duration, row_line, val_line
from zebractl.train.result import RunResult
from zebractl.train.signals import StopFlag
from zebractl.train.state import Counters, load_run_state, marker, run_state
from zebractl.train.step import Stepper
from zebractl.train.window import LogWindow, train_row, val_row

_CPU = torch.device("cpu")


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
        self.init_source: Any = None  # what init_from names (zebractl.train.init_source)
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
        if self.init_from is not None:  # before anything is written or loaded
            from zebractl.train.init_source import check_init

            self.init_source = check_init(cfg, self.run, self.init_from, self.init_given_by)
        self.iters = derive(cfg).iterations
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else _CPU
        lean = cfg.kernels.lean_fla_import  # read on every device (the tests read it on the CPU)
        if cuda and lean and cfg.kernels.backend != "torch":
            from zebractl.runtime import fla_import

            fla_import.lean()  # before FLA's first import in this process
        if cuda and cfg.kernels.lazy_framework_compile and cfg.kernels.backend != "torch":
            from zebractl.runtime.lazy_compile import import_frameworks

            import_frameworks(fla=True)  # once this rank's GPU is set: FLA's import queries it
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
        ckpt.writers_started()  # the checkpoint writers' report server, before data workers fork
        self.flops_tok = flops_per_token(cfg.model, cfg.data.seq_length).training
        self.peak = setup.peak_flops(self.device)

    def _build(self, spec: Any) -> None:
        """The rest of :meth:`setup`, while the kernels compile: the run directory, datasets,
        engine, scheduler, resume and metrics."""
        import torch.distributed as tdist

        from zebractl.train import setup

        cfg = self.cfg
        setup.announce(self.console, cfg, self.record, self.world, self.accum, self.iters)
        setup.seed_everything(cfg.seed)
        setup.check_same_kind(self.run, self.record)
        if self.rank == 0:
            with self._writing("the resolved config", self.run.config_path):
                setup.write_config(self.run, self.record, self.console)
            self.ckpts.remove_incomplete()
        tdist.barrier()

        with self._writing("the dataset index cache (safe to delete)", self.run.data_cache):
            self.train_ds, self.valid_ds = setup.build_datasets(
                cfg, spec, self.iters, self.run.data_cache
            )

        # every rank builds the same seeded initialisation; both engines average gradients over ranks
        self.engine, graphed = setup.build_engine(
            cfg, self.record, self.device, self.world, self.accum, self.console
        )
        self.model = self.engine.model
        self.sched = setup.build_scheduler(cfg, self.engine.optimizer, self.iters)
        self.max_skipped = cfg.nonfinite.max_skipped if cfg.nonfinite.action == "skip" else None
        self.stepper = Stepper(
            cfg, self.engine, self.sched, self.device, self.accum, self.world, self.eod,
            graphed=graphed, skip_nonfinite=self.max_skipped is not None,
        )  # fmt: skip
        # an async saver's pinned host memory, reserved on a GPU while training starts
        cuda = self.device.type == "cuda"
        staged = state_bytes(self.model, self.engine.impl, self.world) if cuda else None
        self.ckpts.start_async(staged, dist.cpu_group() if self.world > 1 else None)
        self._resume()
        # config.history.jsonl: each start's config and iteration, appended; a rerun of a finished
        # run trains nothing and adds a line only for a changed config
        if self.rank == 0:
            with self._writing("the config history", self.run.history_path):
                self.run.record_start(
                    self.record, iteration=self.iteration, resumed=self.resumed_from is not None,
                    run_id=self.run_id, world_size=self.world, device=setup.device_name(self.device),
                    if_changed=self._finished(),
                )  # fmt: skip
        with self._writing("the metrics", self.run.metrics_path):
            self.metrics = setup.open_metrics(
                cfg, self.run, self.record, self.iteration, self.rank, self.console
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
    def _counters(self) -> Counters:
        return Counters(self.iteration, self.consumed, self.skipped)

    def _state(self) -> dict[str, Any]:
        return run_state(self.model, self.engine, self.sched, self.record, self._counters())

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
        if cfg.checkpoint.resume == "auto" and cfg.checkpoint.enabled:
            self._refuse_lost_checkpoints(root)
        if self.init_from is not None:
            from zebractl.train.setup import init_weights

            loaded = init_weights(self.model, self.engine, self.init_from, cfg.model, self.console)
            where = loaded.folder if loaded is not None else self.init_from
            self.console(f"initialised weights from {where} (fresh optimizer and schedule)")
            for note in self.init_source.notes if self.init_source is not None else []:
                self.console(note)
            if self.rank == 0:  # what compare's before/after report pairs the run with
                self._write_init(loaded)
        elif self.rank == 0 and self.run.init_path.is_file():  # a fresh start: not from those
            with self._writing("the init record", self.run.init_path):
                self.run.init_path.unlink()

    def _refuse_lost_checkpoints(self, root: Path) -> None:
        """A run whose records say it trained but whose checkpoints are gone (deleted, a sync
        tool, a cleared disk) is not started over silently: that would retrain from iteration 1
        over its history. Exit 2 naming what was found and how to start over on purpose."""
        from zebractl.run.metrics import recorded_progress

        done, sources = recorded_progress(self.run)
        if done <= 0:
            return
        says = "say" if len(sources) > 1 else "says"
        raise ConfigError(
            f"{self.run.root}: the run trained to iteration {done} ({' and '.join(sources)} "
            f"{says} so) but {root} holds no checkpoint to resume from (none was saved, or they "
            "were deleted or moved); rerunning would start over at iteration 1. Put the "
            "checkpoints back, start over on purpose with --set checkpoint.resume=never (the "
            "earlier rows stay in metrics.jsonl under their run ids), or train into a fresh --output"
        )

    def _write_init(self, loaded: ckpt.Checkpoint | None) -> None:
        """``RUN/init.json``: the weights this run started from (:class:`InitRecord`)."""
        from zebractl.train.setup import init_record

        assert self.init_from is not None
        record = init_record(self.init_from, self.init_given_by, loaded, self.run_id)
        with self._writing("the init record", self.run.init_path):
            self.run.write_init(record)

    def _load_checkpoint(self, found: ckpt.Checkpoint) -> None:
        loaded = load_run_state(
            found, self.model, self.engine, self.sched, self.record, self._counters()
        )
        self.iteration, self.consumed, self.skipped = loaded

    def _marker(self) -> CheckpointMarker:
        return marker(self.engine, self._counters(), self.world, self.run_id)

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
    def train_step(self) -> tuple[torch.Tensor | None, Any]:
        """One optimizer step over a global batch; returns (loss, grad norm), loss None if the
        update was skipped for a non-finite value. Counters advance only when the step is done."""
        batches = [self._next_batch() for _ in range(self.accum)]
        result = self.stepper.step(batches)
        if result[0] is None:
            self.skipped += 1
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
        return self.stepper.on_device(mb)

    def evaluate(self) -> ValRow:
        """Mean loss over ``validation.iterations`` global batches of held-out data (the same
        samples every time), over all ranks."""
        c, val = self.cfg, self.cfg.validation
        assert val is not None and self.valid_ds is not None
        n = min(len(self.valid_ds), val.iterations * c.batch.global_)
        loss_sum, tokens = self.stepper.held_out(self.valid_ds, n, self.rank)
        return val_row(self.iteration, loss_sum, tokens, self.run_id)

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

        if self.cfg.kernels.lazy_framework_compile:  # before the process group imports megatron
            from zebractl.runtime.lazy_compile import import_frameworks

            import_frameworks(fla=False)
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
        window = LogWindow(self.device)
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
            window.add(loss, norm)
            if loss is None:
                self._skipped_update()
            it = self.iteration
            if window.due(it, cfg.logging.interval, self.iters):
                final_loss = self._log(self._train_row(window)).loss
                window.reset()
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
            window.pause(time.perf_counter() - paused)
            self.clock.pause(time.perf_counter() - paused)
        self.bar.stop()  # (fit stops it after an error)
        if stopped == "signal":
            saved = self._save_on_stop(signum) or saved
        if stopped == "done" and val_every is not None and last_val != self.iteration:
            kept = self._recorded_validation() if run_steps == 0 else None
            val_loss = kept.val_loss if kept is not None else self._validate()
        self.ckpts.wait()  # also the one a stop wrote: complete before the process exits
        return self._result(stopped, signum, final_loss, val_loss, saved, run_steps)

    def _finished(self) -> bool:
        """Resumed at the run's last iteration: nothing left to train."""
        return self.resumed_from is not None and self.iteration >= self.iters

    def _recorded_validation(self) -> ValRow | None:
        """This lineage's validation row of the current iteration, if one was written (a rerun
        of a finished run reports it instead of appending a second one)."""
        from zebractl.run.metrics import MetricsReader

        try:
            rows = MetricsReader.of(self.run).validation()
        except ConfigError:
            return None
        return next((r for r in reversed(rows) if r.iteration == self.iteration), None)

    def _skipped_update(self) -> None:
        """A step whose update was skipped for a non-finite value: said, and counted against
        ``nonfinite.max_skipped``."""
        self.console(f"iteration {self.iteration}: non-finite loss or gradient; update skipped")
        if self.max_skipped and self.skipped > self.max_skipped:
            raise TrainingError(
                f"{self.skipped} updates skipped for non-finite values by iteration "
                f"{self.iteration} (nonfinite.max_skipped is {self.max_skipped}); stopping"
            )

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

    def _train_row(self, window: LogWindow) -> TrainRow:
        c = self.cfg
        return train_row(
            window,
            iteration=self.iteration,
            world=self.world,
            tokens_per_step=c.batch.global_ * c.data.seq_length,
            flops_per_token=self.flops_tok,
            peak_flops=self.peak,
            lr=self.engine.optimizer.param_groups[0]["lr"],
            cuda=self.device.type == "cuda",
            consumed=self.consumed,
            run_id=self.run_id,
        )

    def _log(self, row: TrainRow) -> TrainRow:
        if self.rank == 0:
            with self._writing("the metrics", self.run.metrics_path):
                self.metrics.write(row)
        line, self._bar_info = row_line(row, self._snapshot(row))
        self.console(line)
        return row

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
