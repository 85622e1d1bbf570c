"""`train --init-from` checks its source before any weight is loaded: the model it holds against
the recipe's (every ordered pair of the tiny presets, from a run and from its Hugging Face export,
a width, a vocabulary), what a path that is no source is, and a run directory that would resume
instead. The runs train once per module (2 iterations each, the recipes' seed)."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from zebractl.config.models import summary  # noqa: E402
from zebractl.config.resolve import resolve_preset  # noqa: E402

TINY = ("tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid")
FRAMEWORK = ("CheckpointException", "dict_keys", "size mismatch for", "Traceback")
"""What no refusal shows: the framework's exceptions, a traceback."""


_SOURCES: dict[tuple[str, str], Path] = {}


@pytest.fixture
def sources(tmp_path_factory, fast, cli) -> dict[tuple[str, str], Path]:
    """(preset, "run" | "hf") -> a 2-iteration run of each tiny recipe and its export, made once
    for the module (tests copy a run before changing it)."""
    if not _SOURCES:
        root = tmp_path_factory.mktemp("sources")
        for name in TINY:
            run, hf = root / "runs" / name, root / "hf" / name
            fast.train(name, run, "schedule.iterations=2")
            r = cli("convert", str(run), str(hf))
            assert r.exit_code == 0, r.output
            _SOURCES[name, "run"], _SOURCES[name, "hf"] = run, hf
    return _SOURCES


def _train(cli, fast, recipe: str, source: Path, out: Path, *sets: str):
    return cli(
        "train", recipe, *fast.args("schedule.iterations=2", *sets), "--init-from", str(source),
        "--output", str(out),
    )  # fmt: skip


def _refused(r) -> str:
    """The one-line refusal (exit 2), with nothing of the framework in the output."""
    text = r.stdout + r.stderr
    assert r.exit_code == 2, text
    assert not any(x in text for x in FRAMEWORK), text
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    return line.removeprefix("error: ")


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("kind", ["run", "hf"])
@pytest.mark.parametrize(("held", "wanted"), list(itertools.permutations(TINY, 2)))
def test_another_model_is_named_with_its_layout_first(
    cli, fast, sources, tmp_path, held, wanted, kind
):
    source, out = sources[held, kind], tmp_path / "out"
    line = _refused(_train(cli, fast, wanted, source, out))
    a, b = resolve_preset(held).config, resolve_preset(wanted).config
    head = (
        f"{source} holds {held} ({summary(a)}), which does not fit the model {wanted} "
        f"({summary(b)}) of the recipe: "
    )
    assert line.startswith(head), line
    assert line[len(head) :].startswith("block"), line  # the layout before any other field
    assert not (out / "config.resolved.json").exists()  # refused before anything is written


@pytest.mark.parametrize("kind", ["run", "hf"])
def test_a_width_and_a_vocabulary_are_named_with_both_values(cli, fast, sources, tmp_path, kind):
    source = sources["tiny_kda", kind]
    line = _refused(_train(cli, fast, "tiny_kda", source, tmp_path / "w", "model.hidden_size=96"))
    assert "the model tiny_kda with changes (2 blocks: kda, kda; hidden 96)" in line, line
    assert ": hidden_size 64 ≠ 96 (the source's value first)" in line, line
    line = _refused(_train(cli, fast, "tiny_kda", source, tmp_path / "v", "model.vocab_size=60000"))
    assert "embedding rows 50304 ≠ 60032" in line, line
    assert "set model.vocab_size to at most 50304" in line, line


def test_a_vocabulary_in_the_same_rows_and_other_positions_load_with_a_note(
    cli, fast, sources, tmp_path
):
    out = tmp_path / "ft"
    r = _train(cli, fast, "tiny_hybrid", sources["tiny_hybrid", "hf"], out,
               "model.vocab_size=50300", "model.max_position_embeddings=4096")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "tokens 50257-50299 start from rows the source never trained" in r.stdout
    assert "max_position_embeddings 2048, this model has 4096: no weight depends" in r.stdout
    assert json.loads((out / "init.json").read_text())["kind"] == "hf"


@pytest.mark.parametrize("kind", ["run", "hf"])
def test_the_same_model_trains_and_the_fine_tune_resumes(cli, fast, sources, tmp_path, kind):
    source, out = sources["tiny_kda", kind], tmp_path / "ft"
    r = _train(cli, fast, "tiny_kda", source, out)
    assert r.exit_code == 0, r.output
    assert "initialised weights from" in r.stdout
    # the same command with more iterations resumes the fine-tune (its init.json names the source)
    again = _train(cli, fast, "tiny_kda", source, out, "schedule.iterations=3")
    assert again.exit_code == 0, again.output
    assert "resumed from" in again.stdout and len(fast.losses(out)) == 3


def test_init_from_into_a_run_that_holds_checkpoints_leaves_it_untouched(
    cli, fast, sources, tmp_path
):
    import shutil

    run = tmp_path / "tiny_kda"
    shutil.copytree(sources["tiny_kda", "run"], run)
    before = _hashes(run)
    line = _refused(_train(cli, fast, "tiny_kda", sources["tiny_kda", "hf"], run))
    assert line.startswith(f"{run} already holds checkpoints (iteration 2) of a run that "
                           "started from a fresh initialisation"), line  # fmt: skip
    assert "Resume it without --init-from, or choose another --output" in line, line
    line = _refused(_train(cli, fast, "tiny_kda", run, run))
    assert "is the run directory this trains into" in line, line
    assert _hashes(run) == before


def test_a_path_that_is_no_source_says_what_it_is(cli, fast, sources, tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"\0" * 16)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hi")
    (tmp_path / "half_hf").mkdir()
    (tmp_path / "half_hf" / "config.json").write_text("{}")
    unsaved = tmp_path / "iter_0000002"
    unsaved.mkdir()
    (unsaved / "common.pt").write_bytes(b"x")
    cases = {
        "weights.pt": "is a file;",
        "empty": "is an empty folder;",
        "notes": "is a folder of something else (1 entry: a.txt);",
        "half_hf": "holds a config.json but no model.safetensors",
        "iter_0000002": "is a checkpoint folder without its zebractl.json",
    }
    for name, what in cases.items():
        line = _refused(_train(cli, fast, "tiny_kda", tmp_path / name, tmp_path / "out"))
        assert line.startswith(f"--init-from {tmp_path / name} {what}"), line
        assert "expected a run directory, its checkpoints folder" in line, line


def test_train_check_reports_the_refusal(cli, fast, sources, tmp_path):
    r = cli("train", "tiny_gdn", "--check", *fast.args(), "--init-from",
            str(sources["tiny_kda", "run"]), "--output", str(tmp_path / "out"))  # fmt: skip
    assert r.exit_code == 3, r.output
    (row,) = [x for x in r.stdout.splitlines() if x.startswith("init ")]
    assert "failed" in row and "blocks 1-2 mixer kda ≠ gdn" in row, row
