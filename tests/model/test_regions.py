"""Compiled regions (zebractl.model.ops.regions) past Dynamo's recompile limit: the calls Dynamo
refuses run eagerly with the same values (exact: the region is a product and a sum of fp32
numbers that Inductor and eager round alike at this size), said once; the shapes compiled before
keep running compiled; a graph break is still an error. Dynamo's limit is lowered to 1 here (8
by default), so a second shape reaches it (found by the GPU check at 00933e9: a test worker that
had compiled the Mamba2 glue 8 times raised FailOnRecompileLimitHit out of the model's forward)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from zebractl.model.ops import regions  # noqa: E402


def _glue(x: torch.Tensor, k: int) -> torch.Tensor:
    return x * k + 1.0


def _breaks(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    torch._dynamo.graph_break()
    return y + 1


@pytest.fixture
def limit_one():
    import torch._dynamo

    torch._dynamo.reset()  # this file's functions start with no compiled entries
    with torch._dynamo.config.patch(recompile_limit=1):
        yield
    torch._dynamo.reset()


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_calls_past_the_recompile_limit_run_eagerly_and_say_so_once(limit_one, caplog, device):
    r = regions.Region(_glue)
    a = torch.arange(6.0, device=device).reshape(2, 3)
    b = torch.arange(20.0, device=device).reshape(4, 5)
    with caplog.at_level(logging.INFO, logger=regions.__name__):
        assert torch.equal(r(a, 3), a * 3 + 1.0)  # compiled
        assert (r.limit_hit, r.eager_calls) == (False, 0)
        assert torch.equal(r(b, 3), b * 3 + 1.0)  # a second shape: past a limit of 1
        assert (r.limit_hit, r.eager_calls) == (True, 1)
        assert torch.equal(r(b, 3), b * 3 + 1.0)  # known to be refused: eager, Dynamo not asked
        assert torch.equal(r(a, 3), a * 3 + 1.0)  # the shape compiled first stays compiled
        assert r.eager_calls == 2
    said = [rec.getMessage() for rec in caplog.records if rec.name == regions.__name__]
    assert len(said) == 1 and "recompile limit (1) reached" in said[0], said


def test_a_graph_break_is_still_an_error(limit_one):
    r = regions.Region(_breaks)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        r(torch.ones(3))
    assert r.eager_calls == 0


def test_one_region_per_function():
    assert regions.region(_glue) is regions.region(_glue)
    assert regions.region(_glue) is not regions.region(_breaks)
