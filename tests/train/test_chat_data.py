"""`data.format: chat` (issue 29): training reads the loss masks `prepare --format chat` wrote. A
label is trained on only where its token is an assistant token; the loss is the mean over the
global batch's marked tokens, so the loss and the gradient are the same at any micro-batch and
accumulation split (fp32 on CPU: equal to 1e-6 relative); a dataset without masks is exit 2."""

from __future__ import annotations

import json
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.data import demo  # noqa: E402

SEED = 1234


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """300 arithmetic conversations of one to three turns (seeded), prepared as chat data."""
    from zebractl.data.prepare import PrepareOptions, prepare

    rng = random.Random(SEED)
    print(f"chat_data seed {SEED}")
    root = tmp_path_factory.mktemp("chat")
    lines = []
    for _ in range(300):
        turns = []
        for _ in range(rng.randint(1, 3)):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            turns += [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            ]
        lines.append(json.dumps({"messages": turns}))
    src = root / "talk.jsonl"
    src.write_text("\n".join(lines) + "\n")
    opts = PrepareOptions(
        inputs=(str(src),),
        tokenizer=str(demo.tokenizer_dir()),
        output=str(root / "data"),
        format="chat",
        text_key="messages",
    )
    prepare(opts)
    return root / "data"


def _sets(chat_data, *more):
    return (f"data.paths=[{{path: {chat_data}}}]", "data.format=chat", "data.num_workers=0", *more)


def test_marked_labels_are_the_assistant_tokens(fast, chat_data, process_group):
    """Every sample's trained labels, decoded, are assistant answers and their end markers, and
    nothing of a user turn."""
    from zebractl.data.spec import resolve_data
    from zebractl.data.tokenizer import load_tokenizer
    from zebractl.train.data import build_datasets

    cfg = fast.resolve("tiny_kda", *_sets(chat_data)).run
    ds, _ = build_datasets(cfg, resolve_data(cfg), 64, 0, chat_data.parent / "cache")
    tok = load_tokenizer(str(chat_data / "tokenizer"))
    marked = total = 0
    for i in range(16):
        s = ds[i]
        on = s["loss_mask"] == 1
        assert set(s["loss_mask"].tolist()) <= {0.0, 1.0}
        text = tok._impl.decode(s["labels"][on].tolist())
        assert "What is" not in text and "user" not in text
        assert " plus " in text and "<|im_end|>" in text
        marked, total = marked + int(on.sum()), total + on.numel()
    assert 0.1 < marked / total < 0.6  # answers are about a third of each conversation


@pytest.mark.slow
def test_the_loss_is_the_same_at_any_micro_batch_split(fast, chat_data, tmp_path, process_group):
    """One step at micro 8 (no accumulation), 2 (4 steps) and 1 (8 steps) of the same global
    batch of 8: the same loss and gradient norm to 1e-6, although the micro-batches hold different
    numbers of marked tokens (a mean per micro-batch would differ)."""
    from zebractl.data.spec import resolve_data
    from zebractl.train.data import build_datasets

    cfg = fast.resolve("tiny_kda", *_sets(chat_data)).run
    ds, _ = build_datasets(cfg, resolve_data(cfg), 8, 0, tmp_path / "cache")
    counts = [int(ds[i]["loss_mask"].sum()) for i in range(8)]
    assert len(set(counts)) > 1, counts  # the splits differ in marked tokens
    got = {}
    for micro in (8, 2, 1):
        out = tmp_path / f"m{micro}"
        sets = _sets(
            chat_data,
            f"batch.micro={micro}",
            "schedule.iterations=1",
            "precision=fp32",
            "schedule.warmup_iterations=0",
        )
        fast.train("tiny_kda", out, *sets)
        (row,) = fast.rows(out)
        got[micro] = (row["loss"], row["grad_norm"])
    base = got[8]
    for micro, (loss, norm) in got.items():
        assert loss == pytest.approx(base[0], rel=1e-6), (micro, got)
        assert norm == pytest.approx(base[1], rel=1e-6), (micro, got)


@pytest.mark.slow
def test_chat_training_lowers_the_loss(fast, chat_data, tmp_path):
    fast.train("tiny_kda", tmp_path, *_sets(chat_data, "schedule.iterations=30"))
    losses = fast.losses(tmp_path)
    assert losses[30] < losses[1] - 1.0, losses


def test_chat_format_needs_masks_and_refuses_cuda_graphs(cli, fast, tmp_path):
    r = cli("train", "tiny_kda", *fast.args("data.format=chat"), "-o", str(tmp_path / "a"))
    assert r.exit_code == 2 and "has no loss masks" in r.stderr, r.output
    from zebractl.errors import ConfigError
    from zebractl.train.engine import check_engine

    cfg = fast.resolve("tiny_kda", "data.format=chat", "kernels.cuda_graph=true").run
    with pytest.raises(ConfigError, match="cuda_graph with data.format chat"):
        check_engine(cfg, torch.device("cuda", 0))
