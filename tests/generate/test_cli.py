"""`zebractl generate` and `zebractl chat` end to end on tiny runs (CPU), and their bad input.

A tiny_kda run (the session's ``trained`` fixture) and a tiny chat run (tiny_sft's recipe trained
2 iterations on the demo conversations, no base run). Greedy decoding throughout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

_CHAT: dict[str, Path] = {}


@pytest.fixture
def chat_run(tmp_path_factory, fast, demo_chat) -> Path:
    if "run" not in _CHAT:
        out = tmp_path_factory.mktemp("chat") / "run"
        fast.train(
            "tiny_sft",
            out,
            "init_from=null",
            f"data.paths=[{{path: {demo_chat}}}]",
            "schedule.iterations=2",
            "checkpoint.interval=2",
        )
        _CHAT["run"] = out
    return _CHAT["run"]


def _zebractl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "zebractl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_generate_streams_and_reports(cli, trained):
    res = cli(
        "generate", str(trained), "--prompt", "Once upon a time", "--max-new-tokens", "8", "--json"
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["new_tokens"] + (doc["stop_reason"] == "eos") >= 1
    assert doc["source_kind"] == "run" and doc["iteration"] == 4
    assert doc["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    assert doc["prompt_tokens"] > 0 and doc["prefill_seconds"] >= 0
    again = cli("generate", str(trained), "--prompt", "Once upon a time", "--max-new-tokens", "8")
    assert again.exit_code == 0
    assert again.stdout.rstrip("\n") == doc["text"]  # streamed: the same text, then a newline
    assert "tokens" in again.stderr  # the summary goes to stderr
    assert doc["cuda_graph"] is None  # on by default, but only on a CUDA GPU: not said here
    assert "cuda-graph" not in again.stderr and "cuda-graph" not in res.stderr
    graphed = cli(
        "generate",
        str(trained),
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "8",
        "--cuda-graph",
        "--json",
    )  # on a CPU: said, and the same text without it
    assert graphed.exit_code == 0, graphed.stderr
    assert "--cuda-graph" in graphed.stderr and "without it" in graphed.stderr
    assert json.loads(graphed.stdout)["text"] == doc["text"]


def test_sampling_is_seeded(cli, trained):
    args = [
        str(trained),
        "--prompt",
        "The",
        "--max-new-tokens",
        "12",
        "--temperature",
        "1.5",
        "--json",
    ]
    a, b = (json.loads(cli("generate", *args, "--seed", "3").stdout) for _ in range(2))
    assert a["text"] == b["text"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--prompt", ""], "empty"),
        (["--prompt", "   \n"], "empty"),
        ([], "exactly one of --prompt"),
        (["--prompt", "a", "--prompt-file", "x.txt"], "exactly one of --prompt"),
        (["--prompt", "a", "--top-p", "2"], "--top-p 2"),
        (["--prompt", "a", "--top-p", "0"], "--top-p 0"),
        (["--prompt", "a", "--temperature", "-1"], "--temperature -1"),
        (["--prompt", "a", "--temperature", "nan"], "--temperature nan"),
        (["--prompt", "a", "--top-k", "-3"], "--top-k -3"),
        (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens 0"),
        (["--prompt-file", "missing.txt"], "missing.txt"),
    ],
)
def test_bad_options_exit_2(cli, trained, args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("generate", str(trained), *args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert needle in res.stderr and "Traceback" not in res.stderr


def test_bad_sources_exit_2(cli, trained, tmp_path):
    res = cli("generate", str(tmp_path / "nothing"), "--prompt", "a")
    assert res.exit_code == 2 and "no such model folder" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli("generate", str(empty), "--prompt", "a")
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    damaged = tmp_path / "damaged"
    shutil.copytree(trained, damaged)
    for f in (damaged / "checkpoints" / "iter_0000004").rglob("*.distcp"):
        f.write_bytes(b"\0" * 16)
    res = cli("generate", str(damaged), "--prompt", "a", "--checkpoint", "4")
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr


def test_a_prompt_longer_than_the_positions_exits_2(cli, trained):
    res = cli("generate", str(trained), "--prompt", "word " * 5000)
    assert res.exit_code == 2 and "positions" in res.stderr, res.stderr


def test_chat_through_a_pipe_feeds_only_each_new_turn(cli, chat_run, demo_chat, tmp_path):
    """Three turns from a pipe: after the first, each turn feeds fewer tokens than the whole
    conversation, and the last reply equals a generation from a from-scratch render of the whole
    conversation (rendered with the run's template, tokenized as one text)."""
    res = _zebractl(
        "chat",
        str(chat_run),
        "--max-new-tokens",
        "10",
        "--json",
        stdin="hello\nwhat is 2+2?\nthanks\n",
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["template"] == "chatml" and len(doc["turns"]) == 3
    from transformers import AutoTokenizer

    from zebractl.data.chat import CHATML_JINJA, Message
    from zebractl.data.chat_template import JinjaTemplate

    tok = AutoTokenizer.from_pretrained(str(demo_chat / "tokenizer"))
    tpl = JinjaTemplate("chatml", CHATML_JINJA)
    msgs: list[Message] = []
    for i, turn in enumerate(doc["turns"]):
        msgs.append(Message("user", turn["user"]))
        whole = len(tok(tpl.render(msgs, True, "test"), add_special_tokens=False)["input_ids"])
        if i == 0:
            assert turn["prefill_tokens"] == whole
        elif turn["fed"] == "incremental":
            assert turn["prefill_tokens"] < whole, (i, turn, whole)
        msgs.append(Message("assistant", turn["reply"]))
    prompt = tmp_path / "conversation.txt"
    prompt.write_text(tpl.render(msgs[:-1], True, "test"), encoding="utf-8")
    # the from-scratch generation in this process (the pipe is the chat's): a third start-up of
    # torch and megatron in a process of its own tested nothing more
    scratch = cli(
        "generate",
        str(chat_run),
        "--prompt-file",
        str(prompt),
        "--max-new-tokens",
        "10",
        "--stop",
        "<|im_end|>",
        "--json",
    )
    assert scratch.exit_code == 0, scratch.stderr
    assert json.loads(scratch.stdout)["text"] == doc["turns"][-1]["reply"]


def test_an_fla_export_generates_what_the_run_does(cli, trained, tmp_path):
    """tiny_kda exports to FLA's KDAForCausalLM; on a CPU it runs through FLA's reference code
    without a cache (every token recomputes the sequence). fp32 weights on both sides; greedy: the
    same text as the run."""
    assert cli("convert", str(trained), str(tmp_path / "hf"), "--dtype", "fp32").exit_code == 0
    args = ["--prompt", "Once upon a time", "--max-new-tokens", "6", "--json"]
    ours = json.loads(cli("generate", str(trained), *args).stdout)
    res = cli("generate", str(tmp_path / "hf"), *args)
    assert res.exit_code == 0, res.stderr
    theirs = json.loads(res.stdout)
    assert theirs["model_class"] == "KDAForCausalLM" and theirs["source_kind"] == "hf"
    assert theirs["text"] == ours["text"] and theirs["new_tokens"] == ours["new_tokens"]


def test_an_export_carries_the_data_template_and_chats_like_the_run(cli, chat_run, tmp_path):
    """`convert` writes the chat data's template as chat_template.jinja; chat on the export (fp32
    weights) renders with it and gives the run's replies."""
    from zebractl.data.chat import CHATML_JINJA

    hf = tmp_path / "hf"
    assert cli("convert", str(chat_run), str(hf), "--dtype", "fp32").exit_code == 0
    assert (hf / "chat_template.jinja").read_text(encoding="utf-8") == CHATML_JINJA
    # both chats in this process, the lines on stdin (test_chat_through_a_pipe_feeds_only_each_
    # new_turn is the one through a real pipe)
    talk = "hello\nwhat is 2+2?\n"
    ran = cli.chat(str(chat_run), "--max-new-tokens", "6", "--json", stdin=talk)
    assert ran.exit_code == 0, ran.stderr
    run = json.loads(ran.stdout)
    res = cli.chat(str(hf), "--max-new-tokens", "6", "--json", stdin=talk)
    assert res.exit_code == 0, res.stderr
    export = json.loads(res.stdout)
    assert export["template"] == "tokenizer"
    assert [t["reply"] for t in export["turns"]] == [t["reply"] for t in run["turns"]]
