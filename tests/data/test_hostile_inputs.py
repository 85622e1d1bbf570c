"""Hostile corpora for `zebractl prepare`: damaged archives, empty inputs, invalid Unicode, corrupt
columnar files, an output path that is a file, a dataset missing its tokenizer. Each is exit 2 (or 3
for a failed verify) naming the file, and the line or row where one applies; never a traceback."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("megatron.core")
pytest.importorskip("tokenizers")

from zebractl.data import demo  # noqa: E402

GPT2 = str(demo.tokenizer_dir())
GOOD = "".join(
    json.dumps({"text": f"document number {i} with a few words"}) + "\n" for i in range(50)
)


def _prepare(cli, *inputs: str, out: str = "out", more: tuple[str, ...] = ()):
    return cli("prepare", *inputs, "--tokenizer", GPT2, "--output", out, "--workers", "1", *more)


def _gz_cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, expected message) for damaged gzip inputs, generated from one good file."""
    whole = gzip.compress(GOOD.encode() * 40)
    cases = {}
    for frac in (0.3, 0.6, 0.95):  # cut anywhere: mid-header is impossible past 10 bytes
        p = tmp / f"cut{int(frac * 100)}.jsonl.gz"
        p.write_bytes(whole[: int(len(whole) * frac)])
        cases[p.name] = (p, "truncated or corrupt gzip data after line")
    flipped = bytearray(whole)
    for i in range(len(whole) // 2, len(whole) // 2 + 64):
        flipped[i] ^= 0xFF
    p = tmp / "flipped.jsonl.gz"
    p.write_bytes(bytes(flipped))
    # damage inside the stream may decode to garbage lines before the checksum fails
    cases[p.name] = (p, ("corrupt gzip data", "malformed JSON", "invalid UTF-8"))
    p = tmp / "plain.jsonl.gz"
    p.write_text(GOOD)  # not gzip at all
    cases[p.name] = (p, "not gzip data")
    return cases


def test_damaged_gzip_is_exit_2_naming_the_file_and_last_good_line(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, (path, expected) in _gz_cases(tmp_path).items():
        r = _prepare(cli, str(path), out=f"out_{name}")
        assert r.exit_code == 2, (name, r.output)
        expected = (expected,) if isinstance(expected, str) else expected
        assert str(path) in r.stderr and any(e in r.stderr for e in expected), (name, r.stderr)
        assert "Traceback" not in r.output
        # --skip-bad counts the damaged file and keeps the rest of the inputs
        good = tmp_path / "good.jsonl"
        good.write_text(GOOD)
        r = _prepare(cli, str(path), str(good), out=f"skip_{name}", more=("--skip-bad", "--json"))
        assert r.exit_code == 0, (name, r.output)
        totals = json.loads(r.stdout)["manifest"]["totals"]
        assert totals["skipped"].get("corrupt_file") == 1 and totals["documents"] >= 50


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.jsonl", ""),
        ("blank.jsonl", "\n\n   \n\t\n"),
        ("empty-texts.jsonl", '{"text": ""}\n{"text": "   "}\n'),
        ("empty.txt", ""),
        ("empty.jsonl.gz", None),
    ],
)
def test_inputs_without_documents_are_exit_2(cli, tmp_path, monkeypatch, name, content):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / name
    if content is None:
        path.write_bytes(gzip.compress(b""))
    else:
        path.write_text(content)
    r = _prepare(cli, name)
    assert r.exit_code == 2, r.output
    assert f"no documents in {name}" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "x\\ud83d"])
def test_a_lone_surrogate_is_a_bad_record(cli, tmp_path, monkeypatch, escape):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n' + '{"text": "' + escape + '"}\n')
    r = _prepare(cli, "a.jsonl")
    assert r.exit_code == 2 and "a.jsonl:2: 'text' holds a lone surrogate" in r.stderr, r.output
    r = _prepare(cli, "a.jsonl", out="o2", more=("--skip-bad", "--json"))
    assert r.exit_code == 0 and json.loads(r.stdout)["manifest"]["totals"]["skipped"] == {
        "invalid_unicode": 1
    }


def test_a_corrupt_parquet_column_chunk_names_the_file(cli, tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    table = pa.table({"text": [f"row {i} " * 50 for i in range(2000)]})
    pq.write_table(table, tmp_path / "ok.parquet", row_group_size=500, compression="snappy")
    data = bytearray((tmp_path / "ok.parquet").read_bytes())
    meta = pq.ParquetFile(tmp_path / "ok.parquet").metadata
    start = meta.row_group(2).column(0).data_page_offset  # damage the third row group's data
    for i in range(start + 8, start + 400):
        data[i] ^= 0x5A
    (tmp_path / "bad.parquet").write_bytes(bytes(data))
    r = _prepare(cli, "bad.parquet")
    assert r.exit_code == 2, r.output
    assert "bad.parquet" in r.stderr and "Traceback" not in r.output, r.stderr
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    r = _prepare(cli, "junk.parquet", out="o2")
    assert r.exit_code == 2 and "junk.parquet: not a readable parquet file" in r.stderr, r.stderr


def test_output_naming_an_existing_file_is_exit_2(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(GOOD)
    (tmp_path / "taken").write_text("not a folder")
    r = _prepare(cli, "a.jsonl", out="taken")
    assert r.exit_code == 2 and "--output taken: exists and is not a folder" in r.stderr, r.output


def test_verify_notices_a_missing_or_foreign_tokenizer(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(GOOD)
    assert _prepare(cli, "a.jsonl").exit_code == 0
    assert cli("prepare", "--verify", "out").exit_code == 0
    shutil.move(tmp_path / "out" / "tokenizer", tmp_path / "tok")
    r = cli("prepare", "--verify", "out")
    assert r.exit_code == 3 and "tokenizer/: missing" in r.output, r.output
    shutil.move(tmp_path / "tok", tmp_path / "out" / "tokenizer")
    cfg = tmp_path / "out" / "tokenizer" / "tokenizer.json"
    doc = json.loads(cfg.read_text())
    doc["model"]["vocab"]["zzzz-extra"] = len(doc["model"]["vocab"])
    cfg.write_text(json.dumps(doc))
    r = cli("prepare", "--verify", "out")
    assert r.exit_code == 3 and "tokenizer/: fingerprint" in r.output, r.output
