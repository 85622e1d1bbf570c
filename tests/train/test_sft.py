"""Supervised fine-tuning (issue 29): `tiny_sft` starts from a pretrained tiny run named by the
recipe's `init_from`, trains on the assistant turns of the demo conversations and lowers their
loss; its Hugging Face export answers a chat prompt through `transformers` in a fresh process;
`zebractl eval` scores both runs and `zebractl compare SFT BASE` is their before/after report.
A missing `init_from` is a config error (exit 2) before anything is built. Seed: the recipes' 1234."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.errors import ConfigError  # noqa: E402


def _train(recipe, out, *sets, console=None):
    from zebractl.run import ResolvedConfigRecord, RunDir
    from zebractl.train.trainer import Trainer

    r = resolve_recipe(recipe, [*sets, f"output_dir={out}"])
    run = RunDir.for_recipe(r.run, r.name)
    return Trainer(
        r.run, run, ResolvedConfigRecord.of(r), console=console or (lambda s: None)
    ).fit()


def _rows(out, kind):
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [r for r in rows if r["kind"] == kind]


@pytest.fixture(scope="module")
def pair(demo_chat, tmp_path_factory, shipped_run) -> SimpleNamespace:
    """tiny_hybrid as shipped, stopped after 20 iterations (a copy of conftest's shipped_run, the
    golden test's run, trained once per session), and tiny_sft fine-tuned from its checkpoint of
    iteration 20 for 20 (trained once for this module): ``base``, ``sft``, the SFT's RunResult and
    what it said."""
    root = tmp_path_factory.mktemp("sft_pair")
    base = root / "tiny_hybrid"
    shutil.copytree(shipped_run("tiny_hybrid"), base)
    said: list[str] = []
    sft = root / "tiny_sft"
    result = _train(
        "tiny_sft",
        sft,
        f"data.paths=[{{path: {demo_chat}}}]",
        f"init_from={base}",
        "schedule.iterations=20",
        "validation={interval: 20, iterations: 4}",
        "logging.interval=1",
        "logging.tensorboard=false",
        console=said.append,
    )
    return SimpleNamespace(base=base, sft=sft, result=result, said=said)


@pytest.mark.slow
def test_tiny_sft_lowers_the_assistant_loss_and_its_export_answers(pair, tmp_path, cli):
    base, sft, result, said = pair.base, pair.sft, pair.result, pair.said
    assert result.stopped == "done"
    assert any(s.startswith("initialised weights from") and str(base) in s for s in said), said
    losses = [r["loss"] for r in _rows(sft, "train")]
    # iteration 1's loss is the pretrained model's on assistant tokens (before any update)
    first, last = losses[0], sum(losses[-5:]) / 5
    val = _rows(sft, "val")[-1]["val_loss"]
    assert val == result.val_loss
    print(f"seed 1234: assistant loss {first:.4f} -> {last:.4f} (held-out {val:.4f})")
    assert last < first - 0.3 and val < first - 0.3, (first, last, val)

    hf = tmp_path / "hf"
    done = cli("convert", str(sft), str(hf))
    assert done.exit_code == 0, done.output
    code = (
        "import zebractl.hf, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "prompt = '<|im_start|>user\\nWhat is 2 + 3?<|im_end|>\\n<|im_start|>assistant\\n'\n"
        "ids = tok(prompt, return_tensors='pt').input_ids\n"
        "out = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)\n"
        "print('answer', repr(tok.decode(out[0, ids.shape[1]:])))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(hf)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    answer = p.stdout.split("answer ", 1)[1].strip()
    assert answer not in ("''", '""'), p.stdout


@pytest.mark.slow
def test_eval_and_compare_give_the_before_after_report(pair, cli):
    """`zebractl eval BASE && zebractl eval SFT && zebractl compare SFT BASE`: one report naming
    BASE as SFT's init (the checkpoint of iteration 20), each task's delta after - before (SFT -
    BASE) from the two results files, the SFT's assistant-token losses; exit 0. The held-out
    perplexity is not compared (each run holds out other documents); --assert is exit 2."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("matplotlib")
    from zebractl.evaluate import tasks as T

    try:
        T.data_root()
    except ConfigError as exc:
        pytest.skip(str(exc))
    from zebractl.schemas.reports import CompareReport, EvalReport

    base, sft = pair.base, pair.sft
    evals = {}
    for run in (base, sft):
        r = cli("eval", str(run), "--tasks", "arc_easy,wikitext-like", "--limit", "4", "--json")
        assert r.exit_code == 0, r.output
        evals[run] = EvalReport.model_validate_json(r.stdout)
    assert evals[sft].iteration == 20 and evals[base].iteration == 20

    r = cli("compare", str(sft), str(base), "--json")
    assert r.exit_code == 0, r.output
    rep = CompareReport.model_validate_json(r.stdout)
    f = rep.finetune
    assert rep.kind == "finetune" and f is not None and (f.after, f.before) == ("a", "b")
    assert f.iteration == 20 and f.notes == [] and f.data_format == "chat"
    assert Path(f.checkpoint).parent.parent == base.resolve()
    assert f.recorded_in == str(sft / "init.json") and f.init_from == str(base)
    assert rep.checks == [] and rep.passed is None and rep.loss == []

    def value(run, metric):
        (task,) = [t for t in evals[run].tasks if t.task == "arc_easy"]
        return 100 * task.metrics[metric].value

    assert [(e.task, e.metric) for e in f.eval] == [("arc_easy", "acc"), ("arc_easy", "acc_norm")]
    for e in f.eval:
        assert (e.before, e.after) == (value(base, e.metric), value(sft, e.metric))
        assert e.delta == pytest.approx(value(sft, e.metric) - value(base, e.metric))
    (skipped,) = f.eval_not_compared
    assert skipped.task == "wikitext-like" and "held-out" in skipped.reason
    sft_rows = _rows(sft, "train")
    assert f.train_loss[0].iteration == 1 and f.train_loss[0].loss == sft_rows[0]["loss"]
    assert f.val_loss[-1].loss == pair.result.val_loss
    md = (sft / "reports" / "compare-tiny_hybrid" / "compare.md").read_text()
    assert "# Fine-tune: tiny_sft from tiny_hybrid" in md
    assert "started from tiny_hybrid's checkpoint of iteration 20" in md
    assert "## Eval: after − before (A − B)" in md and "assistant tokens only" in md

    r = cli("compare", str(sft), str(base), "--assert")
    assert r.exit_code == 2 and "no parity to assert" in r.stderr, r.output


def test_a_missing_init_from_is_a_config_error_before_the_build(demo_chat, tmp_path):
    with pytest.raises(ConfigError, match="init_from .*no such run directory"):
        _train(
            "tiny_sft",
            tmp_path / "sft",
            f"data.paths=[{{path: {demo_chat}}}]",
            f"init_from={tmp_path / 'nowhere'}",
        )
