"""FLA's kernels imported without FLA's package-wide imports (``kernels.lean_fla_import``).

``import fla.ops.kda`` first runs ``fla/__init__.py``, which imports every FLA layer and model and
with them transformers, then ``fla/ops/__init__.py``, which imports every one of FLA's ~40
operators; ``fla.modules`` likewise imports all of its modules. A training run needs a handful:
KDA's or GDN's chunk kernels, the norms, the short convolution, the SwiGLU and the cross-entropy.
On a 2-core CPU, importing those took 2.2-2.6 s with the three package files skipped against
4.7-5.0 s through them (91 of FLA's modules imported instead of 476, transformers not at all).

:func:`lean` puts a stand-in in ``sys.modules`` for each of ``fla``, ``fla.ops`` and
``fla.modules``: the real package (its spec, path and file), its ``__init__`` not yet run. Importing
a submodule then loads that submodule's own file and what it imports, nothing more. The package is
made whole (its ``__init__`` run in the stand-in, :func:`complete`) the first time anything asks it
for a name it does not have (``from fla.modules import ShortConvolution``, ``fla.KDAForCausalLM``)
or imports one of its aliases (``fla.modules.l2norm``, a name ``fla/modules/__init__.py`` makes):
code written against the whole package keeps working, paying the whole import when it first needs
it. A bare ``import fla`` does not make it whole: code that imports FLA for its side effect
(registering FLA's model classes with transformers) calls :func:`whole` instead (zebractl's does).

Only the training path installs it (a run on FLA's kernels, its compile processes and its TileLang
build): before FLA is first imported, else :func:`lean` does nothing (the package is already
whole). The kernels, their source and the Triton cache keys are FLA's as they are.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

PACKAGES = ("fla", "fla.ops", "fla.modules")
"""The package files skipped (a parent before its children)."""

_lock = threading.RLock()
_STANDING_IN: dict[str, types.ModuleType] = {}
"""The stand-ins whose ``__init__`` has not run yet, by name."""


def lean() -> bool:
    """Install the stand-ins (see the module docstring); False, installing nothing, where FLA is
    already imported, not installed, or not laid out as FLA 0.6.0 is."""
    with _lock:
        if any(name in sys.modules for name in PACKAGES):
            return False
        specs = _specs()
        if specs is None:
            return False
        version = _version(specs["fla"])
        if version is None:
            return False
        for name, spec in specs.items():
            module = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
            module.__getattr__ = _missing(name)  # type: ignore[attr-defined]
            if name == "fla":
                module.__version__ = version  # type: ignore[attr-defined]  # fla.utils reads it
            _STANDING_IN[name] = module
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
        if _FINDER not in sys.meta_path:
            sys.meta_path.append(_FINDER)
        return True


def is_lean(name: str = "fla") -> bool:
    """Whether ``name`` (one of :data:`PACKAGES`) is a stand-in whose ``__init__`` has not run."""
    return name in _STANDING_IN


def complete(name: str = "fla") -> None:
    """Run the package ``__init__`` of ``name`` (one of :data:`PACKAGES`) in its stand-in, once;
    nothing for a package that is whole or being made whole by another thread (which then reads as
    any package does while its ``__init__`` runs). ``complete("fla")`` makes all three whole."""
    with _lock:
        module = _STANDING_IN.pop(name, None)
    if module is not None:
        try:
            module.__spec__.loader.exec_module(module)
        except BaseException:
            with _lock:  # as it was: the next import reports the same failure
                _STANDING_IN[name] = module
            raise
    if name == "fla":
        for pkg in PACKAGES[1:]:
            complete(pkg)


def whole() -> Any:
    """``import fla``, whole: its model classes registered with transformers' auto classes (what
    a bare ``import fla`` does without :func:`lean`). Returns the package."""
    import fla

    complete("fla")
    return fla


def _specs() -> dict[str, importlib.machinery.ModuleSpec] | None:
    """The three packages' specs, found without importing any of them (None where one is not a
    package laid out as FLA's: the file of ``fla.ops`` is ``fla/ops/__init__.py``)."""
    specs: dict[str, importlib.machinery.ModuleSpec] = {}
    for name in PACKAGES:
        parent = name.rpartition(".")[0]
        path = list(specs[parent].submodule_search_locations or []) if parent else None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            return None
        if Path(spec.origin or "").parent.name != name.rpartition(".")[2]:
            return None
        specs[name] = spec
    return specs


def _version(spec: importlib.machinery.ModuleSpec) -> str | None:
    """``fla.__version__`` as ``fla/__init__.py`` assigns it (read from the file, not run)."""
    try:
        text = Path(spec.origin or "").read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else None


def _missing(name: str) -> Any:
    """The stand-in's module ``__getattr__``: a name it lacks makes the package whole, then is
    looked up again (dunder names are not: the import system and tools probe for those)."""

    def __getattr__(attr: str) -> Any:  # noqa: N807 - a module's __getattr__ (PEP 562)
        if not attr.startswith("__"):
            complete(name)
            found = sys.modules[name].__dict__.get(attr, _ABSENT)
            if found is not _ABSENT:
                return found
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    return __getattr__


_ABSENT = object()


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a submodule of a stand-in that no file provides may be one of the
    aliases its ``__init__`` makes, or live in a directory its ``__init__`` adds to its path
    (``pkgutil.extend_path``: FLA's package spans the installs that provide ``fla``): make the
    package whole, then hand over what it registered or what its path now holds."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parent = fullname.rpartition(".")[0]
        if parent not in _STANDING_IN:
            return None
        complete(parent)
        made = sys.modules.get(fullname)
        if made is None:  # a file the whole package's path has (its __init__ may extend it)
            return importlib.machinery.PathFinder.find_spec(fullname, sys.modules[parent].__path__)
        # the import system loads the spec of a module a finder left in sys.modules (for an alias:
        # its target's, which would run that file a second time): the alias carries ours until
        # loaded, which gives the same module back and its own spec with it (after a mere probe,
        # importlib.util.find_spec, ours stays: the module then names the alias as its spec)
        spec = importlib.machinery.ModuleSpec(fullname, _Made(made))
        made.__spec__ = spec
        return spec


class _Made(importlib.abc.Loader):
    """Loads a module that already exists (an alias a package ``__init__`` registered) and gives
    it its own ``__spec__`` back."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.spec = getattr(module, "__spec__", None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec


_FINDER = _AliasFinder()
