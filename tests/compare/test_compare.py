"""`zebractl compare` and `zebractl train --reference fla` on CPU: tiny KDA and GDN runs against FLA's
own classes (through FLA's pure-PyTorch references), from the same init on the same samples.

Tolerance: iteration-1 losses equal within 1e-5 in fp32 (the two stacks differ only in operation
order: FLA's naive recurrent references against zebractl's chunked torch references).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fla.models")
pytest.importorskip("megatron.core")
pytest.importorskip("matplotlib")
jsonschema = pytest.importorskip("jsonschema")

from zebractl.runtime.dist import scoped  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS = [
    "schedule.iterations=20",
    "checkpoint.interval=20",
    "schedule.warmup_iterations=4",
    "batch.micro=8",  # one micro-batch per step (the global batch stays 8)
]


def _report(result):
    from zebractl.schemas.reports import CompareReport

    doc = json.loads(result.stdout)
    schema = json.loads((REPO / "schemas/reports" / CompareReport.schema_file()).read_text())
    jsonschema.validate(doc, schema)
    return CompareReport.model_validate(doc)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn"])
def test_ours_against_the_fla_reference_is_at_parity(cli, fast, tmp_path, recipe):
    run = tmp_path / "ours"
    with scoped():
        fast.train(recipe, run, *STEPS)
    r = cli("compare", str(run), "--fla", "--assert", "--json")
    assert r.exit_code == 0, r.output
    rep = _report(r)
    ref = tmp_path / "ours-fla-reference"
    assert rep.b.run == str(ref) and rep.b.reference == "fla" and rep.a.reference is None
    record = json.loads((ref / "config.resolved.json").read_text())
    assert record["reference"] == "fla"
    assert record["config"] == json.loads((run / "config.resolved.json").read_text())["config"]
    assert [x.iteration for x in rep.loss] == [1, 2, 4, 8, 16, 20]
    assert rep.iteration1_delta is not None and abs(rep.iteration1_delta) <= 1e-5
    assert rep.last_half_mean_abs_pct is not None and rep.last_half_mean_abs_pct < 0.1
    assert rep.differences == [] and rep.passed and len(rep.checks) == 2
    files = {Path(f).name for f in rep.files}
    assert files == {"compare.md", "compare.json", "loss.png", "delta.png", "throughput.png"}
    folder = run / "reports" / "compare-ours-fla-reference"
    for name in files:
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (folder / "compare.md").read_text()
    assert md.startswith("# Parity PASS: ours vs ours-fla-reference (fla)\n\n**PASS**: "), md[:200]
    assert "| 1 |" in md and "## Throughput" in md and "None: the same resolved config" in md
    assert "None: each run trained under one resolved config throughout." in md
    assert rep.config_changes == [] and [s.event for s in rep.a.starts] == ["start"]
    assert [s.event for s in rep.b.starts] == ["start"] and rep.b.starts[0].iteration == 0
    assert json.loads((folder / "compare.json").read_text()) == json.loads(r.stdout)
    if recipe != "tiny_kda":
        return
    # the reference is reused, not retrained, on a second call
    before = (ref / "metrics.jsonl").read_text()
    again = cli("compare", str(run), "--fla", "--json")
    assert again.exit_code == 0, again.output
    assert (ref / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_assert_fails_on_a_run_with_another_norm_eps(cli, fast, tmp_path):
    """The bug the seed's project had (a framework default overriding norm eps) is caught: B
    trained with another eps while its records say the recipe's, as that stack's did (a run whose
    records name another eps is another model: no verdict, tests/compare/test_compare_models.py)."""
    with scoped():
        fast.train("tiny_kda", tmp_path / "a", *STEPS[:1], "schedule.warmup_iterations=2",
                   "schedule.iterations=6", "checkpoint.interval=6")  # fmt: skip
        fast.train("tiny_kda", tmp_path / "b", "schedule.warmup_iterations=2",
                   "schedule.iterations=6", "checkpoint.interval=6", "model.norm.eps=0.5")  # fmt: skip
    said = json.loads((tmp_path / "a" / "config.resolved.json").read_text())["config"]["model"]
    record = json.loads((tmp_path / "b" / "config.resolved.json").read_text())
    record["config"]["model"] = said
    (tmp_path / "b" / "config.resolved.json").write_text(json.dumps(record))
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--assert", "--json")
    assert r.exit_code == 3, r.output
    assert "outside tolerance" in r.stderr and "iteration-1" in r.stderr
    rep = _report(r)
    assert not rep.passed
    # Δ = A - B, relative to B (the seed's "Primus - FLA"), said in the report
    for x in rep.loss:
        assert x.delta == pytest.approx(x.a - x.b) and x.delta != 0
        assert x.delta_pct == pytest.approx(100 * (x.a - x.b) / x.b)
    assert rep.iteration1_delta == pytest.approx(rep.loss[0].a - rep.loss[0].b)
    md = Path(rep.files[0]).read_text()
    assert md.startswith("# Parity FAIL: a vs b\n\n**FAIL**: iteration-1 |Δ loss| "), md[:200]
    assert "Δ = A − B (positive: A's loss is higher); Δ% = 100 (A − B) / B" in md
    # the learning rate of each side at each row: the warm-up of 2 then the decay over 6
    lrs = {r["iteration"]: r["lr"] for r in fast.rows(tmp_path / "a")}
    assert [x.lr_a for x in rep.loss] == [lrs[x.iteration] for x in rep.loss]
    assert [x.lr_b for x in rep.loss] == [x.lr_a for x in rep.loss]
    assert len({x.lr_a for x in rep.loss}) > 1
    assert "| Δ (A − B) | Δ% (of B) | LR A | LR B |" in md
    row = next(x for x in rep.loss if x.iteration == 2)
    assert f"| {row.delta:+.4f} | {row.delta_pct:+.3f} | {row.lr_a:.3e} | {row.lr_b:.3e} |" in md
    assert rep.kind == "parity" and rep.model_differences == [] and rep.verdict.result == "FAIL"
    # a looser tolerance passes; without --assert it only reports
    loose = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--assert",
                "--tolerance", "iteration1_abs=10", "--tolerance", "last_half_pct=100")  # fmt: skip
    assert loose.exit_code == 0, loose.output
    assert cli("compare", str(tmp_path / "a"), str(tmp_path / "b")).exit_code == 0


def test_runs_on_other_data_or_batches_are_refused_unless_forced(cli, fast, tmp_path):
    with scoped():
        fast.train(
            "tiny_kda", tmp_path / "a", "schedule.iterations=3", "schedule.warmup_iterations=1"
        )
        fast.train("tiny_kda", tmp_path / "b", "schedule.iterations=3", "schedule.warmup_iterations=1",
                   "batch.global=4")  # fmt: skip
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.exit_code == 2 and "batch.global (8 vs 4)" in r.stderr and "--force" in r.stderr
    forced = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--force", "--json")
    assert forced.exit_code == 0, forced.output
    rep = _report(forced)
    assert rep.forced and any(d.key == "batch.global" and d.must_match for d in rep.differences)
    assert rep.kind == "parity" and rep.finetune is None and rep.passed is not None


def test_hostile_input_is_one_line_exit_2(cli, fast, tmp_path):
    with scoped():
        fast.train(
            "tiny_kda", tmp_path / "a", "schedule.iterations=2", "schedule.warmup_iterations=1"
        )
    a = str(tmp_path / "a")
    cases = [
        ([str(tmp_path / "nope"), a], "no such run directory"),
        ([a], "give RUN_B, or --fla"),
        ([a, a, "--fla"], "give RUN_B, or --fla"),
        ([a, a, "--tolerance", "nope=1"], "--tolerance nope=1"),
        ([a, a, "--tolerance", "eval_pp=nan"], "finite number"),
        ([a, str(tmp_path)], "not a zebractl run directory"),
    ]
    for args, message in cases:
        r = cli("compare", *args)
        assert r.exit_code == 2 and message in r.stderr, (args, r.output)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a damaged metrics line is named with its line number (in a copy of the same run)
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "a", bad)
    with (bad / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "iteration": "x"}\n')
    r = cli("compare", a, str(bad))
    n = len((bad / "metrics.jsonl").read_text().splitlines())
    assert r.exit_code == 2 and f"metrics.jsonl:{n}: not a metrics row" in r.stderr, r.output


def test_the_reference_refuses_what_fla_cannot_train(cli, fast, tmp_path):
    r = cli("train", "tiny_hybrid", *fast.args("schedule.iterations=3"), "--reference", "fla",
            "--output", str(tmp_path / "h"))  # fmt: skip
    assert r.exit_code == 2 and "FLA has no class for this model" in r.stderr, r.output
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=3"), "--reference", "flame",
            "--output", str(tmp_path / "k"))  # fmt: skip
    assert r.exit_code == 2 and "--reference flame" in r.stderr, r.output
    # a reference run's directory is not a zebractl run's (and the other way round)
    out = tmp_path / "k"
    args = [
        *fast.args("schedule.iterations=3", "schedule.warmup_iterations=1"),
        "--output",
        str(out),
    ]
    with scoped():  # the in-process train's process group goes with it
        assert cli("train", "tiny_kda", *args, "--reference", "fla").exit_code == 0
        r = cli("train", "tiny_kda", *args)
    assert r.exit_code == 2 and "holds a run of the fla reference" in r.stderr, r.output


@pytest.mark.slow
def test_a_stopped_reference_run_resumes_bitwise(cli, fast, tmp_path):
    """The reference checkpoints (FLA's names, megatron's format) resume like any run."""
    parts = tmp_path / "parts"
    sets = ("schedule.iterations=4", "schedule.warmup_iterations=1", "checkpoint.interval=2")
    from zebractl.run.records import ResolvedConfigRecord
    from zebractl.run.rundir import RunDir
    from zebractl.train.trainer import Trainer

    r = fast.resolve("tiny_kda", *sets)
    record = ResolvedConfigRecord.of(r).model_copy(update={"reference": "fla"})
    ref_whole = tmp_path / "ref_whole"
    with scoped():
        Trainer(r.run, RunDir(ref_whole), record, console=lambda s: None).fit()
    with scoped():
        Trainer(r.run, RunDir(parts), record, console=lambda s: None, stop_after=3).fit()
    with scoped():
        Trainer(r.run, RunDir(parts), record, console=lambda s: None).fit()
    assert fast.losses(parts) == fast.losses(ref_whole)
    assert len(fast.losses(ref_whole)) == 4


def test_eval_deltas_in_points_and_their_tolerance(cli, fast, tmp_path):
    """Both runs' eval/results.json (`zebractl eval`) give a per-task table in points."""
    from zebractl.schemas.reports import EvalMetric, EvalReport, EvalTaskResult

    a = tmp_path / "a"
    with scoped():
        fast.train("tiny_kda", a, "schedule.iterations=2", "schedule.warmup_iterations=1")
    b = tmp_path / "b"
    shutil.copytree(a, b)

    def results(run, acc, acc_norm):
        task = EvalTaskResult(
            task="arc_easy", lm_eval_task="zebractl_arc_easy", status="ok", split="test",
            primary=["acc", "acc_norm"],
            metrics={"acc": EvalMetric(value=acc), "acc_norm": EvalMetric(value=acc_norm)},
            samples=100, documents=2376,
        )  # fmt: skip
        skipped = EvalTaskResult(
            task="race", lm_eval_task="zebractl_race", status="skipped", reason="offline",
            split="test", primary=["acc"],
        )  # fmt: skip
        rep = EvalReport(
            model=str(run), source="run", model_class="ZebraForCausalLM", iteration=2,
            fingerprint="0" * 64, lm_eval_version="0.4.13", data_package="x", device="cpu",
            dtype="fp32", batch_size="16", max_length=64, limit=100, wall_seconds=1.0,
            lm_eval_seconds=1.0, results_file="r", tasks=[task, skipped],
        )  # fmt: skip
        (run / "eval").mkdir(exist_ok=True)
        (run / "eval/results.json").write_text(rep.model_dump_json())

    results(a, 0.40, 0.30)
    results(b, 0.43, 0.29)
    r = cli("compare", str(a), str(b), "--assert", "--json")
    assert r.exit_code == 3 and "eval mean |Δ| (points)" in r.stderr, r.output
    rep = _report(r)
    assert [(e.task, e.metric) for e in rep.eval] == [("arc_easy", "acc"), ("arc_easy", "acc_norm")]
    assert rep.eval[0].a == pytest.approx(40.0) and rep.eval[0].delta_pp == pytest.approx(-3.0)
    assert rep.eval_mean_abs_pp == pytest.approx(2.0)
    md = Path(rep.files[0]).read_text()
    assert "## Eval (points)" in md and "| arc_easy | acc | 40.00 | 43.00 | -3.00 |" in md
    assert "| task | metric | a | b | Δ (A − B) |" in md
    ok = cli("compare", str(a), str(b), "--assert", "--tolerance", "eval_pp=2.5")
    assert ok.exit_code == 0, ok.output
    # a damaged results file is named
    (b / "eval/results.json").write_text("{")
    r = cli("compare", str(a), str(b))
    assert r.exit_code == 2 and "not a zebractl eval report" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _eval_results(run, iteration, tasks, limit=100):
    """Write RUN/eval/results.json: ``tasks`` maps a task to ({metric: value}, data sha256)."""
    from zebractl.schemas.reports import EvalMetric, EvalReport, EvalTaskResult

    rows = [
        EvalTaskResult(
            task=task,
            lm_eval_task=f"zebractl_{task}",
            status="ok",
            split="test",
            primary=list(metrics),
            samples=limit,
            documents=2376,
            data_sha256={"f": sha},
            metrics={k: EvalMetric(value=v, stderr=0.05) for k, v in metrics.items()},
        )
        for task, (metrics, sha) in tasks.items()
    ]
    rep = EvalReport(
        model=str(run), source="run", model_class="ZebraForCausalLM", iteration=iteration,
        fingerprint="0" * 64, lm_eval_version="0.4.13", data_package="x", device="cpu",
        dtype="fp32", batch_size="16", max_length=64, limit=limit, wall_seconds=1.0,
        lm_eval_seconds=1.0, results_file="r", tasks=rows,
    )  # fmt: skip
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval/results.json").write_text(rep.model_dump_json())


@pytest.mark.slow
def test_a_fine_tune_and_its_initial_run_are_a_before_after_pair(cli, fast, tmp_path):
    """`compare SFT BASE` (SFT's init_from is BASE): no refusal for other data, no parity number,
    no check; each task's eval delta is after - before whichever order the runs are given in."""
    base, sft = tmp_path / "base", tmp_path / "sft"
    sets = ("schedule.iterations=2", "schedule.warmup_iterations=1", "checkpoint.interval=2")
    with scoped():
        fast.train("tiny_kda", base, *sets)
        # train --init-from, and another batch (a must-match key a parity pair is refused for)
        r = cli("train", "tiny_kda", *fast.args(*sets, "batch.global=4"), "--init-from",
                str(base), "--output", str(sft))  # fmt: skip
    assert r.exit_code == 0, r.output
    init = json.loads((sft / "init.json").read_text())
    assert init["given_by"] == "--init-from" and init["iteration"] == 2
    assert init["run"] == str(base.resolve()) and init["checkpoint"].endswith("iter_0000002")
    record = json.loads((sft / "config.resolved.json").read_text())
    assert record["config"]["init_from"] == str(base)
    assert record["provenance"]["init_from"] == "--init-from"
    wiki = {"word_perplexity": 900.0, "bits_per_byte": 3.0}
    # the base's eval is of iteration 1, not of the iteration 2 the fine-tune started from
    _eval_results(base, 1, {"arc_easy": ({"acc": 0.40, "acc_norm": 0.30}, "s"),
                            "wikitext-like": (wiki, "base-held-out")})  # fmt: skip
    _eval_results(sft, 2, {"arc_easy": ({"acc": 0.43, "acc_norm": 0.29}, "s"),
                           "piqa": ({"acc_norm": 0.6}, "p"),
                           "wikitext-like": (wiki, "sft-held-out")})  # fmt: skip

    r = cli("compare", str(sft), str(base), "--json")
    assert r.exit_code == 0, r.output
    rep = _report(r)
    f = rep.finetune
    assert rep.kind == "finetune" and f is not None and (f.after, f.before) == ("a", "b")
    assert f.iteration == 2 and f.recorded_in == str(sft / "init.json")
    assert f.given_by == "--init-from" and f.data_format == "text"
    assert not rep.forced and any(d.key == "batch.global" and d.must_match for d in rep.differences)
    # no parity number, no check, no verdict
    assert rep.loss == [] and rep.curves.iterations == [] and rep.iteration1_delta is None
    assert rep.last_half_mean_abs_pct is None and rep.val_loss.delta is None
    assert rep.eval == [] and rep.eval_mean_abs_pp is None
    assert rep.checks == [] and rep.passed is None
    got = {(e.task, e.metric): (e.before, e.after, e.delta, e.unit) for e in f.eval}
    assert got == {
        ("arc_easy", "acc"): pytest.approx((40.0, 43.0, 3.0, "points")),
        ("arc_easy", "acc_norm"): pytest.approx((30.0, 29.0, -1.0, "points")),
    }
    assert f.eval[0].before_stderr == pytest.approx(5.0)
    reasons = {x.task: x.reason for x in f.eval_not_compared}
    assert set(reasons) == {"piqa", "wikitext-like"}
    assert "fine-tuned run only" in reasons["piqa"] and f"--data {base}" in reasons["wikitext-like"]
    assert any("iteration 1" in n and "iteration 2" in n for n in f.notes), f.notes
    assert [x.iteration for x in f.train_loss] == [1, 2]
    assert {Path(x).name for x in rep.files} == {
        "compare.md", "compare.json", "loss.png", "throughput.png"
    }  # fmt: skip
    md = Path(rep.files[0]).read_text()
    assert md.startswith("# Fine-tune: sft from base\n") and "## Eval: after − before (A − B)" in md
    assert "| arc_easy | acc (points) | 40.00 | 43.00 | +3.00 |" in md
    assert "| arc_easy | acc_norm (points) | 30.00 | 29.00 | -1.00 (worse) |" in md
    assert "(must match)" not in md and "Parity" not in md and "PASS" not in md
    assert "FAIL" not in md

    # the other order: B is the fine-tune; the delta is still after - before
    rev = _report(cli("compare", str(base), str(sft), "--json"))
    assert rev.finetune is not None and (rev.finetune.after, rev.finetune.before) == ("b", "a")
    assert [e.delta for e in rev.finetune.eval] == [e.delta for e in f.eval]

    # the terminal: the table and a verdict that claims no parity
    plain = cli("compare", str(sft), str(base))
    assert plain.exit_code == 0, plain.output
    verdict = plain.stdout.strip().splitlines()[-2]
    assert verdict.startswith("before/after: sft is a fine-tune of base (iteration 2)"), verdict
    assert "parity checks do not apply" in verdict and "PASS" not in plain.stdout
    assert "+3.00" in plain.stdout and "FAIL" not in plain.stdout

    # --assert and --tolerance have no parity to check: exit 2, one line, nothing written
    out = tmp_path / "asserted"
    for extra in (["--assert"], ["--tolerance", "eval_pp=5"]):
        r = cli("compare", str(sft), str(base), "--output", str(out), *extra)
        assert r.exit_code == 2 and "is a fine-tune of" in r.stderr, r.output
        assert extra[0] in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (out / "compare.md").exists() and not (out / "compare.json").exists()

    # a run trained before init.json: its resolved init_from says the same (no iteration)
    (sft / "init.json").unlink()
    old = _report(cli("compare", str(sft), str(base), "--json"))
    assert old.kind == "finetune" and old.finetune is not None
    assert old.finetune.recorded_in == str(sft / "config.resolved.json")
    assert old.finetune.iteration is None and old.finetune.checkpoint is None
    # and two runs without that relation are a parity pair, refused for the other batch
    record["config"]["init_from"] = None
    (sft / "config.resolved.json").write_text(json.dumps(record))
    r = cli("compare", str(sft), str(base))
    assert r.exit_code == 2 and "batch.global (4 vs 8)" in r.stderr, r.output


def _span(ax, label_start):
    """The y extent, in data units, of the patch whose label starts with ``label_start``."""
    (artist,) = [p for p in ax.patches if p.get_label().startswith(label_start)]
    shown = artist.get_transform().transform(artist.get_path().vertices)
    ys = ax.transData.inverted().transform(shown)[:, 1]
    return float(ys.min()), float(ys.max())


@pytest.mark.slow
def test_a_resume_with_another_schedule_is_a_config_change_in_the_report(cli, fast, tmp_path):
    """Issue 30: a run trained 10 iterations, then resumed with 12 (another learning-rate schedule
    for its first 10). config.resolved.json holds the newest config only, so the report said
    "Config differences: None". RUN/config.history.jsonl keeps every start; the report names the
    change, the learning rates show it, and CPU throughput is marked not meaningful."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zebractl.compare import render

    a, b = tmp_path / "a", tmp_path / "b"
    sets = ("checkpoint.interval=5", "validation={interval: 5, iterations: 1}")
    with scoped():
        fast.train("tiny_kda", a, *sets, "schedule.iterations=10")
    with scoped():
        fast.train("tiny_kda", a, *sets, "schedule.iterations=12")
    with scoped():  # complete, nothing changed: it trains nothing and records nothing (issue 42)
        fast.train("tiny_kda", a, *sets, "schedule.iterations=12")
    with scoped():
        fast.train("tiny_kda", b, *sets, "schedule.iterations=12")
    lines = [json.loads(x) for x in (a / "config.history.jsonl").read_text().splitlines()]
    assert [(x["event"], x["iteration"], x["changed"]) for x in lines] == [
        ("start", 0, []), ("resume", 10, ["schedule.iterations"])
    ]  # fmt: skip
    assert [x["record"]["config"]["schedule"]["iterations"] for x in lines] == [10, 12]
    assert all(x["device"] == "cpu" and x["world_size"] == 1 for x in lines)
    assert len({x["run_id"] for x in lines}) == 2
    newest = json.loads((a / "config.resolved.json").read_text())
    assert newest["config"]["schedule"]["iterations"] == 12  # overwritten: the history is not

    r = cli("compare", str(a), str(b), "--tolerance", "last_half_pct=2.5", "--json")
    assert r.exit_code == 0, r.output
    rep = _report(r)
    assert rep.differences == []  # the newest configs are the same ...
    (change,) = rep.config_changes  # ... but A changed its own at the resume
    assert (change.side, change.iteration, change.key) == ("a", 10, "schedule.iterations")
    assert (change.before, change.after, change.after_source) == (10, 12, "--set")
    assert change.run_id == lines[1]["run_id"]
    assert [(s.event, s.iteration, s.changed) for s in rep.a.starts] == [
        ("start", 0, []), ("resume", 10, ["schedule.iterations"])
    ]  # fmt: skip
    # the learning rates tell the two schedules apart where the losses are compared
    eight = next(x for x in rep.loss if x.iteration == 8)
    assert eight.lr_a is not None and eight.lr_b is not None and eight.lr_a < eight.lr_b
    md = Path(rep.files[0]).read_text()
    assert md.startswith("# Parity ") and md.splitlines()[2].startswith(("**PASS**", "**FAIL**"))
    warning = md.splitlines()[4]
    assert warning.startswith(
        "**Config changed within a run** (at a resume): A from iteration 10: schedule.iterations "
        "`10` → `12`."
    ), md[:600]
    assert "| A | 10 | schedule.iterations | `10` | `12` | --set | --set |" in md
    assert "None: the same resolved config (the newest of each run; see the changes" in md
    assert "resume at iteration 10 on cpu" in md
    # CPU throughput: kept, marked not meaningful
    assert rep.a.device == "cpu" and rep.b.device == "cpu"
    assert not rep.throughput.meaningful and "CPU" in (rep.throughput.note or "")
    assert rep.throughput.ratio.tokens_per_s is not None
    assert "**Not meaningful**: a and b trained on a CPU" in md
    assert "| tokens/s (CPU: not meaningful) |" in md and "| tokens/s/GPU |" not in md

    # loss.png draws the validation losses, delta.png the tolerance band
    assert [p.iteration for p in rep.curves.val_a] == [5, 10, 12]
    assert [p.iteration for p in rep.curves.val_b] == [5, 10, 12]
    val = {x["iteration"]: x["val_loss"] for x in fast.rows(a, "val")}
    assert [p.loss for p in rep.curves.val_a] == [val[5], val[10], val[12]]
    fig = render.loss_figure(rep, plt)
    lines_drawn = {line.get_label(): line for line in fig.axes[0].lines}
    assert list(lines_drawn["A a (validation)"].get_xdata()) == [5, 10, 12]
    assert list(lines_drawn["B b (validation)"].get_ydata()) == [p.loss for p in rep.curves.val_b]
    assert list(lines_drawn["config changed (resume)"].get_xdata()) == [10, 10]
    plt.close(fig)
    fig = render.delta_figure(rep, plt)
    ax = fig.axes[0]
    assert _span(ax, "tolerance ±2.5%") == pytest.approx((-2.5, 2.5))
    pct = [100 * (x - y) / y for x, y in zip(rep.curves.a, rep.curves.b, strict=True)]
    assert list(next(x for x in ax.lines if x.get_label() == "Δ%").get_ydata()) == pct
    plt.close(fig)

    # the terminal says it too
    plain = cli("compare", str(a), str(b))
    assert plain.exit_code == 0, plain.output
    assert (
        "config changed within A from iteration 10 (a resume): schedule.iterations 10 -> 12"
        in plain.stdout
    )
    assert "throughput A/B n/a (CPU: not meaningful)" in plain.stdout
    # the other order: the change is B's
    rev = _report(cli("compare", str(b), str(a), "--json"))
    assert [(c.side, c.key) for c in rev.config_changes] == [("b", "schedule.iterations")]


@pytest.mark.slow
def test_a_run_trained_before_the_config_history(cli, fast, tmp_path):
    """A run directory without config.history.jsonl: compare reads its resolved config as the one
    known start (a CPU run: no TFLOP/s logged); its next start keeps that config in the history
    before config.resolved.json is overwritten. A damaged history line is named."""
    a = tmp_path / "a"
    sets = ("schedule.iterations=3", "schedule.warmup_iterations=1", "checkpoint.interval=3")
    with scoped():
        fast.train("tiny_kda", a, *sets)
    history = a / "config.history.jsonl"
    history.unlink()
    old = json.loads((a / "config.resolved.json").read_text())
    rep = _report(cli("compare", str(a), str(a), "--json"))
    assert [(s.event, s.iteration, s.run_id) for s in rep.a.starts] == [("found", None, None)]
    assert rep.a.device == "cpu" and rep.config_changes == [] and not rep.throughput.meaningful
    with scoped():
        fast.train("tiny_kda", a, *sets, "schedule.min_lr=1e-4")
    lines = [json.loads(x) for x in history.read_text().splitlines()]
    assert [(x["event"], x["iteration"]) for x in lines] == [("found", None), ("resume", 3)]
    assert lines[0]["record"] == old and lines[1]["changed"] == ["schedule.min_lr"]
    rep = _report(cli("compare", str(a), str(a), "--json"))
    assert [(c.side, c.iteration, c.key) for c in rep.config_changes] == [
        ("a", 3, "schedule.min_lr"), ("b", 3, "schedule.min_lr")
    ]  # fmt: skip
    # a torn last line (a crash while appending) is skipped; a damaged earlier one is named
    with history.open("a") as f:
        f.write('{"event": "resu')
    assert cli("compare", str(a), str(a)).exit_code == 0
    history.write_text("{}\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    r = cli("compare", str(a), str(a))
    assert r.exit_code == 2 and "config.history.jsonl:1: not a config history line" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
