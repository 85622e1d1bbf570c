"""recompute.mode through the trainer: five steps of each tiny model give the same losses bit for
bit with none, selective and full (CPU, fp32, the torch kernels; GPU: within bf16 noise, measured
through the GPU check)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_mamba", "tiny_hybrid"])
def test_losses_are_bitwise_equal_with_and_without_recomputation(fast, tmp_path, recipe):
    losses = {}
    for mode in ("none", "selective", "full"):
        fast.train(recipe, tmp_path / mode, "schedule.iterations=5", f"recompute.mode={mode}")
        losses[mode] = fast.losses(tmp_path / mode)
    assert list(losses["none"]) == [1, 2, 3, 4, 5], losses
    assert losses["none"] == losses["selective"] == losses["full"], losses


def test_recompute_is_refused_where_it_is_untested(cli, fast, tmp_path):
    """blocks without full, more blocks than the model has, and the CUDA graph / FP8 MLP (refused
    by the engine check: not yet run on a GPU together)."""
    for sets, needle in (
        (["recompute.mode=selective", "recompute.blocks=2"], "applies to recompute.mode full"),
        (["recompute.mode=full", "recompute.blocks=9"], "more than the model's 2 blocks"),
    ):
        r = cli("train", "tiny_kda", *fast.args(*sets), "--output", str(tmp_path / "x"))
        assert r.exit_code == 2 and needle in r.stderr, r.output
    from zebractl.errors import ConfigError
    from zebractl.train.engine import check_engine

    cfg = fast.resolve("tiny_kda", "recompute.mode=full", "kernels.cuda_graph=true").run
    import torch

    with pytest.raises(ConfigError, match="recompute.mode full with kernels.cuda_graph"):
        check_engine(cfg, torch.device("cuda"), 1)
