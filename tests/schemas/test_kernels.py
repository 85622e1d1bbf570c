"""The ``kernels`` section's cross-key rule (``zebractl.schemas.kernels``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from zebractl.schemas.kernels import KernelsConfig


def test_the_tiled_norm_forward_needs_the_tiled_backward():
    assert KernelsConfig(rmsnorm_forward="tiled").rmsnorm_backward == "tiled"
    with pytest.raises(ValidationError, match="rmsnorm_forward: tiled needs rmsnorm_backward"):
        KernelsConfig(rmsnorm_forward="tiled", rmsnorm_backward="fla")


def test_the_refusal_names_the_recipe_line(cli, write):
    write(
        "r.yaml", "extends: tiny_kda\nkernels:\n  rmsnorm_forward: tiled\n  rmsnorm_backward: fla\n"
    )
    r = cli("plan", "r.yaml")
    assert r.exit_code == 2, r.output
    assert "r.yaml:2: kernels: rmsnorm_forward: tiled needs rmsnorm_backward: tiled" in r.stderr
