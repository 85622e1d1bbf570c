"""`zebractl prepare --format chat` (issue 29): conversations to tokens plus a loss mask that covers
exactly the assistant turns (decoded back here), hostile records named by file:line (exit 2) or
counted with --skip-bad, the overlong policy counted in the manifest, and a mask damaged after
the fact caught by --verify (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("megatron.core")
pytest.importorskip("tokenizers")

from zebractl.data import demo  # noqa: E402

GPT2 = str(demo.tokenizer_dir())
TALKS = [
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What colour is the sky?"},
        {"role": "assistant", "content": "Blue."},
    ],
    [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "And back?"},
        {"role": "assistant", "content": "Three, two, one — done."},
    ],
]


def _jsonl(path: Path, talks) -> Path:
    path.write_text("".join(json.dumps({"messages": t}) + "\n" for t in talks), encoding="utf-8")
    return path


def _prepare(cli, src: Path, out: Path, *more: str):
    args = ("prepare", str(src), "--format", "chat", "--tokenizer", GPT2, "-o", str(out))
    return cli(*args, "--workers", "1", *more)


def _read(out: Path):
    """(token ids, mask) per conversation of the train split, from the files on disk."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for prefix in manifest["splits"]["train"]:
        ids, mask = IndexedDataset(str(out / prefix)), IndexedDataset(str(out / f"{prefix}.mask"))
        rows += [(ids[i].tolist(), mask[i].tolist()) for i in range(len(ids))]
    return manifest, rows


def test_the_mask_covers_exactly_the_assistant_turns(cli, tmp_path):
    from zebractl.data.tokenizer import load_tokenizer

    r = _prepare(cli, _jsonl(tmp_path / "talk.jsonl", TALKS), tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "built-in chatml template" in r.stdout
    manifest, rows = _read(tmp_path / "out")
    tok = load_tokenizer(GPT2)
    assert len(rows) == len(TALKS)
    for (ids, mask), talk in zip(rows, TALKS, strict=True):
        assert len(ids) == len(mask) and set(mask) <= {0, 1}
        spans, run = [], []  # the masked runs of tokens, decoded
        for i, m in zip(ids, mask, strict=True):
            if m:
                run.append(i)
            elif run:
                spans.append(tok._impl.decode(run))
                run = []
        if run:
            spans.append(tok._impl.decode(run))
        want = [t["content"] + "<|im_end|>\n" for t in talk if t["role"] == "assistant"]
        assert spans == want
        assert ids[-1] == tok.eos_id and mask[-1] == 0  # the conversation's EOS, not trained
        rendered = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in talk)
        assert tok._impl.decode(ids[:-1]) == rendered
    c = manifest["chat"]
    masked = sum(sum(m) for _, m in rows)
    assert (c["conversations"], c["masked_tokens"], c["truncated"], c["dropped"]) == (
        2,
        masked,
        0,
        0,
    )
    assert c["masked_fraction"] == round(masked / manifest["totals"]["tokens"], 6)
    assert manifest["options"]["format"] == "chat" and manifest["options"]["text_key"] == "messages"
    kinds = [s["kind"] for s in manifest["shards"]]
    assert kinds == ["tokens", "mask"] and manifest["splits"] == {
        "train": ["shards/shard-00000.train"]
    }
    v = cli("prepare", "--verify", str(tmp_path / "out"))
    assert v.exit_code == 0, v.output


HOSTILE = {
    "no role": ('{"messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}', "no role"),
    "unknown role": ('{"messages": [{"role": "robot", "content": "hi"}]}', "role 'robot'"),
    "empty content": ('{"messages": [{"role": "assistant", "content": "  "}]}', "empty content"),
    "number content": ('{"messages": [{"role": "assistant", "content": 7}]}', "content of type int"),
    "no assistant": ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    "not a list": ('{"messages": "hello"}', "non-empty list of turns"),
    "no messages key": ('{"text": "hello"}', "no 'messages' key"),
    "malformed json": ('{"messages": [', "malformed JSON"),
    "lone surrogate": ('{"messages": [{"role": "assistant", "content": "\\ud800"}]}', "surrogate"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_record_is_named_by_file_and_line_or_skipped(cli, tmp_path, case):
    line, message = HOSTILE[case]
    good = json.dumps({"messages": TALKS[0]})
    src = tmp_path / "talk.jsonl"
    src.write_text(f"{good}\n{line}\n{good}\n", encoding="utf-8")
    r = _prepare(cli, src, tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert f"{src}:2" in r.stderr and message in r.stderr and "Traceback" not in r.output
    r = _prepare(cli, src, tmp_path / "skip", "--skip-bad", "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads(r.stdout)["manifest"]
    assert sum(manifest["totals"]["skipped"].values()) == 1
    assert manifest["chat"]["conversations"] == 2


def test_invalid_utf8_is_named_by_line(cli, tmp_path):
    src = tmp_path / "talk.jsonl"
    src.write_bytes(json.dumps({"messages": TALKS[0]}).encode() + b"\n" + b'{"messages": "\xff"}\n')
    r = _prepare(cli, src, tmp_path / "out")
    assert r.exit_code == 2 and f"{src}:2" in r.stderr and "invalid UTF-8" in r.stderr


def test_a_plain_text_file_is_not_chat_data(cli, tmp_path):
    src = tmp_path / "notes.txt"
    src.write_text("just text\n")
    r = _prepare(cli, src, tmp_path / "out")
    assert r.exit_code == 2 and "holds no records" in r.stderr


def test_overlong_conversations_follow_the_declared_policy(cli, tmp_path):
    """An assistant turn longer than the sequence: truncate keeps the first --seq-length tokens
    (its start still trained on); a conversation whose first assistant token lies past the cut
    is dropped either way (nothing to learn); drop drops every longer one. Counted in the
    manifest."""
    long_answer = [
        {"role": "user", "content": "Talk."},
        {"role": "assistant", "content": "word " * 200},
    ]
    late = [{"role": "user", "content": "so " * 200}, {"role": "assistant", "content": "Yes."}]
    src = _jsonl(tmp_path / "talk.jsonl", [TALKS[0], long_answer, late])
    r = _prepare(cli, src, tmp_path / "cut", "--seq-length", "96")
    assert r.exit_code == 0, r.output
    manifest, rows = _read(tmp_path / "cut")
    c = manifest["chat"]
    assert (c["conversations"], c["truncated"], c["dropped"], c["seq_length"]) == (3, 1, 1, 96)
    assert [len(ids) for ids, _ in rows][1] == 96 and all(len(ids) <= 96 for ids, _ in rows)
    assert sum(rows[1][1]) > 0  # the cut answer's start is trained on
    r = _prepare(cli, src, tmp_path / "drop", "--seq-length", "96", "--overlong", "drop")
    manifest, rows = _read(tmp_path / "drop")
    assert (manifest["chat"]["truncated"], manifest["chat"]["dropped"], len(rows)) == (0, 2, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--chat-template", "llama9"), "built-in templates are chatml"),
        (("--overlong", "wrap"), "--overlong must be truncate or drop"),
        (("--fla-aligned", "--seq-length", "96"), "--fla-aligned packs plain text"),
        (("--seq-length", "1"), "at least 2"),
    ],
)
def test_contradictory_chat_options_are_usage_errors(cli, tmp_path, args, message):
    r = _prepare(cli, _jsonl(tmp_path / "talk.jsonl", TALKS), tmp_path / "out", *args)
    assert r.exit_code == 2 and message in r.stderr, r.output


def test_parquet_messages_and_a_damaged_mask(cli, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "talk.parquet"
    pq.write_table(pa.table({"messages": TALKS}), src)
    r = _prepare(cli, src, tmp_path / "out")
    assert r.exit_code == 0, r.output
    _, rows = _read(tmp_path / "out")
    assert len(rows) == 2 and all(sum(m) for _, m in rows)
    mask = tmp_path / "out" / "shards" / "shard-00000.train.mask.bin"
    data = bytearray(mask.read_bytes())
    data[3] = 7  # damaged after the fact: the checksum and the 0/1 rule both catch it
    mask.write_bytes(bytes(data))
    v = cli("prepare", "--verify", str(tmp_path / "out"))
    assert v.exit_code == 3 and "train.mask.bin" in v.output, v.output
