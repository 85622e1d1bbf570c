"""A run's state in a checkpoint: what the Trainer saves, and loading it back.

:func:`run_state` is the one dict a checkpoint holds (megatron's sharded model and optimizer states,
the schedule, every random generator, the counters, the resolved config); :func:`load_run_state`
loads a checkpoint the :class:`~zebractl.train.checkpointer.Checkpointer` chose into the model,
optimizer and schedule and returns the counters; :func:`marker` is the checkpoint's marker file.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from zebractl import __version__
from zebractl.errors import ConfigError
from zebractl.run import checkpoint as ckpt
from zebractl.run.records import CheckpointMarker, ResolvedConfigRecord


class Counters(NamedTuple):
    """Where a run is: optimizer steps taken, samples consumed, updates skipped."""

    iteration: int
    consumed: int
    skipped: int


def rng_state() -> dict[str, Any]:
    """Every random generator's state, for a checkpoint (a resumed run draws what the
    uninterrupted one would have)."""
    import random

    import numpy as np

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s generators."""
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def run_state(
    model: Any,
    engine: Any,
    sched: Any,
    record: ResolvedConfigRecord,
    counters: Counters,
    is_loading: bool = False,
) -> dict[str, Any]:
    """The state a checkpoint holds (``is_loading``: the template a load fills)."""
    model_sd = model.sharded_state_dict(metadata=ckpt.sharded_metadata())
    return {
        "model": model_sd,
        "optimizer": engine.sharded_optimizer_state(model_sd, is_loading),
        "scheduler": sched.state_dict(),
        "rng": rng_state(),
        "iteration": counters.iteration,
        "consumed_samples": counters.consumed,
        "skipped_iterations": counters.skipped,
        "zebractl_version": __version__,
        "config": record.model_dump(mode="json"),
    }


def load_run_state(
    found: ckpt.Checkpoint,
    model: Any,
    engine: Any,
    sched: Any,
    record: ResolvedConfigRecord,
    counters: Counters,
) -> Counters:
    """Load ``found`` into the model, optimizer, schedule and random generators; returns its
    counters. A checkpoint of another optimizer layout is a :class:`ConfigError`."""
    m = found.marker
    saved = (m.optimizer_impl, m.distributed_optimizer)
    if saved != (engine.impl, engine.distributed):
        raise ConfigError(
            f"{found.folder} holds the optimizer state of optimizer.impl '{saved[0]}' with "
            f"parallelism.distributed_optimizer {str(saved[1]).lower()}, but this run uses "
            f"'{engine.impl}' with {str(engine.distributed).lower()}; resume with "
            "the same settings, or start a new output directory with --init-from to keep the "
            "weights"
        )
    template = run_state(model, engine, sched, record, counters, is_loading=True)
    loaded = ckpt.load(found.folder, template)
    ckpt.load_model_state(model, loaded["model"])
    engine.load_optimizer_state(loaded["optimizer"])
    sched.load_state_dict(loaded["scheduler"])
    set_rng_state(loaded["rng"])
    return Counters(
        loaded["iteration"], loaded["consumed_samples"], loaded.get("skipped_iterations", 0)
    )


def marker(engine: Any, counters: Counters, world: int, run_id: str) -> CheckpointMarker:
    """The marker file of a checkpoint of this state (what a resume checks before loading)."""
    return CheckpointMarker(
        iteration=counters.iteration,
        consumed_samples=counters.consumed,
        skipped_iterations=counters.skipped,
        optimizer_impl=engine.impl,
        distributed_optimizer=engine.distributed,
        world_size=world,
        run_id=run_id,
        zebractl_version=__version__,
    )
