"""Issue 30, point 6: small frictions of the command line (run directories in `config show`, help
examples, word metavars, one spelling of the output flag, --nproc validation, `zebractl env`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from zebractl.config.resolve import resolve_recipe
from zebractl.run.records import ResolvedConfigRecord
from zebractl.run.rundir import RunDir


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory as `zebractl train` leaves it (only its resolved config matters here)."""
    monkeypatch.chdir(tmp_path)
    run = RunDir(Path("runs/t"))
    run.create()
    run.write_config(ResolvedConfigRecord.of(resolve_recipe("tiny_kda", ["schedule.lr=1e-3"])))
    return run.root


@pytest.mark.parametrize("ref", ["runs/t", "runs/t/", "runs/t/config.resolved.json"])
def test_config_show_reads_a_run_directory(cli, run_dir, ref):
    result = cli("config", "show", ref, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "recipe" and doc["name"] == "tiny_kda"
    assert doc["source"] == "runs/t/config.resolved.json"
    assert doc["config"]["schedule"]["lr"] == 1e-3
    assert doc["provenance"]["schedule.lr"] == "--set"  # as recorded by the run
    assert doc["provenance"]["model.hidden_size"].endswith("tiny_kda.yaml:6")


def test_config_show_run_directory_takes_set_and_tables(cli, run_dir):
    result = cli("config", "show", "runs/t", "--set", "schedule.lr=2e-3", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["config"]["schedule"]["lr"] == 2e-3
    table = cli("config", "show", "runs/t")
    assert table.exit_code == 0 and "runs/t/config.resolved.json" in table.stdout


def test_config_diff_takes_run_directories(cli, run_dir):
    result = cli("config", "diff", "tiny_kda", "runs/t", "--json")
    assert result.exit_code == 0, result.stderr
    keys = [row["key"] for row in json.loads(result.stdout)["differences"]]
    assert keys == ["schedule.lr"]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("runs", "not a zebractl run directory (no config.resolved.json)"),
        ("nope/x", "no such file or run directory"),
        ("other.json", "not a recipe or preset (.yaml) nor a run's config.resolved.json"),
    ],
)
def test_config_show_refuses_what_is_neither_config_nor_run(cli, run_dir, ref, message):
    Path("other.json").write_text("{}", encoding="utf-8")
    result = cli("config", "show", ref)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def _commands() -> list[tuple[str, ...]]:
    """Every leaf command of the app, as argv prefixes (``("config", "show")``, ``("plan",)``)."""
    import typer

    from zebractl.cli import app

    out: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):  # a group (Typer vendors its own click)
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            out.append(path)

    walk(typer.main.get_command(app), ())
    return out


def _params(argv: tuple[str, ...]):
    import typer

    from zebractl.cli import app

    cmd = typer.main.get_command(app)
    for name in argv:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd.params


COMMANDS = _commands()


def test_every_command_is_walked():
    assert {("plan",), ("train",), ("config", "show"), ("schema", "export")} <= set(COMMANDS)
    assert len(COMMANDS) >= 15


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_metavars_are_words(cli, argv):
    result = cli(*argv, "--help")
    assert result.exit_code == 0
    usage = result.stdout.splitlines()[0]
    assert usage.startswith("Usage: zebractl") and "{" not in usage, usage
    for python_type in ("<str>", "<int>", "<float>", "<path>", "<list[", "<bool>"):
        assert python_type not in result.stdout, (argv, python_type)


def test_metavar_words_in_usage_and_errors(cli):
    assert cli("plan", "--help").stdout.splitlines()[0] == "Usage: zebractl plan [OPTIONS] RECIPE"
    text = cli("train", "--help").stdout
    assert "  RECIPE  " in text and "--nproc N " in text and "-o, --output RUN " in text
    assert "--init-from PATH " in text
    compare = cli("compare", "--help").stdout.splitlines()[0]
    assert compare == "Usage: zebractl compare [OPTIONS] RUN_A [RUN_B]"
    missing = cli("plan")
    assert missing.exit_code == 2 and "Missing argument 'RECIPE'" in missing.stderr


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_output_flag_is_one_spelling(argv):
    for param in _params(argv):
        opts = [*param.opts, *param.secondary_opts]
        if param.param_type_name != "option" or param.hidden:
            continue
        if any(o.startswith("--out") for o in opts):
            assert opts == ["-o", "--output"], (argv, opts)


def test_output_flag_exists_where_a_command_writes_a_folder():
    for argv in (("train",), ("prepare",), ("eval",), ("compare",), ("schema", "export")):
        assert any(p.opts == ["-o", "--output"] for p in _params(argv)), argv


def test_schema_export_keeps_out_as_hidden_alias(cli, tmp_path):
    out = tmp_path / "schemas"
    assert cli("schema", "export", "--out", str(out)).exit_code == 0
    assert (out / "recipe.schema.json").is_file()
    assert cli("schema", "export", "-o", str(out), "--check").exit_code == 0
    assert "--out " not in cli("schema", "export", "--help").stdout


@pytest.mark.parametrize("check", [["--check"], ["--check", "--json"], []])
@pytest.mark.parametrize("nproc", ["-3", "0"])
def test_train_and_check_refuse_a_bad_nproc_alike(cli, tmp_path, monkeypatch, check, nproc):
    monkeypatch.chdir(tmp_path)
    result = cli("train", "tiny_kda", *check, "--nproc", nproc)
    assert result.exit_code == 2, result.output
    assert f"--nproc {nproc}: must be at least 1" in result.stderr
    assert not Path("runs").exists()  # refused before anything was written


def test_train_check_resolves_as_train_would(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    two = cli("train", "tiny_kda", "--check", "--json", "--nproc", "2")
    gpus = {c["name"]: c for c in json.loads(two.stdout)["checks"]}["gpus"]
    assert "2 GPU(s)" in gpus["detail"] or "2 planned" in gpus["detail"]
    bad = cli("train", "tiny_hybrid", "--check", "--reference", "fla")  # train refuses it too
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_help_has_examples_of_itself(cli, argv):
    text = cli(*argv, "--help").stdout
    assert "Examples:" in text, argv
    after = text.split("Examples:", 1)[1]
    prefix = "zebractl " + " ".join(argv)
    examples = [ln.strip() for ln in after.splitlines() if ln.strip().startswith("zebractl ")]
    assert examples and all(ex.startswith(prefix) for ex in examples), (argv, examples)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_examples_use_only_options_the_command_has(argv):
    import shlex

    from zebractl.cli._examples import EXAMPLES

    known = {o for p in _params(argv) for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    for example in EXAMPLES[" ".join(argv)]:
        words = shlex.split(example)
        assert words[: 1 + len(argv)] == ["zebractl", *argv], example
        flags = {w.split("=")[0] for w in words if w.startswith("-")}
        assert flags <= known, (example, flags - known)


def test_env_json_has_versions_gpus_caches_paths(cli, tmp_path, monkeypatch):
    from zebractl.schemas.reports import EnvReport

    monkeypatch.setenv("ZEBRACTL_CACHE_DIR", str(tmp_path / "zc"))
    (tmp_path / "zc" / "kernels" / "nvidia-h200_torch-x_triton-y_fla-z").mkdir(parents=True)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("ZEBRACTL_API_KEY", "also_secret")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    bin_dir = tmp_path / "bin"  # a stand-in nvidia-smi: the report parses its CSV
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 580.65'\n", encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    result = cli("env", "--json")
    assert result.exit_code == 0, result.stderr
    assert "hf_secret_value" not in result.stdout and "also_secret" not in result.stdout
    rep = EnvReport.model_validate_json(result.stdout)
    for dist in ("zebractl", "torch", "triton", "flash-linear-attention", "megatron-core",
                 "transformers", "pydantic"):  # fmt: skip
        assert dist in rep.versions
    assert rep.python and rep.python_executable and rep.platform
    assert rep.gpu_source == "nvidia-smi"
    assert [(g.name, g.memory_gib, g.driver) for g in rep.gpus] == [
        ("NVIDIA H200", 140.4, "580.65")
    ]
    paths = {p.name: p for p in rep.paths}
    assert paths["kernel cache"].path == str(tmp_path / "zc" / "kernels")
    assert paths["kernel cache"].note.startswith("$ZEBRACTL_CACHE_DIR")
    assert rep.kernel_stacks == ["nvidia-h200_torch-x_triton-y_fla-z"]
    assert {"Hugging Face cache", "shipped recipes", "working directory"} <= set(paths)
    assert rep.environment["NCCL_DEBUG"] == "INFO" and "HF_TOKEN" not in rep.environment
    schema = json.loads(
        (Path(__file__).parents[2] / "schemas/reports" / EnvReport.schema_file()).read_text()
    )
    import jsonschema

    jsonschema.validate(json.loads(result.stdout), schema)


def test_env_default_is_paste_ready_markdown(cli):
    result = cli("env")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert text.startswith("### zebractl env\n")
    assert "| package | version |" in text and "| torch |" in text and "| pydantic |" in text
    assert "| kernel cache |" in text and "Python " in text
    assert not text.lstrip().startswith("{")


_PLAN_PROBE = """
import contextlib, io, json, sys
from zebractl.cli import app
from zebractl.config import catalog

for recipe in catalog.shipped("recipe"):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            app(["plan", recipe, "--json"], prog_name="zebractl")
        except SystemExit as e:
            assert e.code == 0, (recipe, e.code)
    assert json.loads(out.getvalue())["parameters"]["built"] is None, recipe
heavy = ("torch", "megatron", "fla", "transformers", "triton", "lm_eval")
print("LOADED:" + ",".join(m for m in heavy if m in sys.modules))
"""


def test_plan_builds_no_model_and_imports_nothing_heavy():
    """`zebractl plan` computes from the config (zebractl.layout): no torch or megatron import, so
    it takes about a second (it took 5-18 s building the model on the meta device; the time itself
    is not asserted, the imports are)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PLAN_PROBE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "LOADED:"


def test_plan_build_cross_checks_on_request(cli):
    pytest.importorskip("megatron.core")
    doc = json.loads(cli("plan", "tiny_hybrid", "--json", "--build").stdout)
    assert doc["parameters"]["built"] == doc["parameters"]["total"]


def test_readme_says_no_transformer_engine_and_fp8_through_torchao():
    """The README's paragraph, and the code facts it states."""
    root = Path(__file__).parents[2]
    readme = " ".join((root / "README.md").read_text(encoding="utf-8").split())
    assert "### Transformer Engine and FP8" in readme
    assert "zebractl does not use NVIDIA Transformer Engine" in readme
    assert "`--set kernels.fp8_mlp=tensorwise`" in readme and "torchao" in readme
    megatron_config = (root / "zebractl/model/megatron_config.py").read_text(encoding="utf-8")
    assert '"transformer_impl": "local"' in megatron_config
    assert "scaled_dot_product_attention" in (root / "zebractl/model/attention.py").read_text()
    fp8 = (root / "zebractl/model/ops/fp8.py").read_text(encoding="utf-8")
    assert "torchao" in fp8 and "transformer_engine" not in fp8


def test_plan_time_to_train_from_measured_throughput(cli):
    doc = json.loads(cli("plan", "zebra_kda_1B_hybrid_1gpu", "--json").stdout)
    tt, tokens = doc["time_to_train"], doc["tokens"]["total"]
    # the measured run's own shape (1 H200, seq 8192): the estimate gives back its 65,379 tokens/s
    assert tt["tokens_per_s"] == pytest.approx(65_379, rel=0.01)
    assert tt["hours"] == pytest.approx(tokens / tt["tokens_per_s"] / 3600, rel=0.01)
    assert tt["gpu"] == "NVIDIA H200" and tt["mfu"] == 0.5003
    # the source names the record it was measured in, a file of this repository
    record = tt["source"].split()[0]
    assert record == "benchmarks/results/gpu-check/2026-12-06-426c5e6.json", tt["source"]
    assert (Path(__file__).resolve().parents[2] / record).is_file()
    assert "65,379 tokens/s" in tt["measured"]
    eight = json.loads(cli("plan", "zebra_kda_1B_hybrid", "--json").stdout)["time_to_train"]
    assert eight["tokens_per_s"] == pytest.approx(8 * tt["tokens_per_s"], rel=0.01)
    text = cli("plan", "kda_300M").stdout
    assert "time to train (estimate):" in " ".join(text.split())


def test_plan_time_to_train_says_when_nothing_was_measured(cli):
    tt = json.loads(cli("plan", "tiny_kda", "--json").stdout)["time_to_train"]
    assert tt["hours"] is None and tt["source"] is None
    assert "no throughput measured for preset tiny_kda" in tt["note"]


def test_measured_throughputs_name_shipped_presets_and_existing_sources():
    from zebractl.config import catalog
    from zebractl.planning.throughput import MEASURED

    root = Path(__file__).parents[2]
    for preset, m in MEASURED.items():
        assert preset in catalog.shipped("preset"), preset
        assert (root / m.source.split()[0].rstrip(",")).exists(), m.source
        assert 0 < m.mfu < 1 and m.tokens_per_s > 0
