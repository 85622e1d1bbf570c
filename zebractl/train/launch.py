"""Launching `zebractl train` on several GPUs: torchrun on one node, an sbatch script for Slurm."""

from __future__ import annotations

import shlex
import sys

# Options of `zebractl train` that the launched processes receive unchanged.
PASSTHROUGH = ("--set", "--output", "--init-from")


def child_args(recipe: str, sets: list[str], output: str, init_from: str | None) -> list[str]:
    """`zebractl train` arguments for each launched process (no launcher options)."""
    args = ["train", recipe]
    for item in sets:
        args += ["--set", item]
    args += ["--output", output]
    if init_from:
        args += ["--init-from", init_from]
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
    output: str,
    cpus_per_task: int = 16,
    port: int = 29500,
) -> str:
    """An sbatch script: one task per node, torchrun spreads GPUs, c10d rendezvous on the head."""
    launch = " ".join(shlex.quote(a) for a in args)
    return f"""#!/bin/bash
#SBATCH --job-name=zebractl-{name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --output={output}/slurm-%j.log
# Written by `zebractl train --slurm`; submit with `sbatch` (or `zebractl train ... --submit`).
set -euo pipefail

export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {gpus_per_node} > 0 ? SLURM_CPUS_PER_TASK / {gpus_per_node} : 1 ))
# Reuse FLA's Triton autotune results across jobs (the first step autotunes for minutes otherwise).
export TRITON_CACHE_DIR=${{TRITON_CACHE_DIR:-$HOME/.cache/zebractl/triton}}
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

srun --kill-on-bad-exit=1 python -m torch.distributed.run \\
  --nnodes="$SLURM_NNODES" --nproc_per_node={gpus_per_node} \\
  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:{port}" \\
  -m zebractl {launch}
"""
