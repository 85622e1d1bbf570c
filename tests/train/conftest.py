"""Training-test fixtures: the prepared demo corpus, once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
