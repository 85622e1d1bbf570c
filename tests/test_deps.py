"""zebractl.deps: the table of what each command imports is true to pyproject.toml's extras."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from zebractl import deps
from zebractl.cli import app

REPO = Path(__file__).resolve().parents[1]

EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _closure(extra: str) -> set[str]:
    """Distributions an extra installs: its requirements, nested zebractl[...] extras and, through
    the installed metadata, their own requirements (``lm-eval[hf]`` brings ``datasets``)."""
    from packaging.requirements import Requirement

    todo = []
    for line in EXTRAS[extra]:
        req = Requirement(line)
        if req.name == "zebractl":
            names = set().union(*(_closure(e) for e in req.extras))
            todo += [(n, set()) for n in names]
        else:
            todo.append((_norm(req.name), set(req.extras)))
    seen: set[str] = set()
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            env = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in env):
                todo.append((_norm(req.name), set(req.extras)))
    return seen


def _providers(module: str) -> set[str]:
    return {_norm(d) for d in metadata.packages_distributions().get(module, [])}


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(deps.EXTRA_OF))
def test_each_module_is_installed_by_the_extra_the_table_names(module):
    providers = _providers(module)
    assert providers, f"{module} is installed by no distribution in this environment"
    extra = deps.EXTRA_OF[module]
    assert providers & _closure(extra), f"{module} ({providers}) is not in zebractl[{extra}]"


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(deps.NEEDS))
def test_each_command_s_extra_installs_everything_it_imports(command):
    closure = _closure(deps.EXTRA_FOR[command])
    for module in deps.NEEDS[command]:
        top = module.split(".")[0]
        assert top in deps.EXTRA_OF, f"{command}: {module} has no extra in deps.EXTRA_OF"
        assert _providers(top) & closure, (
            f"`zebractl {command}` imports {module}, which zebractl[{deps.EXTRA_FOR[command]}] "
            "does not install"
        )


def test_the_table_covers_every_command_with_run_time_imports():
    names = {c.name for c in app.registered_commands}
    assert set(deps.NEEDS) - {"compare --fla"} <= names
    assert set(deps.NEEDS) == set(deps.OWN) == set(deps.EXTRA_FOR)


def test_the_main_job_s_extras_install_triton_and_transformers():
    """The fresh-machine bug of issue 24: convert failed on `import fla` without triton."""
    main_job = _closure("train") | _closure("demo") | _closure("eval") | _closure("report")
    assert {"triton", "transformers", "lm-eval", "matplotlib"} <= main_job


def test_require_names_the_missing_module_and_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "triton" else real(n, *a)
    )
    with pytest.raises(
        deps.ConfigError, match=r"needs triton, which is not installed.*zebractl\[train\]"
    ):
        deps.require("convert")


def test_require_names_each_missing_package_once(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n.startswith("lm_eval") else real(n, *a)
    )
    with pytest.raises(deps.ConfigError) as e:
        deps.require("eval")
    assert "needs lm_eval, which is not installed" in str(e.value)


def test_missing_hint_maps_third_party_modules_and_leaves_our_own_alone():
    assert "zebractl[train]" in deps.missing_hint(ModuleNotFoundError(name="fla.ops"))
    assert "pip install sqlitedict" in deps.missing_hint(ModuleNotFoundError(name="sqlitedict"))
    assert deps.missing_hint(ModuleNotFoundError(name="zebractl.nowhere")) is None
    assert deps.missing_hint(ModuleNotFoundError("no name")) is None


def test_probe_imports_for_real_and_reports_what_find_spec_cannot_see(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # present on disk, fails to import
    rows = {p.module: p for p in deps.probe("convert")}
    assert rows["triton"].error.startswith("ModuleNotFoundError")
    assert "zebractl[train]" in rows["triton"].install
    assert rows["zebractl.convert.hf"].error is None
