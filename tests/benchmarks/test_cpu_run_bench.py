"""benchmarks/cpu_run_bench.py: each tree's zebractl runs in a fresh process with that tree first on
the path, the trees take turns, and the summary is the median against the first tree's, with the
losses' largest relative difference. A stand-in child stands for the training (timing logic only)."""

from __future__ import annotations

import json

import pytest

CHILD = """
import json, sys
import zebractl
print("noise before the result")
print(json.dumps({"source": zebractl.__path__[0], "wall_s": zebractl.WALL.pop(0),
                  "iterations_s": 1.0, "losses": zebractl.LOSSES}))
"""


def _tree(root, walls, losses):
    pkg = root / "zebractl"
    pkg.mkdir(parents=True)
    # each fresh process pops its run's wall time from a file the previous one rewrote
    (pkg / "__init__.py").write_text(
        "import json, pathlib\n"
        "_f = pathlib.Path(__file__).with_name('walls.json')\n"
        "WALL = json.loads(_f.read_text())\n"
        f"LOSSES = {losses!r}\n"
        "_f.write_text(json.dumps(WALL[1:]))\n"
    )
    (pkg / "walls.json").write_text(json.dumps(walls))
    return root


def test_trees_take_turns_and_are_compared_with_the_first(tmp_path, script, monkeypatch, capsys):
    bench = script("cpu_run_bench")
    monkeypatch.setattr(bench, "CHILD", CHILD)
    old = _tree(tmp_path / "old", [30.0, 34.0, 28.0], [10.0, 9.0])
    new = _tree(tmp_path / "new", [24.0, 26.0, 20.0], [10.0, 9.000009])
    out = tmp_path / "bench.json"
    argv = ["--data", str(tmp_path), "--trees", str(old), str(new), "--repeat", "3"]
    assert bench.main([*argv, "--json-out", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].split()[-1] for ln in said[:6]] == [str(old), str(new)] * 3
    rec = json.loads(out.read_text())
    assert rec["meta"]["repeat"] == 3 and rec["meta"]["steps"] == 20
    first, second = rec["trees"]
    assert first["wall_s"] == [30.0, 34.0, 28.0] and first["median_s"] == 30.0
    assert first["speedup_vs_first"] == 1.0 and first["max_rel_loss_vs_first"] == 0.0
    assert second["median_s"] == 24.0 and second["speedup_vs_first"] == pytest.approx(1.25)
    assert second["max_rel_loss_vs_first"] == pytest.approx(1e-6)
    assert first["commit"] is None  # not a git checkout


def test_a_tree_whose_own_zebractl_did_not_run_is_refused(tmp_path, script, monkeypatch):
    bench = script("cpu_run_bench")
    monkeypatch.setattr(bench, "CHILD", CHILD)
    elsewhere = _tree(tmp_path / "elsewhere", [1.0], [1.0])
    empty = tmp_path / "empty"  # no zebractl of its own: the one on the path already runs
    empty.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(elsewhere))
    with pytest.raises(SystemExit, match="ran the zebractl of"):
        bench.main(["--data", str(tmp_path), "--trees", str(empty), "--repeat", "1"])


SAVING_CHILD = """
import json, sys
import zebractl
assert json.loads(sys.argv[4]) == ["checkpoint.interval=4"], sys.argv
print(json.dumps({"source": zebractl.__path__[0], "wall_s": zebractl.WALL.pop(0),
                  "iterations_s": 1.0, "losses": zebractl.LOSSES, "saves_s": [2.5, 0.3, 0.2]}))
"""


def test_the_sets_reach_the_run_and_its_first_save_is_told_apart(
    tmp_path, script, monkeypatch, capsys
):
    bench = script("cpu_run_bench")
    monkeypatch.setattr(bench, "CHILD", SAVING_CHILD)
    tree = _tree(tmp_path / "t", [3.0, 5.0], [1.0])
    out = tmp_path / "bench.json"
    argv = ["--data", str(tmp_path), "--trees", str(tree), "--repeat", "2"]
    assert bench.main([*argv, "--set", "checkpoint.interval=4", "--json-out", str(out)]) == 0
    assert "first save median 2.50 s, later saves 0.25 s" in capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["meta"]["sets"] == ["checkpoint.interval=4"]
    (row,) = rec["trees"]
    assert row["saves_s"] == [[2.5, 0.3, 0.2]] * 2
    assert (row["first_save_median_s"], row["later_saves_median_s"]) == (2.5, 0.25)
