"""`zebractl.runtime.fla_import` (``kernels.lean_fla_import``): FLA's kernel modules imported
without the package files of ``fla``, ``fla.ops`` and ``fla.modules``; a package made whole the
first time code asks it for a name it lacks or imports one of its aliases.

Each case runs in a fresh interpreter (the stand-ins live in ``sys.modules``): first against small
fake packages laid out as FLA's (fast, and they say which package file ran), then once against the
installed FLA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE = {
    "fla/__init__.py": "__version__ = '9.9'\nRAN.append('fla')\nimport fla.layers\n",
    "fla/layers.py": "from fla.modules import Conv\nLAYER = Conv\n",
    "fla/ops/__init__.py": "RAN.append('fla.ops')\nfrom fla.ops.kda import chunk\n",
    "fla/ops/kda.py": "from fla import __version__\nfrom fla.modules.norm import norm\nchunk = 'kda'\n",
    "fla/modules/__init__.py": textwrap.dedent(
        """\
        import sys
        RAN.append('fla.modules')
        from fla.modules.norm import norm
        Conv = 'conv'
        sys.modules['fla.modules.l2norm'] = sys.modules['fla.modules.norm']  # an alias
        """
    ),
    "fla/modules/norm.py": "import builtins\nbuiltins.NORMS = getattr(builtins, 'NORMS', 0) + 1\nnorm = 'norm'\n",
}


def _run(code: str, path: Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (``RAN``: the package files that ran, a builtin); its
    last stdout line is JSON."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    prelude = (
        "import builtins, json, sys\nbuiltins.RAN = []\nfrom zebractl.runtime import fla_import\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake(tmp_path):
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_submodule_loads_without_the_package_files(fake):
    got = _run(
        """
        leaned = fla_import.lean()
        import fla.ops.kda
        print(json.dumps({"leaned": leaned, "ran": RAN, "chunk": fla.ops.kda.chunk,
                          "version": sys.modules["fla"].__version__,
                          "lean": [fla_import.is_lean(p) for p in fla_import.PACKAGES],
                          "file": sys.modules["fla.ops"].__file__}))
        """,
        fake,
    )
    assert got["leaned"] is True and got["ran"] == [] and got["chunk"] == "kda"
    assert got["version"] == "9.9"  # read from fla/__init__.py, which did not run
    assert got["lean"] == [True, True, True]
    assert got["file"] == str(fake / "fla" / "ops" / "__init__.py")  # the real package


def test_a_name_the_package_lacks_makes_it_whole_once(fake):
    got = _run(
        """
        fla_import.lean()
        import fla.ops.kda
        from fla.modules import Conv  # a name fla/modules/__init__.py makes
        first = list(RAN)
        import fla.modules
        again = fla.modules.Conv
        try:
            fla.modules.nothing
        except AttributeError as exc:
            missing = str(exc)
        print(json.dumps({"first": first, "ran": RAN, "conv": Conv, "again": again,
                          "missing": missing, "modules_lean": fla_import.is_lean("fla.modules"),
                          "ops_lean": fla_import.is_lean("fla.ops")}))
        """,
        fake,
    )
    assert got["first"] == ["fla.modules"] and got["ran"] == ["fla.modules"]  # once, that one only
    assert got["conv"] == got["again"] == "conv"
    assert "no attribute 'nothing'" in got["missing"]
    assert got["modules_lean"] is False and got["ops_lean"] is True


def test_an_alias_import_makes_its_package_whole_and_keeps_the_modules_own_spec(fake):
    got = _run(
        """
        fla_import.lean()
        from fla.modules.l2norm import norm
        m = sys.modules["fla.modules.l2norm"]
        import fla.modules.l2norm as again
        print(json.dumps({"ran": RAN, "norm": norm, "same": m is sys.modules["fla.modules.norm"],
                          "again": again is m, "spec": m.__spec__.name, "runs": NORMS}))
        """,
        fake,
    )
    assert got == {"ran": ["fla.modules"], "norm": "norm", "same": True, "again": True,
                   "spec": "fla.modules.norm", "runs": 1}  # fmt: skip


def test_a_submodule_in_a_directory_the_package_file_adds_is_found(fake, tmp_path_factory):
    """FLA's ``__init__`` extends its path over every install that provides ``fla``
    (``pkgutil.extend_path``): a submodule only the second install has makes FLA whole (all three
    package files, as :func:`whole`), then loads."""
    (fake / "fla/__init__.py").write_text(
        "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"
        "__version__ = '9.9'\nRAN.append('fla')\n"
    )
    other = tmp_path_factory.mktemp("other")
    (other / "fla").mkdir()
    (other / "fla/extra.py").write_text("EXTRA = 'extra'\n")
    got = _run(
        f"""
        sys.path.append({str(other)!r})
        fla_import.lean()
        from fla.extra import EXTRA
        print(json.dumps({{"ran": RAN, "extra": EXTRA, "lean": fla_import.is_lean("fla")}}))
        """,
        fake,
    )
    assert got == {"ran": ["fla", "fla.ops", "fla.modules"], "extra": "extra", "lean": False}


def test_an_alias_probed_before_its_import_still_imports(fake):
    """``importlib.util.find_spec`` of an alias (a probe, nothing imported) makes the package whole
    and leaves the alias where the import finds it: the same module, its file run once (its
    ``__spec__`` then names the alias, as the probe found it)."""
    got = _run(
        """
        import importlib.util
        fla_import.lean()
        probed = importlib.util.find_spec("fla.modules.l2norm") is not None
        import fla.modules.l2norm as m
        print(json.dumps({"probed": probed, "same": m is sys.modules["fla.modules.norm"],
                          "spec": m.__spec__.name, "runs": NORMS, "ran": RAN}))
        """,
        fake,
    )
    assert got == {"probed": True, "same": True, "spec": "fla.modules.l2norm", "runs": 1,
                   "ran": ["fla.modules"]}  # fmt: skip


def test_whole_runs_every_package_file_once(fake):
    got = _run(
        """
        fla_import.lean()
        import fla.ops.kda
        fla = fla_import.whole()
        fla_import.whole()
        print(json.dumps({"ran": RAN, "layer": fla.layers.LAYER,
                          "lean": [fla_import.is_lean(p) for p in fla_import.PACKAGES]}))
        """,
        fake,
    )
    assert sorted(got["ran"]) == ["fla", "fla.modules", "fla.ops"] and len(got["ran"]) == 3
    assert got["layer"] == "conv" and got["lean"] == [False, False, False]


def test_a_package_file_that_fails_fails_again_on_the_next_ask(fake):
    (fake / "fla/ops/__init__.py").write_text(
        "RAN.append('fla.ops')\nraise RuntimeError('broken')\n"
    )
    got = _run(
        """
        fla_import.lean()
        import fla.ops.kda  # its own file: fine
        errors = []
        for _ in range(2):
            try:
                from fla.ops import chunk_gla
            except RuntimeError as exc:
                errors.append(str(exc))
        print(json.dumps({"ran": RAN, "errors": errors, "lean": fla_import.is_lean("fla.ops")}))
        """,
        fake,
    )
    assert got == {"ran": ["fla.ops", "fla.ops"], "errors": ["broken", "broken"], "lean": True}


@pytest.mark.parametrize("broken", ["no version", "a module, not a package", "imported"])
def test_nothing_is_installed_where_fla_is_not_as_expected(fake, broken):
    if broken == "no version":
        (fake / "fla/__init__.py").write_text("RAN.append('fla')\n")
    elif broken == "a module, not a package":
        for name in FAKE:
            (fake / name).unlink()
        for d in ("fla/ops", "fla/modules", "fla"):
            (fake / d).rmdir()
        (fake / "fla.py").write_text("__version__ = '1'\n")
    code = "import fla\n" if broken == "imported" else ""
    got = _run(
        code
        + textwrap.dedent(
            """
        leaned = fla_import.lean()
        print(json.dumps({"leaned": leaned, "lean": fla_import.is_lean("fla"),
                          "finder": fla_import._FINDER in sys.meta_path}))
        """
        ),
        fake,
    )
    assert got == {"leaned": False, "lean": False, "finder": False}


def test_no_fla_installed(tmp_path):
    got = _run(
        """
        import importlib.machinery
        real = importlib.machinery.PathFinder.find_spec
        importlib.machinery.PathFinder.find_spec = classmethod(
            lambda cls, name, path=None, target=None: None if name == "fla" else real(name, path, target))
        print(json.dumps({"leaned": fla_import.lean(), "modules": "fla" in sys.modules}))
        """
    )
    assert got == {"leaned": False, "modules": False}


def test_the_installed_fla_kernels_without_its_package_files():
    """The modules a run on FLA's kernels imports (zebractl.model.ops and the rest), then what a
    conversion needs: FLA's classes registered with transformers by :func:`whole`."""
    pytest.importorskip("fla")
    got = _run(
        """
        import time, torch
        t = time.perf_counter()
        leaned = fla_import.lean()
        import fla.ops.kda, fla.ops.gated_delta_rule, fla.ops.simple_gla, fla.ops.utils
        import fla.modules.norm.l2norm, fla.modules.activations.ops, fla.modules.causal_conv1d.ops
        import fla.modules.norm.fused_norm_gate, fla.modules.norm.layernorm
        import fla.modules.fused_cross_entropy.ops, fla.backends
        took = time.perf_counter() - t
        lean = {"n": len([m for m in sys.modules if m.startswith("fla")]),
                "transformers": "transformers" in sys.modules, "models": "fla.models" in sys.modules,
                "still": [fla_import.is_lean(p) for p in fla_import.PACKAGES]}
        fla_import.whole()
        from transformers import AutoConfig, AutoModelForCausalLM
        import fla
        print(json.dumps({"leaned": leaned, "took": took, "lean": lean,
                          "n": len([m for m in sys.modules if m.startswith("fla")]),
                          "kda": type(AutoConfig.for_model("kda")).__name__,
                          "cls": fla.KDAForCausalLM.__name__}))
        """
    )
    print(f"lean import {got['took']:.2f} s, {got['lean']['n']} FLA modules (whole: {got['n']})")
    assert got["leaned"] is True
    assert got["lean"] == {"n": got["lean"]["n"], "transformers": False, "models": False,
                           "still": [True, True, True]}  # fmt: skip
    assert got["lean"]["n"] < got["n"] / 2
    assert got["kda"] == "KDAConfig" and got["cls"] == "KDAForCausalLM"
