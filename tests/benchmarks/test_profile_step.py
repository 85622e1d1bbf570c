"""benchmarks/profile_step.py's attribution of GPU kernels to the ops that launched them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _profile_step():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "profile_step", ROOT / "benchmarks/profile_step.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trace(api: str) -> dict:
    """Two GEMMs (LM head, MLP) and one Triton kernel, launched through ``api`` events."""
    ev = [
        {
            "cat": "cpu_op",
            "name": "aten::mm",
            "tid": 1,
            "ts": 0,
            "dur": 10,
            "args": {"Input Dims": [[1024, 1024], [1024, 128256]]},
        },
        {
            "cat": "cpu_op",
            "name": "aten::mm",
            "tid": 1,
            "ts": 20,
            "dur": 10,
            "args": {"Input Dims": [[32768, 1024], [1024, 8192]]},
        },
        {"cat": "cpu_op", "name": "ChunkKDAFunction", "tid": 1, "ts": 40, "dur": 10, "args": {}},
    ]
    for i, (ts, name) in enumerate(
        [(5, "nvjet_sm90_tst_320x128"), (25, "nvjet_sm90_tst_192x192"), (45, "chunk_kda_fwd")]
    ):
        ev.append(
            {
                "cat": api,
                "name": "cuLaunchKernelEx",
                "tid": 1,
                "ts": ts,
                "dur": 1,
                "args": {"correlation": i},
            }
        )
        ev.append(
            {
                "cat": "kernel",
                "name": name,
                "ts": 100 + 100 * i,
                "dur": 50_000,
                "args": {"correlation": i},
            }
        )
    return {"traceEvents": ev}


@pytest.mark.parametrize("api", ["cuda_runtime", "cuda_driver"])
def test_kernels_launched_through_either_api_find_their_gemm_category(api):
    by_cat, _, total, _ = _profile_step().categorize(_trace(api), vocab=128256, ffn=4096)
    assert by_cat == {
        "LM-head GEMMs": 50.0,
        "MLP GEMMs": 50.0,
        "recurrent chunk kernels (KDA/GDN/SSD)": 50.0,
    }
    assert total == 150.0
