"""Readers of a run name the checkpoint they use and every damaged one they skip (issue 42,
item 2): convert and verify on a run whose newest checkpoint was damaged after it completed (each
kind of damage), one line each, then the iteration they used."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def _truncate(folder):
    shard = max((p for p in folder.rglob("*") if p.is_file() and p.name != "zebractl.json"),
                key=lambda p: p.stat().st_size)  # fmt: skip
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _no_marker(folder):
    (folder / "zebractl.json").unlink()


def _emptied(folder):
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _marker_lies(folder):
    m = json.loads((folder / "zebractl.json").read_text())
    m["files"][0]["sha256"] = "0" * 64
    (folder / "zebractl.json").write_text(json.dumps(m))


DAMAGE = {"truncated": _truncate, "marker removed": _no_marker, "emptied": _emptied,
          "checksum differs": _marker_lies}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_convert_names_the_checkpoint_used_and_each_damaged_one(cli, trained, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    newest = run / "checkpoints" / "iter_0000004"
    DAMAGE[damage](newest)
    r = cli("convert", str(run), str(tmp_path / "hf"), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration"] == 2
    lines = r.stderr.splitlines()
    used = next(i for i, x in enumerate(lines) if "iter_0000002 (iteration 2)" in x)
    if damage != "marker removed":  # without its marker a folder was never a checkpoint
        skipped = next(i for i, x in enumerate(lines) if "skipped damaged checkpoint" in x)
        assert str(newest) in lines[skipped] and skipped < used, r.stderr
    r = cli("verify", str(run), str(tmp_path / "hf"), "--json", "--tokens", "16")
    assert r.exit_code == 0, r.output
    assert "iter_0000002 (iteration 2)" in r.stderr


@pytest.mark.slow
def test_checkpoint_chooses_by_iteration_or_folder_and_refuses_the_wrong_ones(
    cli, trained, tmp_path
):
    """``--checkpoint ITER|PATH`` (``--iteration`` still works): the chosen one is used, named;
    a missing iteration, a folder of another run, a damaged chosen checkpoint and a folder that is
    no checkpoint are exit 2 naming it, never a silent fall back to another."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    first = run / "checkpoints" / "iter_0000002"
    for choice in ("2", str(first)):
        out = tmp_path / f"hf{len(choice)}"
        r = cli("convert", str(run), str(out), "--checkpoint", choice, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["iteration"] == 2 and "iter_0000002 (iteration 2)" in r.stderr
    r = cli("verify", str(run), str(tmp_path / "hf1"), "--checkpoint", "2", "--tokens", "16")
    assert r.exit_code == 0, r.output
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    _truncate(run / "checkpoints" / "iter_0000004")
    bad = {
        "7": "no checkpoint of iteration 7",
        str(other / "checkpoints" / "iter_0000002"): "not a checkpoint of",
        "4": "iter_0000004",
        str(run): "not a complete checkpoint folder",
    }
    for choice, said in bad.items():
        r = cli("convert", str(run), str(tmp_path / "x"), "--checkpoint", choice)
        assert r.exit_code == 2, (choice, r.output)
        assert said in r.stderr and "Traceback" not in r.output, (choice, r.stderr)
