"""`zebractl prepare --format chat` (issue 29): conversations to tokens plus a loss mask that covers
exactly the assistant turns (decoded back here), hostile records named by file:line (exit 2) or
counted with --skip-bad, the overlong policy counted in the manifest, and a mask damaged after
the fact caught by --verify (exit 3). --chat-template: auto (the tokenizer's own template, else
chatml, said in the output and the manifest), a Jinja file (ChatML as a file prepares the
built-in's very bytes), and hostile template files named (exit 2). No randomness."""

from __future__ import annotations

import hashlib
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


def test_the_mask_covers_exactly_the_assistant_turns(cli, tmp_path, masked_spans):
    from zebractl.data.chat import CHATML_JINJA
    from zebractl.data.tokenizer import load_tokenizer

    r = _prepare(cli, _jsonl(tmp_path / "talk.jsonl", TALKS), tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert (
        "built-in chatml template (auto: the tokenizer has no chat template of its own)" in r.stdout
    )
    manifest, rows = _read(tmp_path / "out")
    template = manifest["chat"]["template"]
    assert (template["name"], template["source"], template["text"]) == (
        "chatml",
        "builtin",
        CHATML_JINJA,
    )
    assert template["sha256"] == hashlib.sha256(CHATML_JINJA.encode()).hexdigest()
    assert manifest["options"]["chat_template"] == "auto"
    tok = load_tokenizer(GPT2)
    assert len(rows) == len(TALKS)
    for (ids, mask), talk in zip(rows, TALKS, strict=True):
        assert len(ids) == len(mask) and set(mask) <= {0, 1}
        spans = masked_spans(tok, ids, mask)
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


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_conversation_dropped_says_so_by_policy(cli, tmp_path, workers):
    """Issue 42: a file whose only conversations the over-long policy drops is refused with the
    count and the policy (it said "0 record(s) skipped ... check --text-key")."""
    long_answer = [
        {"role": "user", "content": "Talk."},
        {"role": "assistant", "content": "w " * 300},
    ]
    src = _jsonl(tmp_path / "talk.jsonl", [long_answer, long_answer, long_answer])
    args = ("--seq-length", "64", "--overlong", "drop", "--workers", workers)
    r = _prepare(cli, src, tmp_path / "drop", *args)
    assert r.exit_code == 2, r.output
    assert "all 3 of 3 were dropped by --overlong drop" in r.stderr, r.stderr
    assert "--seq-length 64" in r.stderr and "--text-key" not in r.stderr


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


# Llama-3-like: BOS, role headers, contents trimmed, <|eot_id|> closes a turn
LLAMA3 = r"""{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""


def test_chatml_as_a_jinja_file_prepares_the_builtin_s_bytes_on_the_demo_conversations(
    cli, tmp_path, demo_chat
):
    """The demo conversations (1,319) rendered with ChatML written as a Jinja file: the same
    token and mask files, byte for byte, as the built-in template's (the demo_chat fixture:
    auto on GPT-2, so chatml), and the same template sha256."""
    from zebractl.data.chat import CHATML_JINJA

    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML_JINJA, encoding="utf-8")
    out = tmp_path / "file"
    r = cli(
        "prepare", "--demo", "--format", "chat", "--valid-fraction", "0.05", "--workers", "1",
        "--chat-template", str(path), "-o", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"rendered with the chat template {path} (sha256 " in r.stdout
    builtin = json.loads((demo_chat / "manifest.json").read_text())
    mine = json.loads((out / "manifest.json").read_text())
    assert builtin["chat"]["conversations"] == mine["chat"]["conversations"] == 1319
    assert builtin["chat"]["template"]["source"] == "builtin"
    assert (mine["chat"]["template"]["source"], mine["chat"]["template"]["name"]) == (
        "file",
        str(path),
    )
    assert mine["chat"]["template"]["sha256"] == builtin["chat"]["template"]["sha256"]
    files = [(s["prefix"], s["kind"], s["files"]) for s in builtin["shards"]]
    assert [(s["prefix"], s["kind"], s["files"]) for s in mine["shards"]] == files
    assert {k for _, k, _ in files} == {"tokens", "mask"}


def _tokenizer_with_template(folder: Path, template: str) -> Path:
    """The demo GPT-2 tokenizer saved as a tokenizer.json folder whose tokenizer_config.json
    carries ``template`` as its chat_template (offline)."""
    from zebractl.data.tokenizer import load_tokenizer

    load_tokenizer(GPT2).save(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    return folder


def test_auto_renders_with_the_tokenizer_s_own_template(cli, tmp_path, masked_spans):
    """Two files, two workers: the template travels to the worker processes."""
    from zebractl.data.tokenizer import load_tokenizer

    folder = _tokenizer_with_template(tmp_path / "tok", LLAMA3)
    srcs = [_jsonl(tmp_path / "a.jsonl", TALKS[:1]), _jsonl(tmp_path / "b.jsonl", TALKS[1:])]
    out = tmp_path / "out"
    r = cli(
        "prepare", *map(str, srcs), "--format", "chat", "--tokenizer", str(folder),
        "-o", str(out), "--workers", "2",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    config = folder / "tokenizer_config.json"
    assert f"rendered with the tokenizer's own chat template ({config}, sha256 " in r.stdout
    manifest, rows = _read(out)
    assert len(manifest["shards"]) == 4  # two shards, each tokens + mask
    t = manifest["chat"]["template"]
    assert (t["source"], t["name"], t["text"]) == ("tokenizer", str(config), LLAMA3)
    assert t["sha256"] == hashlib.sha256(LLAMA3.encode()).hexdigest()
    assert t["reason"] == "auto: the tokenizer's own chat template"
    tok = load_tokenizer(str(folder))
    for (ids, mask), talk in zip(rows, TALKS, strict=True):
        want = [m["content"].strip() + "<|eot_id|>" for m in talk if m["role"] == "assistant"]
        assert masked_spans(tok, ids, mask) == want
        text = tok._impl.decode(ids[:-1])
        assert text.startswith("<|endoftext|><|start_header_id|>") and text.endswith("<|eot_id|>")
    assert cli("prepare", "--verify", str(out)).exit_code == 0
    doc = json.loads((out / "manifest.json").read_text())
    doc["chat"]["template"]["text"] += " "  # the text no longer the one its sha256 names
    (out / "manifest.json").write_text(json.dumps(doc))
    v = cli("prepare", "--verify", str(out))
    assert v.exit_code == 3 and "chat.template" in v.output, v.output


def test_a_named_template_overrides_the_tokenizer_s_own(cli, tmp_path):
    folder = _tokenizer_with_template(tmp_path / "tok", LLAMA3)
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    r = cli(
        "prepare", str(src), "--format", "chat", "--tokenizer", str(folder),
        "--chat-template", "chatml", "-o", str(tmp_path / "out"), "--workers", "1",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "built-in chatml template (--chat-template chatml)" in r.stdout


HOSTILE_TEMPLATES = {
    # name: (file bytes or None for no file, what stderr says after the file's name)
    "missing": (None, ": no such Jinja file (the built-in templates are chatml"),
    "not utf-8": (b"{{ messages }}\n\xff\n", ":2: not UTF-8 text (byte 0xff)"),
    "syntax error": (b"{% for m in messages %}\n{{ m.content }}\n{% if %}\n", ":3: Jinja syntax error"),
    "empty": (b"  \n", ": an empty chat template"),
    "renders nothing": (b"{% if false %}x{% endif %}", ": renders nothing for this conversation"),
    "no assistant content": (b"{% for m in messages %}{{ m.role }}\n{% endfor %}", ": does not put the assistant's content"),
    "runtime error": (b"\n{{ messages[0].content.nope() }}", ":2: the chat template failed on"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE_TEMPLATES))
def test_a_hostile_template_file_is_named(cli, tmp_path, case):
    data, message = HOSTILE_TEMPLATES[case]
    path = tmp_path / "t.jinja"
    if data is not None:
        path.write_bytes(data)
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    r = _prepare(cli, src, tmp_path / "out", "--chat-template", str(path), "--skip-bad")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(path) in r.stderr and message in r.stderr, r.stderr
    if case in ("renders nothing", "no assistant content", "runtime error"):
        assert f"{src}:1" in r.stderr  # the record it failed on


def test_a_template_that_is_not_prefix_stable_names_itself_and_the_record(cli, tmp_path):
    """Rendering four turns changes how the first three were written: the second record."""
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% if messages | length > 3 %}[long]{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
    )
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    r = _prepare(cli, src, tmp_path / "out", "--chat-template", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"chat template {path}: not prefix-stable" in r.stderr and f"{src}:2" in r.stderr


def test_a_template_refusing_a_record_names_it_or_skip_bad_counts_it(cli, tmp_path):
    path = tmp_path / "no_system.jinja"
    path.write_text(
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('system turns are not supported') }}{% endif %}"
        "<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
    )
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    r = _prepare(cli, src, tmp_path / "out", "--chat-template", str(path))
    assert r.exit_code == 2, r.output
    assert f"{src}:1: the chat template {path} refuses this record: system turns" in r.stderr
    r = _prepare(cli, src, tmp_path / "skip", "--chat-template", str(path), "--skip-bad", "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads(r.stdout)["manifest"]
    assert manifest["totals"]["skipped"] == {"template_refused": 1}
    assert manifest["chat"]["conversations"] == 1


def test_a_broken_template_of_the_tokenizer_is_named(cli, tmp_path):
    folder = _tokenizer_with_template(tmp_path / "tok", "{% for m in messages %}\n{{ m.content }")
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    r = cli(
        "prepare", str(src), "--format", "chat", "--tokenizer", str(folder), "-o", str(tmp_path / "o"),
    )  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"{folder / 'tokenizer_config.json'} (its chat_template, line 2)" in r.stderr


def test_resuming_with_another_template_text_is_refused(cli, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(LLAMA3)
    src = _jsonl(tmp_path / "talk.jsonl", TALKS)
    assert _prepare(cli, src, tmp_path / "out", "--chat-template", str(path)).exit_code == 0
    path.write_text(LLAMA3.replace("<|eot_id|>", "<|end|>"))  # same path, another template
    r = _prepare(cli, src, tmp_path / "out", "--chat-template", str(path))
    assert r.exit_code == 2 and "another chat template" in r.stderr, r.output
