"""Training-test fixtures: the prepared demo corpus (once per session) and a fast tiny run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

FAST = [
    "batch.micro=4",
    "batch.global=8",
    "data.seq_length=64",
    "logging.interval=1",
    "logging.tensorboard=false",
    "checkpoint.interval=1000",
    "schedule.warmup_iterations=2",
    "validation=null",
]
"""Overrides that make a tiny recipe take a fraction of a second per step on a CPU."""


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The demo corpus prepared with its tokenizer; ``ZEBRACTL_TEST_DATA`` names a prepared dataset
    instead (the GPU machine has no demo-corpus packages)."""
    given = os.environ.get("ZEBRACTL_TEST_DATA")
    if given:
        return Path(given).resolve()
    from zebractl.data.demo import tokenizer_dir, write_sources
    from zebractl.data.prepare import PrepareOptions, prepare

    root = tmp_path_factory.mktemp("demo")
    srcs = write_sources(root / "sources")
    prepare(
        PrepareOptions(
            inputs=tuple(map(str, srcs)), tokenizer=str(tokenizer_dir()), output=str(root / "data")
        ),
        workers=2,
    )
    return root / "data"


class FastRun:
    """Tiny runs on the demo corpus with the :data:`FAST` settings, and their metrics."""

    def __init__(self, data: Path) -> None:
        self.data = data

    def sets(self, *sets: str) -> list[str]:
        """`--set` values of the fast tiny run plus ``sets``."""
        return [f"data.paths=[{{path: {self.data}}}]", *FAST, *sets]

    def args(self, *sets: str) -> list[str]:
        """The same as command-line arguments."""
        return [x for s in self.sets(*sets) for x in ("--set", s)]

    def resolve(self, recipe: str, *sets: str):
        """The resolved recipe."""
        from zebractl.config.resolve import resolve_recipe

        return resolve_recipe(recipe, self.sets(*sets))

    def train(self, recipe: str, out: Path, *sets: str, **kw):
        """Train in this process; returns the RunResult."""
        from zebractl.run import ResolvedConfigRecord, RunDir
        from zebractl.train.trainer import Trainer

        r = self.resolve(recipe, *sets)
        kw.setdefault("console", lambda s: None)
        run = RunDir.for_recipe(r.run, r.name, out)
        return Trainer(r.run, run, ResolvedConfigRecord.of(r), **kw).fit()

    @staticmethod
    def rows(out: Path, kind: str = "train") -> list[dict]:
        """metrics.jsonl rows of one kind."""
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    @classmethod
    def losses(cls, out: Path) -> dict[int, float]:
        """Training loss by iteration."""
        return {r["iteration"]: r["loss"] for r in cls.rows(out)}


@pytest.fixture
def fast(demo_data) -> FastRun:
    """Fast tiny runs on the demo corpus."""
    return FastRun(demo_data)
