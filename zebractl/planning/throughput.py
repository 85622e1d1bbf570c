"""Time to train a recipe, from throughput measured on a GPU (never from a guessed efficiency).

Each measurement below is one zebractl training run of a preset on one NVIDIA H200, as recorded in
the README and benchmarks/README.md. What carries over to a recipe of the same preset is its model
FLOP utilisation (MFU: the plan's training FLOPs per token x tokens/s over the GPU's dense bf16
peak, the MFU `zebractl train` logs), so a different sequence length or GPU count is accounted for
by the FLOPs: tokens/s = MFU x peak x GPUs / training FLOPs per token. It assumes the per-GPU MFU
of the one-GPU measurement holds on every GPU (data-parallel communication is not counted), and
H200s. A preset with no measurement gets no estimate, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

H200_PEAK_BF16 = 989e12
"""NVIDIA H200 dense bf16 peak, FLOP/s (zebractl.train.setup.PEAK_BF16_FLOPS)."""


@dataclass(frozen=True)
class Measured:
    """One measured training throughput of a preset on one H200."""

    micro: int
    seq: int
    tokens_per_s: float
    mfu: float
    what: str
    source: str


MEASURED: dict[str, Measured] = {
    "kda_300M": Measured(
        64, 2048, 221_118, 0.41, "kda_300M, torch_fused engine",
        "benchmarks/results/2026-12-01_h200_issue12b (benchmarks/results/performance.json)",
    ),
    "gdn_300M": Measured(
        64, 2048, 233_400, 0.4404, "gdn_300M, torch_fused engine",
        "benchmarks/results/2026-12-01_h200_issue12b (benchmarks/results/performance.json)",
    ),
    "zebra_kda_1B_hybrid": Measured(
        8, 8192, 65_379, 0.5003, "zebra_kda_1B_hybrid_1gpu as shipped, megatron engine",
        "benchmarks/results/gpu-check/2026-12-06-426c5e6.json (H200, 2026-12-06)",
    ),
    "zebra_gdn_1B_hybrid": Measured(
        8, 8192, 78_950, 0.504, "zebra_gdn_1B_hybrid_1gpu (vocabulary 50257), megatron engine",
        "benchmarks/results/gpu-check/2026-12-02-454ff45.memory2.json (H200, 2026-12-02)",
    ),
    "zebra_mamba_1B_hybrid": Measured(
        16, 2048, 62_935, 0.4997, "zebra_mamba_1B_hybrid_1gpu as shipped, megatron engine",
        "benchmarks/results/gpu-check/2026-12-06-426c5e6.memory.json (H200, 2026-12-06)",
    ),
    "zebra_mamba_3B_hybrid": Measured(
        1, 8192, 16_420, 0.356, "zebra_mamba_3B_hybrid_1gpu as shipped, megatron engine",
        "benchmarks/results/gpu-check/2026-12-02-003ac79.memory.json (H200, 2026-12-02)",
    ),
    "zebra_mamba_8B_hybrid": Measured(
        2, 8192, 23_081, 0.342, "zebra_mamba_8B_hybrid cut to 8 of its 32 blocks, selective "
        "recompute, megatron engine",
        "benchmarks/results/gpu-check/2026-12-02-454ff45.memory.json (H200, 2026-12-02)",
    ),
}  # fmt: skip


def time_to_train(
    preset: str, num_gpus: int, flops_per_token: float, tokens: int
) -> dict[str, Any]:
    """The estimate for ``tokens`` of a model of ``preset`` on ``num_gpus`` H200s (the fields of
    :class:`zebractl.schemas.reports.PlanTimeToTrain`)."""
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    m = MEASURED.get(name)
    if m is None:
        return {
            "hours": None,
            "tokens_per_s": None,
            "gpu": None,
            "mfu": None,
            "measured": None,
            "source": None,
            "note": f"no throughput measured for preset {name} (measured: {', '.join(MEASURED)})",
        }
    rate = m.mfu * H200_PEAK_BF16 * num_gpus / flops_per_token
    return {
        "hours": round(tokens / rate / 3600, 2),
        "tokens_per_s": round(rate),
        "gpu": "NVIDIA H200",
        "mfu": m.mfu,
        "measured": f"{m.what}: {m.tokens_per_s:,.0f} tokens/s, MFU {100 * m.mfu:.1f}% at "
        f"micro-batch {m.micro}, seq {m.seq}, one H200",
        "source": m.source,
        "note": f"the measured MFU on each of {num_gpus} H200(s); data-parallel communication "
        "not counted",
    }
