"""``compare --fla``'s other side: a run's FLA reference, trained beside it by the Trainer
(:mod:`zebractl.train.reference` builds FLA's class; this module runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError


def train_fla_reference(run_path: Path, console: Any = print) -> Path:
    """Train (or resume, or reuse when complete) the FLA reference of a run: the same resolved
    config, FLA's class, into ``RUN-fla-reference`` beside it (``RunDir.reference_root``). The
    trainer holds that directory's lock while it trains (``compare --fla`` holds RUN's for the
    whole command)."""
    from zebractl.run.rundir import RunDir
    from zebractl.runtime import dist, kernel_cache
    from zebractl.schemas.recipe import RunConfig
    from zebractl.train.trainer import Trainer

    run = RunDir(Path(run_path))
    record = run.read_config()
    if record.reference is not None:
        raise ConfigError(f"{run.root} is itself a {record.reference} reference run")
    cfg = RunConfig.model_validate(record.config)
    root = run.reference_root("fla")
    console(f"FLA reference of {run.root}: {root}")
    kernel_cache.configure_for(cfg.kernels)
    with dist.scoped():
        Trainer(
            cfg, RunDir(root), record.model_copy(update={"reference": "fla"}), console=console
        ).fit()
    return root
