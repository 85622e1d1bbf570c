"""The training tests share one process group per module (see ``module_process_group``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _shared_process_group(module_process_group) -> None:
    """Every module here runs with the module's process group."""
