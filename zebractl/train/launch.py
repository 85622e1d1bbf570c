"""Starting `zebractl train`: in this process, on N local GPUs through torchrun, or as a Slurm job.

:func:`start` is what the CLI calls; it returns a :class:`LaunchOutcome` (:func:`report` makes it the
``--json`` report) and leaves printing and exit codes to the caller. Stop signals: the trainer
saves and ends with 128 + the signal number; a torchrun launcher forwards SIGTERM/SIGUSR1 to its
workers and waits for their saves.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebractl.errors import ConfigError
from zebractl.train.progress import NO_BAR_ENV

if TYPE_CHECKING:
    from zebractl.config.resolve import Resolved
    from zebractl.run.rundir import RunDir
    from zebractl.schemas.reports import TrainReport
    from zebractl.train.trainer import RunResult

REQUEUE_EXIT = 128 + signal.SIGUSR1
"""Exit code of a run stopped by SIGUSR1 (Slurm's warning before the time limit): requeue it."""
SLURM_SIGNAL_SECONDS = 300
"""How long before the time limit Slurm sends SIGUSR1: time to finish a step and save."""


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked `zebractl train` for."""

    recipe: str
    sets: list[str] = field(default_factory=list)
    output: Path | None = None
    init_from: Path | None = None
    nproc: int | None = None
    slurm: bool = False
    submit: bool = False
    reference: str | None = None
    """``fla``: train FLA's class of the model instead (zebractl.train.reference)."""
    bar: bool = False
    """Show a progress bar on stderr (a terminal, no ``--json``: zebractl.train.progress)."""


@dataclass
class LaunchOutcome:
    """What :func:`start` did. ``exit_code`` is the process's exit code to report."""

    kind: str  # "train" | "torchrun" | "slurm"
    exit_code: int
    run_dir: Path
    metrics: Path
    rank: int = 0
    result: RunResult | None = None
    script: Path | None = None
    lines: list[str] = field(default_factory=list)


def child_args(
    recipe: str, sets: list[str], output: str, init_from: str | None, reference: str | None = None
) -> list[str]:
    """`zebractl train` arguments for each launched process (no launcher options)."""
    args = ["train", recipe]
    for item in sets:
        args += ["--set", item]
    args += ["--output", output]
    if init_from:
        args += ["--init-from", init_from]
    if reference:
        args += ["--reference", reference]
    return args


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """One node, ``nproc`` processes (one per GPU), standalone rendezvous."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "zebractl",
        *args,
    ]


def slurm_script(
    name: str,
    nodes: int,
    gpus_per_node: int,
    args: list[str],
    log: str,
    cpus_per_task: int = 8,
    port: int = 29500,
) -> str:
    """An sbatch script: one task per GPU (srun starts every rank, so Slurm's signals reach each
    one), a SIGUSR1 warning before the time limit, and a requeue when the run stopped for it."""
    launch = " ".join(shlex.quote(a) for a in args)
    return f"""#!/bin/bash
#SBATCH --job-name=zebractl-{name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --output={log}
#SBATCH --open-mode=append
#SBATCH --signal=USR1@{SLURM_SIGNAL_SECONDS}
#SBATCH --requeue
# Written by `zebractl train --slurm`; submit with `sbatch` (or `zebractl train ... --submit`).
# {SLURM_SIGNAL_SECONDS} s before the time limit every rank gets SIGUSR1: it finishes its step, saves a
# checkpoint and exits {REQUEUE_EXIT}; the job is then requeued and resumes from that checkpoint.
set -uo pipefail

export OMP_NUM_THREADS={cpus_per_task}  # per rank (one task per GPU)
# FLA's compiled kernels and autotune results persist in ~/.cache/zebractl/kernels/ (zebractl sets
# TRITON_CACHE_DIR / TILELANG_CACHE_DIR there unless they are set; ZEBRACTL_CACHE_DIR moves it).
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT={port}

srun --kill-on-bad-exit=1 bash -c \\
  'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec python -m zebractl "$@"' \\
  zebractl {launch}
rc=$?
if [ "$rc" -eq {REQUEUE_EXIT} ]; then
  echo "zebractl: stopped before the time limit with a checkpoint; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""


@dataclass(frozen=True)
class ResolvedRequest:
    """A validated :class:`TrainRequest`: the recipe as the run will see it, and where it goes."""

    resolved: Resolved
    sets: list[str]
    """``--set`` overrides as launched (with ``parallelism.num_gpus`` from the GPUs used)."""
    gpus: int
    run: RunDir


def resolve_request(req: TrainRequest, world: int | None = 1) -> ResolvedRequest:
    """Validate a train request and resolve its recipe exactly as training will: ``train`` and
    ``train --check`` both go through here, so they refuse the same things (exit 2).

    ``world`` is the number of processes already launched; None (``train --check``) keeps the
    recipe's own ``parallelism.num_gpus`` unless ``--nproc`` says how many GPUs the run gets."""
    from zebractl.config.catalog import locate
    from zebractl.config.resolve import resolve_recipe
    from zebractl.run.rundir import RunDir

    if req.nproc is not None and req.nproc < 1:
        raise ConfigError(f"--nproc {req.nproc}: must be at least 1 (GPUs on this node)")
    slurm = req.slurm or req.submit
    # the GPUs actually used decide the data-parallel size, unless the user set it explicitly
    explicit_gpus = any(x.partition("=")[0].strip() == "parallelism.num_gpus" for x in req.sets)
    ref = locate(req.recipe)
    # (the recipe's own GPU count is validated only where it is used: a Slurm job)
    own = slurm or (world is None and req.nproc is None)
    gpus = resolve_recipe(ref, req.sets).run.parallelism.num_gpus if own else (req.nproc or world)
    sets = req.sets if explicit_gpus else [*req.sets, f"parallelism.num_gpus={gpus}"]
    r = resolve_recipe(ref, sets)
    tracker = r.run.logging.wandb
    if tracker is not None and tracker.mode != "disabled":  # before any heavy import, as --check
        from zebractl.deps import require_for

        require_for("logging.wandb", "wandb")
    run = RunDir.for_recipe(r.run, r.name, req.output)
    if req.reference is not None:
        from zebractl.train import reference as fla_reference

        fla_reference.check(r.run, req.reference)
        # its own directory and checkpoints (never the run it mirrors)
        run = run if req.output is not None else RunDir(run.reference_root(req.reference))
    return ResolvedRequest(r, sets, gpus, run)


def start(req: TrainRequest, console=print) -> LaunchOutcome:
    """Resolve the recipe and train it here, through torchrun, or write (and submit) a Slurm job."""
    from zebractl.runtime.dist import launched_world

    rank, world = launched_world()
    resolved = resolve_request(req, world)
    r, sets, gpus, run = resolved.resolved, resolved.sets, resolved.gpus, resolved.run
    slurm = req.slurm or req.submit
    args = child_args(
        req.recipe,
        sets,
        str(run.root),
        str(req.init_from) if req.init_from else None,
        req.reference,
    )
    if slurm:
        per_node = min(8, gpus)
        nodes = -(-gpus // per_node)
        script = run.write_sbatch(
            slurm_script(r.name, nodes, per_node, args, run.slurm_log_pattern)
        )
        out = LaunchOutcome("slurm", 0, run.root, run.metrics_path, script=script)
        out.lines.append(f"wrote {script} ({nodes} node(s) x {per_node} GPU(s))")
        if req.submit:
            try:
                done = subprocess.run(["sbatch", str(script)], check=False)
            except FileNotFoundError:
                raise ConfigError(
                    "sbatch is not on PATH: submit the script on the cluster's login node"
                ) from None
            out.exit_code = done.returncode
        return out
    from zebractl.run import lock

    if req.nproc is not None and req.nproc > 1 and world == 1:
        # the rank 0 worker takes the run directory's lock; a directory in use fails here, at once
        with lock.hold(run.root, "train", console, run.checkpoints):
            pass
        cmd = torchrun_command(req.nproc, args)
        console("launching: " + " ".join(cmd))
        env = None if req.bar else {**os.environ, NO_BAR_ENV: "1"}  # --json: the workers' too
        return LaunchOutcome("torchrun", run_children(cmd, env), run.root, run.metrics_path)

    # one writer per run directory: rank 0 locks it before the heavy imports, so a second train
    # of the same directory fails at once (the trainer takes the lock again, re-entrantly)
    held = lock.hold(run.root, "train", console, run.checkpoints)
    with held if rank == 0 else contextlib.nullcontext():
        # the persistent kernel cache, before any kernel is compiled (each rank sets up its own;
        # the launcher above never touches the GPU)
        from zebractl.runtime import kernel_cache

        cache = kernel_cache.configure_for(r.run.kernels)
        if cache is not None and rank == 0:
            console(cache.describe())
        # kernels.precompile_tilelang: process: KDA's TileLang kernel compiles from here on, in a
        # process of its own, while this one imports and sets up
        from zebractl.train import compile_procs, tilelang_build

        tilelang_build.spawn(r.run)
        # kernels.precompile_processes: the step's Triton kernels likewise, in N processes
        compile_procs.spawn(r.run)

        from zebractl.run.records import ResolvedConfigRecord
        from zebractl.train.progress import RichBar
        from zebractl.train.trainer import Trainer

        record = ResolvedConfigRecord.of(r)
        update: dict[str, Any] = {"reference": req.reference}
        if req.init_from is not None:  # the run's config names what it started from
            update["config"] = {**record.config, "init_from": str(req.init_from)}
            update["provenance"] = {**record.provenance, "init_from": "--init-from"}
        record = record.model_copy(update=update)
        bar = RichBar() if req.bar and rank == 0 else None
        result = Trainer(
            r.run, run, record, init_from=req.init_from, console=console, bar=bar
        ).fit()
    code = 128 + result.signal if result.stopped == "signal" and result.signal else 0
    return LaunchOutcome("train", code, run.root, run.metrics_path, rank=rank, result=result)


def report(out: LaunchOutcome) -> TrainReport:
    """The ``train --json`` report of what :func:`start` did (the run's numbers when it trained
    here)."""
    from zebractl.schemas.reports import TrainReport

    res = out.result
    numbers = (
        {
            "stopped": res.stopped,
            "iterations": res.iterations,
            "resumed_from": res.resumed_from,
            "final_loss": res.final_loss,
            "val_loss": res.val_loss,
            "skipped": res.skipped,
            "checkpoint": str(res.checkpoint) if res.checkpoint else None,
            "total_iterations": res.total,
            "tokens": res.tokens,
            "wall_seconds": res.wall_s,
            "mean_tokens_per_s": res.tokens_per_s,
        }
        if res is not None
        else {}
    )
    return TrainReport(
        launched=out.kind,
        run_dir=str(out.run_dir),
        exit_code=out.exit_code,
        metrics=str(out.metrics),
        script=str(out.script) if out.script else None,
        **numbers,
    )


def run_children(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run a launcher (torchrun) until it ends, forwarding SIGTERM and SIGUSR1 straight to its
    workers, which save and exit (torchrun itself would give them only 30 s before SIGKILL, and
    dies of SIGUSR1). Ctrl-C reaches the whole process group from the terminal already, so it is
    only waited out here. Returns the launcher's exit code, or 128 + the signal this process
    received."""
    proc = subprocess.Popen(cmd, env=env)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if signum == signal.SIGINT:
            return
        try:
            import psutil

            workers = psutil.Process(proc.pid).children()
        except Exception:  # noqa: BLE001 - psutil missing or torchrun gone: tell torchrun
            workers = []
        for w in workers:
            w.send_signal(signum)
        if not workers:
            proc.send_signal(signum)

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    previous = {s: signal.signal(s, forward) for s in stops}
    try:
        code = proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 128 + received[0] if received and code != 0 else code
