"""Supervised fine-tuning (issue 29): `tiny_sft` starts from a pretrained tiny run named by the
recipe's `init_from`, trains on the assistant turns of the demo conversations and lowers their
loss; its Hugging Face export answers a chat prompt through `transformers` in a fresh process.
A missing `init_from` is a config error (exit 2) before anything is built. Seed: the recipes' 1234."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from zebractl.config.errors import ConfigError  # noqa: E402
from zebractl.config.resolve import resolve_recipe  # noqa: E402


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


def test_tiny_sft_lowers_the_assistant_loss_and_its_export_answers(
    demo_data, demo_chat, tmp_path, cli
):
    base = tmp_path / "tiny_hybrid"
    _train(
        "tiny_hybrid",
        base,
        f"data.paths=[{{path: {demo_data}}}]",
        "schedule.iterations=20",
        "validation=null",
        "logging.tensorboard=false",
    )
    said: list[str] = []
    sft = tmp_path / "tiny_sft"
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
    assert result.stopped == "done"
    assert any(s.startswith("initialised weights from") and str(base) in s for s in said), said
    losses = [r["loss"] for r in _rows(sft, "train")]
    # iteration 1's loss is the pretrained model's on assistant tokens (before any update)
    first, last = losses[0], sum(losses[-5:]) / 5
    val = _rows(sft, "valid")[-1]["loss"] if _rows(sft, "valid") else result.val_loss
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


def test_a_missing_init_from_is_a_config_error_before_the_build(demo_chat, tmp_path):
    with pytest.raises(ConfigError, match="init_from .*no such run directory"):
        _train(
            "tiny_sft",
            tmp_path / "sft",
            f"data.paths=[{{path: {demo_chat}}}]",
            f"init_from={tmp_path / 'nowhere'}",
        )
