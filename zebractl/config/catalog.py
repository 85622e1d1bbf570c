"""Where shipped presets and recipes live, and how a name or path becomes a file.

Shipped YAMLs sit at the repository top level (``presets/``, ``recipes/``) and are copied into the wheel
as ``zebractl/_data/{presets,recipes}`` (hatch ``force-include``), so names resolve after a plain
``pip install`` as well as in a checkout.
"""

from __future__ import annotations

import difflib
import os
from importlib.resources import files
from pathlib import Path
from typing import Literal

from zebractl.errors import ConfigError

Kind = Literal["preset", "recipe"]
_DIRS: dict[Kind, str] = {"preset": "presets", "recipe": "recipes"}


def data_root() -> Path:
    """Folder holding ``presets/``, ``recipes/`` and ``schemas/``: the wheel's _data or the checkout."""
    bundled = Path(str(files("zebractl"))) / "_data"
    if (bundled / "presets").is_dir():
        return bundled
    return Path(__file__).resolve().parents[2]


def shipped(kind: Kind) -> dict[str, Path]:
    """Shipped files of one kind, by name (file stem), sorted."""
    folder = data_root() / _DIRS[kind]
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def display_path(path: Path) -> str:
    """How a file is named in messages and provenance: shipped files as ``presets/x.yaml``, user
    files relative to the working directory when inside it."""
    path = path.resolve()
    root = data_root().resolve()
    for sub in _DIRS.values():
        try:
            return str(Path(sub) / path.relative_to(root / sub))
        except ValueError:
            pass
    try:
        return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    except ValueError:  # pragma: no cover - different drives on Windows
        return str(path)


def looks_like_path(ref: str) -> bool:
    """A reference with a separator or a YAML suffix is a path; anything else is a shipped name."""
    return "/" in ref or os.sep in ref or ref.endswith((".yaml", ".yml"))


def is_file(path: str | Path) -> bool:
    """Whether ``path`` is a file; a name the file system refuses (too long, NUL) is an error
    naming it (exit 2), not an ``OSError``."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError) as exc:
        shown = (
            str(path) if len(str(path)) <= 80 else f"{str(path)[:60]}...({len(str(path))} chars)"
        )
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{shown}: not a usable file name ({why})") from None


def locate(ref: str) -> str | Path:
    """A config named on the command line: a Path when it looks like one or is a file, else a
    shipped name."""
    return Path(ref) if looks_like_path(ref) or is_file(ref) else ref


def find(ref: str, kind: Kind, base_dir: Path | None = None) -> Path:
    """Resolve a shipped name or a path (relative to ``base_dir``, then the working directory)."""
    if looks_like_path(ref):
        candidates = (
            [Path(ref)]
            if Path(ref).is_absolute()
            else [*([base_dir / ref] if base_dir is not None else []), Path.cwd() / ref]
        )
        for c in candidates:
            if is_file(c):
                return c
        raise ConfigError(f"{ref}: no such {kind} file")
    names = shipped(kind)
    if ref in names:
        return names[ref]
    hint = difflib.get_close_matches(ref, list(names), n=1)
    did = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise ConfigError(
        f"no {kind} named '{ref}'{did}; `zebractl {_DIRS[kind]}` lists them, or "
        "give a path to a .yaml file"
    )
