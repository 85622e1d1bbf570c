"""`zebractl prepare`: input formats, FLA-aligned rows, resume, verify, bad input, tokenizers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("megatron.core")
pytest.importorskip("tokenizers")

from zebractl.data import demo, text_shard  # noqa: E402
from zebractl.data import prepare as prep  # noqa: E402
from zebractl.data.tokenizer import load_tokenizer  # noqa: E402

GPT2 = str(demo.tokenizer_dir())
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "State of the Union, 1790.",
    "Wikipedia lead sections are short.",
    "A fourth document, with some more words in it.",
]


def _read(folder: Path, prefix: str) -> list[list[int]]:
    """Documents of one indexed dataset (token ids)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(folder / prefix))
    return [ds[i].tolist() for i in range(len(ds))]


def _all_docs(folder: Path, split: str = "train") -> list[list[int]]:
    manifest = json.loads((folder / "manifest.json").read_text())
    out = []
    for prefix in manifest["splits"][split]:
        out += _read(folder, prefix)
    return out


def _run(inputs, out, **kw):
    workers = kw.pop("workers", 1)
    opts = prep.PrepareOptions(
        inputs=tuple(str(i) for i in inputs),
        tokenizer=kw.pop("tokenizer", GPT2),
        output=str(out),
        **kw,
    )
    return prep.prepare(opts, workers=workers)


def _jsonl(path: Path, docs, key="text") -> Path:
    path.write_text("".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def _expected(docs, eos=True, bos=False):
    tok = load_tokenizer(GPT2)
    ids = tok.encode_batch(docs)
    return [([tok.bos_id] if bos else []) + x + ([tok.eos_id] if eos else []) for x in ids]


# ---- formats ---------------------------------------------------------------------------------


def _write_format(kind: str, folder: Path) -> list[Path]:
    if kind == "jsonl":
        return [_jsonl(folder / "a.jsonl", DOCS)]
    if kind == "jsonl.gz":
        p = folder / "a.jsonl.gz"
        with gzip.open(p, "wt") as f:
            for d in DOCS:
                f.write(json.dumps({"text": d}) + "\n")
        return [p]
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = folder / "a.parquet"
        pq.write_table(pa.table({"text": DOCS, "n": list(range(len(DOCS)))}), p, row_group_size=2)
        return [p]
    if kind == "arrow-save_to_disk":
        import pyarrow as pa

        d = folder / "hf_dataset"
        d.mkdir()
        table = pa.table({"text": DOCS})
        with pa.ipc.new_stream(d / "data-00000-of-00001.arrow", table.schema) as w:
            w.write_table(table)
        (d / "dataset_info.json").write_text("{}")
        (d / "state.json").write_text(
            '{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}'
        )
        return [d]
    if kind == "text-folder":
        d = folder / "texts"
        d.mkdir()
        for i, doc in enumerate(DOCS):
            (d / f"{i:02d}.txt").write_text(doc)
        return [d]
    if kind == "glob":
        for i, doc in enumerate(DOCS):
            _jsonl(folder / f"part{i}.jsonl", [doc])
        return [folder / "part*.jsonl"]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["jsonl", "jsonl.gz", "parquet", "arrow-save_to_disk", "text-folder", "glob"]
)
def test_every_input_format(tmp_path, kind):
    inputs = _write_format(kind, tmp_path)
    manifest = _run(inputs, tmp_path / "out")
    assert _all_docs(tmp_path / "out") == _expected(DOCS)
    assert manifest["totals"]["documents"] == len(DOCS)
    assert manifest["totals"]["tokens"] == sum(map(len, _expected(DOCS)))
    assert manifest["dtype"] == "uint16"  # 50257 ids fit
    assert all(len(s["sha256"]) == 64 for s in manifest["sources"])


def test_text_key_and_bos_eos_policy(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS, key="content")
    _run([src], tmp_path / "o1", text_key="content", add_bos=True, add_eos=False)
    assert _all_docs(tmp_path / "o1") == _expected(DOCS, eos=False, bos=True)


def test_multiple_workers_give_the_same_tokens(tmp_path):
    srcs = [_jsonl(tmp_path / f"s{i}.jsonl", DOCS[i:] + DOCS[:i]) for i in range(4)]
    _run(srcs, tmp_path / "one", workers=1, shard_bytes=1)
    _run(srcs, tmp_path / "two", workers=2, shard_bytes=1)
    assert _all_docs(tmp_path / "one") == _all_docs(tmp_path / "two")
    assert len(json.loads((tmp_path / "two" / "manifest.json").read_text())["shards"]) == 4


def test_valid_split_is_deterministic(tmp_path):
    docs = [f"document number {i} " * 3 for i in range(200)]
    src = _jsonl(tmp_path / "a.jsonl", docs)
    m = _run([src], tmp_path / "o", valid_fraction=0.2)
    by = m["totals"]["by_split"]
    assert 20 < by["valid"]["documents"] < 60
    assert by["train"]["documents"] + by["valid"]["documents"] == 200
    m2 = _run([src], tmp_path / "o2", valid_fraction=0.2)
    assert m2["totals"]["by_split"] == by
    assert sorted(_all_docs(tmp_path / "o") + _all_docs(tmp_path / "o", "valid")) == sorted(
        _expected(docs)
    )


# ---- FLA-aligned -----------------------------------------------------------------------------


def test_fla_aligned_rows(tmp_path):
    docs = [f"doc {i}: " + "words " * (i % 7 + 1) for i in range(50)]
    src = _jsonl(tmp_path / "a.jsonl", docs)
    seq = 16
    m = _run([src], tmp_path / "o", fla_aligned=True, seq_length=seq, add_bos=True, add_eos=False)
    rows = _all_docs(tmp_path / "o")
    assert rows and all(len(r) == seq for r in rows)
    stream = [t for d in _expected(docs, eos=False, bos=True) for t in d]
    assert [t for r in rows for t in r] == stream[: len(rows) * seq]
    assert m["totals"]["dropped_tokens"] == len(stream) - len(rows) * seq < seq
    # BOS exactly where documents start
    bos = load_tokenizer(GPT2).bos_id
    flat = [t for r in rows for t in r]
    starts, pos = [], 0
    for d in _expected(docs, eos=False, bos=True):
        if pos < len(flat):
            starts.append(pos)
        pos += len(d)
    assert [i for i, t in enumerate(flat) if t == bos] == starts


def test_fla_aligned_batches_of_2048_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(text_shard, "FLA_MAP_BATCH", 10)  # same rule, smaller batches
    docs = [f"document {i} " + "x " * (i % 5) for i in range(25)]
    src = _jsonl(tmp_path / "a.jsonl", docs)
    _run([src], tmp_path / "o", fla_aligned=True, seq_length=8, add_bos=True, add_eos=False)
    expected_rows = []
    exp = _expected(docs, eos=False, bos=True)
    for b in range(0, 25, 10):
        stream = [t for d in exp[b : b + 10] for t in d]
        expected_rows += [stream[i : i + 8] for i in range(0, len(stream) - 7, 8)]
    assert _all_docs(tmp_path / "o") == expected_rows


def test_fla_aligned_needs_its_policy(cli, tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    r = cli(
        "prepare", str(src), "--tokenizer", GPT2, "--output", str(tmp_path / "o"), "--fla-aligned"
    )
    assert r.exit_code == 2 and "--fla-aligned needs --seq-length" in r.stderr
    r = cli(
        "prepare",
        str(src),
        "--tokenizer",
        GPT2,
        "--output",
        str(tmp_path / "o"),
        "--fla-aligned",
        "--seq-length",
        "16",
        "--add-eos",
    )
    assert r.exit_code == 2 and "BOS per document and no EOS" in r.stderr


# ---- resume ----------------------------------------------------------------------------------


def test_resume_after_a_kill_skips_finished_shards(tmp_path, monkeypatch):
    srcs = [_jsonl(tmp_path / f"s{i}.jsonl", [d * (i + 1) for d in DOCS]) for i in range(3)]
    real = prep.tokenize_shard
    calls = []

    def killed_after_first(shard, *a, **k):
        if calls:
            # die half-way through writing the second shard: a temp file exists, no marker
            (tmp_path / "out" / ".tmp" / f"{shard.name}.train.bin").write_bytes(b"\0" * 10)
            raise KeyboardInterrupt
        calls.append(shard.name)
        return real(shard, *a, **k)

    monkeypatch.setattr(prep, "tokenize_shard", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        _run(srcs, tmp_path / "out", shard_bytes=1)
    assert not (tmp_path / "out" / "manifest.json").exists()
    first = tmp_path / "out" / "shards" / "shard-00000.train.bin"
    mtime = first.stat().st_mtime_ns
    monkeypatch.setattr(prep, "tokenize_shard", real)
    m = _run(srcs, tmp_path / "out", shard_bytes=1)
    assert m["run"]["shards_resumed"] == 1
    assert first.stat().st_mtime_ns == mtime  # not redone
    _run(srcs, tmp_path / "clean", shard_bytes=1)
    assert _all_docs(tmp_path / "out") == _all_docs(tmp_path / "clean")
    for name in ("shard-00000", "shard-00001", "shard-00002"):
        a = (tmp_path / "out" / "shards" / f"{name}.train.bin").read_bytes()
        assert a == (tmp_path / "clean" / "shards" / f"{name}.train.bin").read_bytes()


def test_a_shard_whose_file_was_cut_is_redone(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    _run([src], tmp_path / "out")
    binf = tmp_path / "out" / "shards" / "shard-00000.train.bin"
    good = binf.read_bytes()
    binf.write_bytes(good[:-2])  # as if the copy died
    m = _run([src], tmp_path / "out")
    assert m["run"]["shards_resumed"] == 0 and binf.read_bytes() == good


def test_resume_refuses_another_tokenizer_or_other_options(cli, tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    _run([src], tmp_path / "out")
    other = tmp_path / "tok"
    _save_tiny_tokenizer(other)
    r = cli("prepare", str(src), "--tokenizer", str(other), "--output", str(tmp_path / "out"))
    assert r.exit_code == 2 and "prepared with another tokenizer" in r.stderr
    r = cli(
        "prepare", str(src), "--tokenizer", GPT2, "--output", str(tmp_path / "out"), "--no-add-eos"
    )
    assert r.exit_code == 2 and "other inputs or options" in r.stderr


# ---- verify ----------------------------------------------------------------------------------


def test_verify_passes_and_detects_corruption(cli, tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", DOCS * 20)
    _run([src], tmp_path / "out")
    ok = cli("prepare", "--verify", str(tmp_path / "out"), "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["ok"] is True
    binf = tmp_path / "out" / "shards" / "shard-00000.train.bin"
    data = bytearray(binf.read_bytes())
    data[10] ^= 0xFF  # one flipped byte
    binf.write_bytes(bytes(data))
    bad = cli("prepare", "--verify", str(tmp_path / "out"))
    assert bad.exit_code == 3 and "content differs from the manifest (sha256)" in bad.stderr
    binf.write_bytes(bytes(data[:-6]))  # truncated
    bad = cli("prepare", "--verify", str(tmp_path / "out"))
    assert bad.exit_code == 3 and "manifest says" in bad.stderr


def test_verify_checks_ids_against_the_vocabulary(tmp_path):
    from zebractl.data.verify import verify_prepared

    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    m = _run([src], tmp_path / "out")
    manifest = tmp_path / "out" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["tokenizer"]["vocab_size"] = 1000  # as if the ids came from a larger vocabulary
    manifest.write_text(json.dumps(doc))
    report = verify_prepared(tmp_path / "out")
    assert not report.ok and any(">= vocabulary size 1000" in p for p in report.problems)
    assert m["totals"]["tokens"] == report.checked.tokens


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d["tokenizer"].update(vocab_size="50257"), "tokenizer.vocab_size"),
        (lambda d: d.update(dtype=7), "dtype"),
        (lambda d: d.update(shards={"a": 1}), "shards"),
        (lambda d: d.pop("totals"), "totals"),
    ],
    ids=["vocab-a-string", "dtype-a-number", "shards-not-a-list", "no-totals"],
)
def test_verify_of_a_manifest_damaged_after_the_fact_is_a_usage_error(cli, tmp_path, edit, where):
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    _run([src], tmp_path / "out")
    manifest = tmp_path / "out" / "manifest.json"
    doc = json.loads(manifest.read_text())
    edit(doc)
    manifest.write_text(json.dumps(doc))
    r = cli("prepare", "--verify", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert f"{manifest}: not a manifest this zebractl reads" in r.stderr and where in r.stderr
    assert "Traceback" not in r.output


def test_verify_of_an_unfinished_folder_is_a_usage_error(cli, tmp_path):
    r = cli("prepare", "--verify", str(tmp_path))
    assert r.exit_code == 2 and "no manifest.json" in r.stderr


# ---- bad input -------------------------------------------------------------------------------

BAD = [
    (
        "malformed-json",
        b'{"text": "ok"}\n{"text": "broken\n',
        "a.jsonl:2: malformed JSON",
        "malformed_json",
    ),
    (
        "missing-text-key",
        b'{"text": "ok"}\n{"body": "x"}\n',
        "a.jsonl:2: no 'text' key (found: body)",
        "missing_text_key",
    ),
    (
        "invalid-utf8",
        b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
        "a.jsonl:2: invalid UTF-8",
        "invalid_utf8",
    ),
    (
        "text-not-a-string",
        b'{"text": ["a"]}\n',
        "a.jsonl:1: 'text' holds list, not text",
        "not_text",
    ),
]


@pytest.mark.parametrize(
    ("data", "message", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_names_file_and_line(cli, tmp_path, monkeypatch, data, message, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_bytes(data + b'{"text": "last"}\n')
    r = cli("prepare", "a.jsonl", "--tokenizer", GPT2, "--output", "out", "--workers", "1")
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output
    r = cli("prepare", "a.jsonl", "--tokenizer", GPT2, "--output", "out2", "--skip-bad", "--json")
    assert r.exit_code == 0, r.output
    totals = json.loads(r.stdout)["manifest"]["totals"]
    assert totals["skipped"] == {reason: 1}
    # the records after the bad one are still read (the last line is a good document)
    good = data.count(b"\n") + 1 - 1  # lines before "last" minus the bad one, plus "last"
    assert totals["documents"] == good, totals


def test_invalid_utf8_in_a_text_file(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_bytes(b"line one\nline two \xff\xfe\n")
    r = cli("prepare", "t.txt", "--tokenizer", GPT2, "--output", "out")
    assert r.exit_code == 2 and "t.txt:2: invalid UTF-8" in r.stderr


def test_empty_documents_are_skipped_and_counted(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", ["", "real text", "   \n", "more text"])
    m = _run([src], tmp_path / "o")
    assert m["totals"]["documents"] == 2 and m["totals"]["empty_documents"] == 2


def test_missing_column_in_parquet(cli, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": DOCS}), tmp_path / "a.parquet")
    r = cli(
        "prepare", str(tmp_path / "a.parquet"), "--tokenizer", GPT2, "--output", str(tmp_path / "o")
    )
    assert r.exit_code == 2 and "no 'text' column (columns: body)" in r.stderr


def test_missing_inputs_are_usage_errors(cli, tmp_path):
    r = cli(
        "prepare",
        str(tmp_path / "nope.jsonl"),
        "--tokenizer",
        GPT2,
        "--output",
        str(tmp_path / "o"),
    )
    assert r.exit_code == 2 and "no such file or folder" in r.stderr
    r = cli("prepare", "--tokenizer", GPT2, "--output", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no INPUT given" in r.stderr


# ---- tokenizers ------------------------------------------------------------------------------


def _save_tiny_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {
        "[UNK]": 0,
        "</s>": 1,
        **{
            w: i + 2
            for i, w in enumerate(["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"])
        },
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')


def test_tokenizer_json_folder_and_file(tmp_path):
    _save_tiny_tokenizer(tmp_path / "tok")
    for spec in (tmp_path / "tok", tmp_path / "tok" / "tokenizer.json"):
        t = load_tokenizer(str(spec))
        assert t.vocab_size == 10 and t.eos_id == 1
        assert t.encode_batch(["the lazy dog"]) == [[2, 8, 9]]


def test_gpt2_vocab_and_merges(tmp_path):
    t = load_tokenizer(GPT2)
    assert t.vocab_size == 50257 and t.eos_id == 50256
    assert t.encode_batch(["Hello world! The quick brown fox jumps over the lazy dog."]) == [
        [15496, 995, 0, 383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]
    ]
    t.save(tmp_path / "copy")
    again = load_tokenizer(str(tmp_path / "copy"))
    assert again.fingerprint == t.fingerprint
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "copy"))
    assert hf("Hello world")["input_ids"] == [15496, 995]


def test_sentencepiece_model(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(DOCS * 30))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=50,
        minloglevel=2,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
    )
    t = load_tokenizer(str(tmp_path / "sp.model"))
    assert t.kind == "sentencepiece" and t.vocab_size == 50 and (t.bos_id, t.eos_id) == (1, 2)
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    m = _run([src], tmp_path / "o", tokenizer=str(tmp_path / "sp.model"))
    assert m["tokenizer"]["kind"] == "sentencepiece" and m["totals"]["documents"] == len(DOCS)
    assert load_tokenizer(str(tmp_path / "o" / "tokenizer")).fingerprint == t.fingerprint


def test_hub_id_without_a_reachable_hub_is_a_clear_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = _jsonl(tmp_path / "a.jsonl", DOCS)
    r = cli(
        "prepare",
        str(src),
        "--tokenizer",
        "meta-llama/Llama-3.2-1B",
        "--output",
        str(tmp_path / "o"),
    )
    assert r.exit_code == 2
    assert "not a local path and the Hugging Face Hub is not reachable" in r.stderr
    assert "--local-dir" in r.stderr


# ---- the demo, end to end --------------------------------------------------------------------


@pytest.mark.slow
def test_demo_end_to_end_and_verify(cli, tmp_path):
    out = tmp_path / "demo"
    r = cli("prepare", "--demo", "--output", str(out), "--workers", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    totals = doc["manifest"]["totals"]
    assert totals["documents"] == 249 + 10033  # every speech and every Wikipedia lead section
    assert 3_000_000 < totals["tokens"] < 4_000_000
    v = cli("prepare", "--verify", str(out), "--json")
    assert v.exit_code == 0 and json.loads(v.stdout)["ok"]
    tok = load_tokenizer(str(out / "tokenizer"))
    assert tok.vocab_size == 50257


def test_bad_input_in_a_worker_process(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "a.jsonl", DOCS * 50)
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "fine"}\n{"text": 1\n')
    r = cli(
        "prepare",
        "a.jsonl",
        "b.jsonl",
        "--tokenizer",
        GPT2,
        "--output",
        "out",
        "--workers",
        "2",
        "--shard-size",
        "1",
    )
    assert r.exit_code == 2, r.output
    assert "b.jsonl:2: malformed JSON" in r.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_one_prepare_per_output_folder(cli, tmp_path):
    """Issue 26: a second prepare of a folder in use exits 2 naming the first's PID; the lock is
    released when the first ends, and prepare then works."""
    import subprocess
    import sys

    from zebractl.run import lock

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    out = tmp_path / "out"
    args = ("prepare", str(src), "--tokenizer", GPT2, "--output", str(out), "--workers", "1")
    hold = f"from zebractl.run import lock\nwith lock.hold({str(out)!r}, 'prepare'):\n"
    hold += "    print('held', flush=True); sys.stdin.read()"
    first = subprocess.Popen(
        [sys.executable, "-c", "import sys\n" + hold],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:  # (the lock is re-entrant in one process: the first prepare is another process)
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert f"PID {first.pid}" in r.stderr and "zebractl prepare" in r.stderr, r.stderr
        assert not (out / "manifest.json").exists()
    finally:
        assert first.stdin is not None and first.stdout is not None
        first.stdin.close()
        first.wait(timeout=30)
        first.stdout.close()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert (out / "manifest.json").is_file() and lock.holder(out) is None
    assert cli("prepare", "--verify", str(out)).exit_code == 0  # the lock file is no dataset file


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--add-bos", "--no-add-eos"), "has no BOS token; use --no-add-bos"),
        (("--no-add-bos", "--add-eos"), "has no EOS token; use --no-add-eos"),
        (
            ("--add-bos", "--add-eos"),
            "has no BOS and no EOS token; use --no-add-bos and --no-add-eos",
        ),
    ],
)
def test_a_tokenizer_without_the_asked_marker_leaves_nothing_behind(cli, tmp_path, flags, said):
    """Issue 42: the refusal names the marker(s) missing and leaves no .tmp files (the text
    shard opened its .tmp/*.bin before checking the tokenizer)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    src = tmp_path / "t.jsonl"
    src.write_text('{"text": "a b a"}\n{"text": "b a"}\n')
    out = tmp_path / "o"
    r = cli("prepare", str(src), "--tokenizer", str(tmp_path / "tok"), "--output", str(out), *flags)
    assert r.exit_code == 2, r.output
    assert said in r.stderr, r.stderr
    left = [p for p in (out / ".tmp").rglob("*") if p.is_file()] if (out / ".tmp").exists() else []
    assert left == [], left
