"""`data.packing` (issue 29): the documents packed into a row are kept apart (isolated, the default
for chat data) or run as one sequence (concat, the default for text). The model side is tested in
tests/model/test_segments.py; here the recipe key, the trainer's labels and the refusals."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.errors import ConfigError  # noqa: E402


def test_packing_defaults_to_the_format(fast):
    assert not fast.resolve("tiny_kda").run.data.isolated
    assert fast.resolve("tiny_kda", "data.format=chat").run.data.isolated
    assert fast.resolve("tiny_kda", "data.packing=isolated").run.data.isolated
    assert not fast.resolve("tiny_kda", "data.format=chat", "data.packing=concat").run.data.isolated


def test_the_label_after_an_end_of_document_is_not_trained():
    from zebractl.train.data import keep_documents_apart

    mb = {"tokens": torch.tensor([[4, 9, 0, 5, 6, 0]]), "loss_mask": torch.ones(1, 6)}
    seg = keep_documents_apart(mb, 0)
    assert mb["loss_mask"].tolist() == [[1, 1, 0, 1, 1, 0]]
    assert seg.cu_seqlens.tolist() == [0, 3, 6]


@pytest.mark.slow
def test_isolated_text_trains_fewer_labels_and_another_loss(fast, tmp_path):
    """The same rows, fp32 (deterministic on CPU): isolated drops one label per document boundary
    and changes the contexts, so its first loss differs from concat's beyond rounding (measured:
    4.5e-4 at iteration 1); both learn."""
    sets = ("precision=fp32", "schedule.iterations=3", "data.num_workers=0")
    got = {}
    for packing in ("concat", "isolated"):
        out = tmp_path / packing
        fast.train("tiny_hybrid", out, *sets, f"data.packing={packing}")
        rows = fast.rows(out)
        got[packing] = rows
    assert abs(got["isolated"][0]["loss"] - got["concat"][0]["loss"]) > 1e-4
    for rows in got.values():
        assert rows[-1]["loss"] < rows[0]["loss"]


def test_isolated_refuses_cuda_graphs_and_fla_references(fast):
    from zebractl.train import reference
    from zebractl.train.engine import check_engine

    cfg = fast.resolve(
        "tiny_kda", "data.packing=isolated", "kernels.cuda_graph=true", "optimizer.impl=torch_fused"
    ).run
    with pytest.raises(ConfigError, match="cuda_graph with data.packing isolated"):
        check_engine(cfg, torch.device("cuda", 0))
    cfg = fast.resolve("tiny_kda", "data.packing=isolated", "optimizer.impl=torch_fused").run
    with pytest.raises(ConfigError, match="data.packing: concat"):
        reference.check(cfg, "fla")


def test_isolated_needs_an_end_of_document_token(cli, fast, tmp_path):
    """Raw .bin/.idx prefixes carry no tokenizer: nothing says where a document ends (exit 2)."""
    prefix = next(fast.data.glob("shards/*.train.bin")).with_suffix("")
    sets = [f"data.paths=[{{path: {prefix}}}]", "data.packing=isolated"]
    args = [x for s in (*fast.sets()[1:], *sets) for x in ("--set", s)]
    r = cli("train", "tiny_kda", *args, "-o", str(tmp_path / "r"))
    assert r.exit_code == 2 and "no end-of-document token" in r.stderr, r.output
