"""The Trainer's checkpoints: when to save, how, and which checkpoint to resume from.

:class:`Checkpointer` owns the policy: ``checkpoint.interval`` and the last step
(:meth:`Checkpointer.maybe_save`), a save when the run stops (:meth:`Checkpointer.save`), synchronous
or asynchronous saves behind the same calls (``checkpoint.async_save``:
:class:`zebractl.run.async_save.AsyncSaver`; every step boundary polls the save in flight, the next
save and the end of the run wait for it), the disk checks around every write (a full or read-only
disk is a :class:`zebractl.run.disk.DiskError` naming what was written), and resuming from the
newest checkpoint that verifies and loads on every rank. The Trainer hands it the state to save (a
callable, called only when a save happens) and a function that loads a checkpoint into the
Trainer; the files are :mod:`zebractl.run.checkpoint`'s.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zebractl.run import async_save, disk
from zebractl.run import checkpoint as ckpt
from zebractl.run.records import CheckpointMarker
from zebractl.run.rundir import RunDir
from zebractl.schemas.recipe import RunConfig


def state_bytes(model: torch.nn.Module, impl: str, world: int) -> int:
    """An estimate of the GPU tensors one rank stages for a checkpoint: the parameters, two fp32
    Adam moments each and the Megatron engine's fp32 main copy of every low-precision parameter;
    megatron's fully parallel save spreads the writing over the ranks, so with several ranks a
    quarter more than an even share (a save that needs more adds the excess then)."""
    total = 0
    for p in model.parameters():
        total += p.numel() * (p.element_size() + 8)
        if impl == "megatron" and p.dtype != torch.float32:
            total += p.numel() * 4
    return total if world == 1 else math.ceil(total / world * 1.25)


def _local_ranks(world: int) -> int:
    """Ranks of this run on this node (torchrun's LOCAL_WORLD_SIZE, Slurm's tasks per node)."""
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(var, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return min(int(value), world)
    return world


def background_saves(
    setting: bool | str, staged_bytes: int | None, world: int, available: int | None = None
) -> tuple[bool, str]:
    """Whether this rank saves in the background, and the start's line saying why.

    ``setting``: ``checkpoint.async_save``; ``staged_bytes``: one rank's staged state (None on a
    CPU: auto then blocks, a CPU run's saves are small and its memory is the model's); ``available``:
    the node's available host memory (read with psutil when None). auto saves in the background
    where the node's ranks' staging fits twice in what is available."""
    if setting is True:
        return True, "in the background (checkpoint.async_save: true)"
    if setting is False:
        return False, "blocking: training waits for each save (checkpoint.async_save: false)"
    if staged_bytes is None:
        return False, "blocking (checkpoint.async_save auto: background saves only on a GPU)"
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    need = 2 * staged_bytes * _local_ranks(world)
    gb = f"{staged_bytes / 1e9:.1f} GB staged per rank, {available / 1e9:.1f} GB available"
    if available < need:
        return False, (
            f"blocking (checkpoint.async_save auto: {gb}, twice the staging of this node's ranks "
            "needed; set checkpoint.async_save=true to stage anyway)"
        )
    return True, f"in the background (checkpoint.async_save auto: {gb})"


class Checkpointer:
    """Saves and resumes one run's checkpoints (see the module docstring). Every method that
    saves, polls, waits or resumes is collective: all ranks call it."""

    def __init__(
        self,
        cfg: RunConfig,
        run: RunDir,
        rank: int,
        world: int,
        console: Callable[[str], None],
        warn: Callable[[str], None],
    ) -> None:
        """``console`` prints on rank 0; ``warn`` on every rank (a damaged checkpoint)."""
        self.cfg, self.run, self.rank, self.world = cfg, run, rank, world
        self.console, self.warn = console, warn
        self.saver: async_save.AsyncSaver | None = None
        self.last_saved: int | None = None  # the newest iteration saved or being saved
        self._need = 0.0  # bytes the save in flight writes (about)

    # ---- writes of the run ---------------------------------------------------------------------
    def writing(
        self, what: str, path: Path, need: float = 0.0
    ) -> contextlib.AbstractContextManager:
        """A write of this run: a full or read-only disk becomes a :class:`disk.DiskError`."""
        return disk.writing(what, path, self.run.checkpoints, need)

    def _saving(
        self, iteration: int | None, need: float = 0.0
    ) -> contextlib.AbstractContextManager:
        if iteration is None:
            return contextlib.nullcontext()
        folder = ckpt.checkpoint_dir(self.run.checkpoints, iteration)
        tmp = folder.with_name(folder.name + ".tmp")
        return self.writing(f"the checkpoint of iteration {iteration}", tmp, need)

    def remove_incomplete(self) -> None:
        """At the start (rank 0, the lock held): delete the ``iter_N.tmp`` folders saves that
        never completed left behind; resume never takes them."""
        for folder in ckpt.incomplete(self.run.checkpoints):
            shutil.rmtree(folder, ignore_errors=True)
            self.console(f"note: removed {folder}, a save that did not complete")

    def start_async(self, staged_bytes: int | None, group: Any) -> None:
        """The background saver (``checkpoint.async_save``: true, or auto where
        :func:`background_saves` allows), its pinned host staging reserved for ``staged_bytes``
        (on a GPU; None on a CPU) while training starts; ``group``: the CPU process group of a
        multi-rank run (None with one). Says at the start how this run saves, and readies the
        writers either way (:func:`zebractl.run.checkpoint.ready_writers`)."""
        c = self.cfg.checkpoint
        if not c.enabled:
            return
        ckpt.ready_writers()
        on, why = background_saves(c.async_save, staged_bytes, self.world)
        if self.world > 1:  # the saver is collective: every rank saves the same way
            flag = torch.tensor([int(on)])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=group)
            if on and not flag.item():
                on, why = False, "blocking: another node has too little host memory to stage"
        self.console(f"checkpoint saves: {why}")
        if not on:
            return
        staging = async_save.HostStaging()
        if staged_bytes is not None:
            staging.reserve(staged_bytes)
        self.saver = async_save.AsyncSaver(group, staging)

    # ---- saving --------------------------------------------------------------------------------
    def due(self, iteration: int, last: bool) -> bool:
        """``checkpoint.interval`` or the last step, with checkpoints enabled."""
        c = self.cfg.checkpoint
        return c.enabled and (iteration % c.interval == 0 or last)

    def maybe_save(
        self,
        iteration: int,
        last: bool,
        state: Callable[[], dict[str, Any]],
        marker: Callable[[], CheckpointMarker],
        params: Callable[[], int],
    ) -> Path | None:
        """Save when :meth:`due` (the arguments are called only then); returns the folder (None
        when no save was due)."""
        if not self.due(iteration, last):
            return None
        return self.save(iteration, state(), marker(), params())

    def save(
        self, iteration: int, state: dict[str, Any], marker: CheckpointMarker, params: int
    ) -> Path:
        """Checkpoint ``iteration`` (collective); returns its folder. With an async saver this
        finishes the previous save, then begins this one, which completes in the background
        (:meth:`poll`, :meth:`wait`). ``params``: the model's parameters (the first save's size
        is planned from them)."""
        t0 = time.perf_counter()
        waited = ""
        if self.saver is not None and self.saver.pending is not None:
            self.wait()  # the previous save is not complete yet: training waits for it
            wait = time.perf_counter() - t0
            waited = f", {wait:.1f} s of it for the previous save" if wait >= 0.05 else ""
        need = self._need = self._check_space(iteration, params)
        args = (self.run.checkpoints, iteration, state, marker)
        kw = {"keep_last": self.cfg.checkpoint.keep_last, "is_writer": self.rank == 0}
        with self._saving(iteration, need):
            if self.saver is None:
                folder = ckpt.save(*args, **kw)
                self.console(f"saved {folder} in {time.perf_counter() - t0:.1f} s")
            else:
                folder = self.saver.begin(*args, **kw)
                paused = time.perf_counter() - t0
                self.console(f"saving {folder} (async: training paused {paused:.1f} s{waited})")
        self.last_saved = iteration
        return folder

    def pending(self, iteration: int) -> bool:
        """Whether the save of ``iteration`` is still being written in the background."""
        return self.saver is not None and self.saver.pending == iteration

    def _check_space(self, iteration: int, params: int) -> float:
        """Before a save: the bytes it needs (the previous checkpoint's size, or the plan's for the
        first); rank 0 warns when the disk has less room."""
        done = ckpt.complete(self.run.checkpoints)
        need = float(ckpt.size(done[-1].folder)) if done else 0.0
        if not need:
            from zebractl.planning.plan import checkpoint_bytes

            need = checkpoint_bytes(self.cfg, params)
        if self.rank == 0:
            what = f"the checkpoint of iteration {iteration}"
            warning = disk.space_warning(self.run.checkpoints, need, what)
            if warning:
                self.console(warning)
        return need

    def poll(self) -> None:
        """Move an asynchronous save on (collective, non-blocking: every step boundary)."""
        if self.saver is not None:
            with self._saving(self.saver.pending, self._need):
                self._report(self.saver.poll())

    def wait(self) -> None:
        """Finish an asynchronous save in flight (collective, blocking)."""
        if self.saver is not None:
            with self._saving(self.saver.pending, self._need):
                self._report(self.saver.wait())

    def abort(self) -> None:
        """After an error (no collective): the save in flight stays an incomplete ``.tmp``."""
        if self.saver is not None:
            self.saver.abort()

    def _report(self, done: async_save.SaveDone | None) -> None:
        if done is not None:
            self.console(f"checkpoint {done.folder.name} complete in {done.seconds:.1f} s")

    def newest(self) -> Path | None:
        """The folder of the newest checkpoint saved (or being saved) by this run."""
        if self.last_saved is None:
            return None
        return ckpt.checkpoint_dir(self.run.checkpoints, self.last_saved)

    # ---- resuming ------------------------------------------------------------------------------
    def resume_newest_intact(self, load: Callable[[ckpt.Checkpoint], None]) -> int | None:
        """Load (``load``, collective) the newest checkpoint that verifies and loads on every
        rank; returns its iteration (None: there is none). Damaged ones are named and skipped.
        Rank 0 verifies (sizes, checksums) and chooses."""
        import torch.distributed as tdist

        root = self.run.checkpoints
        failed: dict[int, str] = {}
        while True:
            choice: list[Any] = [None, None]
            if self.rank == 0:
                found, damaged = ckpt.newest_intact(root, self.console, failed)
                choice = [found.iteration if found else None, damaged]
            if self.world > 1:
                tdist.broadcast_object_list(choice, src=0)
            iteration, damaged = choice
            if iteration is None:
                if damaged:
                    raise ckpt.all_damaged(root, damaged)
                return None
            folder = ckpt.checkpoint_dir(root, iteration)
            ok, why = torch.ones(1), ""
            try:
                load(ckpt.Checkpoint(folder, ckpt.read_marker(folder)))
            except ckpt.DamagedCheckpoint as exc:
                ok.zero_()
                why = exc.reason
                self.warn(f"warning: checkpoint {exc.folder} is damaged: {why}; skipping it")
            if self.world > 1:
                from zebractl.runtime.dist import cpu_group

                tdist.all_reduce(ok, op=tdist.ReduceOp.MIN, group=cpu_group())
            if ok.item():
                self.last_saved = iteration
                return iteration
            failed[iteration] = why or "it failed to load on another rank"
