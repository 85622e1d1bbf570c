"""`zebractl warmup --json`'s report from a warmup's result (the warmup itself needs a GPU:
tests/cli/test_cli.py checks its refusal here)."""

from __future__ import annotations

from pathlib import Path


def test_the_report_carries_the_result():
    from zebractl.train.kernel_warmup import WarmupResult, report

    res = WarmupResult(
        cache="/c/triton",
        stack="h200_torch-2_triton-3_fla-0",
        shipped=None,
        seconds={4: 1.5, 8: 2.0},
        before={"tuned": 3, "compiled": 10},
        after={"tuned": 5, "compiled": 12},
        exported=Path("/tmp/out.tar.xz"),
        exported_files=5,
        exported_compiled=Path("/tmp/out.compiled.tar.xz"),
        exported_compiled_kernels=7,
        compiled_seeded=4,
    )
    got = report("tiny_kda", res).model_dump()
    assert got == {
        "schema_version": 1,
        "recipe": "tiny_kda",
        "cache": "/c/triton",
        "stack": "h200_torch-2_triton-3_fla-0",
        "shipped": None,
        "seconds": {"4": 1.5, "8": 2.0},
        "tuned_before": 3,
        "tuned_after": 5,
        "compiled_before": 10,
        "compiled_after": 12,
        "exported": "/tmp/out.tar.xz",
        "exported_files": 5,
        "exported_compiled": "/tmp/out.compiled.tar.xz",
        "exported_compiled_kernels": 7,
        "compiled_seeded": 4,
    }
