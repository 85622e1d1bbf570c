"""`zebractl train RECIPE --check` for every shipped recipe, with only the data path and tokenizer
overridden: on this CPU machine everything but the GPU count and memory is checked and passes;
what needs CUDA is listed as not checked, never as passed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("tokenizers")

from zebractl.config import catalog  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_vocab_data(tmp_path_factory) -> Path:
    """A few real documents prepared with a 512-token BPE trained on them: a vocabulary smaller
    than every shipped model's, so the data fits any recipe."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from zebractl.data.demo import write_sources
    from zebractl.data.prepare import PrepareOptions, prepare

    root = tmp_path_factory.mktemp("small_vocab")
    srcs = write_sources(root / "sources")
    texts = []
    for src in srcs:
        for line in Path(src).read_text(encoding="utf-8").splitlines()[:200]:
            texts.append(json.loads(line)["text"] if line.startswith("{") else line)
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:300] if t.strip()))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tdir = root / "tok"
    tdir.mkdir()
    tok.save(str(tdir / "tokenizer.json"))
    (tdir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    prepare(PrepareOptions(inputs=(str(docs),), tokenizer=str(tdir), output=str(root / "data")))
    return root / "data"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(catalog.shipped("recipe")))
def test_every_shipped_recipe_passes_its_check(
    cli, small_vocab_data, demo_chat, recipe, monkeypatch
):
    from zebractl.config.resolve import resolve_recipe
    from zebractl.run import disk

    data = small_vocab_data
    if resolve_recipe(recipe, []).run.data.format == "chat":  # the demo conversations (GPT-2)
        data = demo_chat

    # the disk check compares this machine's free space with an 8B model's checkpoint (112 GB);
    # tests/train/test_disk_errors.py tests it
    monkeypatch.setattr(disk, "free_bytes", lambda path: 2**50)
    r = cli(
        "train", recipe, "--check", "--json",
        "--set", f"data.paths=[{{path: {data}}}]", "--set", "data.tokenizer=null",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    from zebractl.schemas.reports import TrainCheckReport

    rep = TrainCheckReport.model_validate_json(r.stdout)
    import jsonschema

    schema = json.loads((REPO / "schemas/reports" / TrainCheckReport.schema_file()).read_text())
    jsonschema.validate(json.loads(r.stdout), schema)
    status = {c.name: c.status for c in rep.checks}
    assert rep.ok and status["config"] == status["data"] == status["disk"] == "ok", rep.checks
    import torch

    if not torch.cuda.is_available():
        assert status["gpus"] == status["memory"] == "not checked"
        assert status["engine"] in ("ok", "not checked")


def test_what_fails_is_named_and_exits_3(cli, small_vocab_data, tmp_path):
    data = f"data.paths=[{{path: {small_vocab_data}}}]"
    r = cli("train", "tiny_kda", "--check", "--set", data, "--set", "data.tokenizer=null",
            "--set", "data.split=null")  # fmt: skip
    assert r.exit_code == 3, r.output
    assert "validation is on" in r.stdout and "data failed" in r.stderr
    r = cli("train", "tiny_kda", "--check", "--set", f"data.paths=[{{path: {tmp_path}}}]")
    assert r.exit_code == 3 and "data" in r.stderr, r.output
    # a CUDA-only engine on a CPU machine: not checked (exit 0), never passed
    import torch

    if not torch.cuda.is_available():
        r = cli("train", "tiny_kda", "--check", "--json", "--set", data,
                "--set", "data.tokenizer=null", "--set", "optimizer.impl=megatron")  # fmt: skip
        assert r.exit_code == 0, r.output
        (engine,) = [c for c in json.loads(r.stdout)["checks"] if c["name"] == "engine"]
        assert engine["status"] == "not checked" and "megatron" in engine["detail"]


def test_setting_iterations_clears_train_tokens_and_config_show_says_so(cli):
    r = cli("config", "show", "kda_1B", "--set", "schedule.iterations=500", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["config"]["schedule"]["iterations"] == 500
    assert doc["config"]["schedule"]["train_tokens"] is None
    assert doc["provenance"]["schedule.train_tokens"] == "cleared by --set schedule.iterations"
    back = cli("config", "show", "kda_1B", "--set", "schedule.iterations=500",
               "--set", "schedule.train_tokens=1000000000", "--json")  # fmt: skip
    doc = json.loads(back.stdout)
    assert doc["config"]["schedule"]["iterations"] is None
    assert doc["provenance"]["schedule.iterations"] == "cleared by --set schedule.train_tokens"
