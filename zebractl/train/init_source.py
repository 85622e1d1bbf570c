"""What ``init_from`` (``train --init-from PATH`` or a recipe's ``init_from``) names, checked before
any weight is loaded: :func:`check_init`.

A source is a run directory (its newest checkpoint), a run's checkpoints folder, one checkpoint
folder (``iter_N`` with its ``zebractl.json``) or a Hugging Face folder (``config.json`` with
safetensors weights: a zebractl export, or FLA's own KDA / GDN checkpoint). Anything else (a file,
an empty folder, an unfinished checkpoint, a folder of something else) is exit 2 saying what the
path is and what was expected.

The model the source records (the checkpoint's own resolved config, else its run's
``config.resolved.json``; the model a zebractl export embeds in ``config.json``; FLA's
``config.json``) is compared with the recipe's (:mod:`zebractl.config.models`): a difference
weights cannot be loaded across is exit 2 naming both models, their layouts first, and the fields
with both values; the differences they load across (the rotary positions, a vocabulary in the same
padded rows) are said in notes.

Weights from a source start a run; they never replace a run's own: a run directory that holds
checkpoints resumes from them, so ``init_from`` into one is exit 2 naming the conflict, before
anything in it is written, unless it is the same fine-tune resumed (its ``init.json``, or for a
run trained before that record its resolved ``init_from``, names the same source) or
``checkpoint.resume`` is ``never`` (a fresh start on purpose).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError
from zebractl.run import checkpoint as ckpt
from zebractl.run.lock import LOCK
from zebractl.run.rundir import RunDir

EXPECTED = (
    "a run directory, its checkpoints folder, a checkpoint folder (iter_N with zebractl.json) or "
    "a Hugging Face folder (config.json with model.safetensors)"
)
"""What ``init_from`` takes, for the messages of the paths it does not."""


@dataclass(frozen=True)
class Source:
    """A source of weights and the model it records."""

    path: Path
    """As given."""
    kind: str
    """``run``, ``checkpoints``, ``checkpoint`` or ``hf``."""
    model: Any = None
    """The model it records (a ``ModelConfig``); None for FLA's own folder (its config.json is
    checked key by key) or a run whose record cannot be read (the loader says what is wrong)."""
    preset: str | None = None
    """The preset the run that wrote it named (runs and checkpoints)."""
    notes: list[str] = field(default_factory=list)
    """What the differences its weights load across mean (filled by :func:`check_fits`)."""


def label(path: Path, given_by: str) -> str:
    """``--init-from PATH`` or ``init_from PATH (recipes/x.yaml:9)``, for messages."""
    if given_by == "--init-from":
        return f"--init-from {path}"
    return f"init_from {path} ({given_by})"


def _what_is(path: Path) -> str | None:
    """What ``path`` is when it is no source (None: it may be one)."""
    if path.is_file():
        return "is a file"
    if not path.is_dir():
        return "is neither a file nor a folder"
    entries = sorted(p.name for p in path.iterdir() if p.name != LOCK)
    if not entries:
        return "is an empty folder"
    if ckpt.is_checkpoint_name(path.name):
        return (
            f"is a checkpoint folder without its {ckpt.MARKER} (its save did not complete, or "
            "the marker was removed)"
        )
    if (path / "config.json").is_file():
        return (
            "holds a config.json but no model.safetensors (or its index): not a complete "
            "Hugging Face folder"
        )
    if (path / RunDir.CONFIG).is_file() or ckpt.candidates(path):
        return None
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    n = len(entries)
    return f"is a folder of something else ({n} entr{'ies' if n > 1 else 'y'}: {shown})"


def open_source(path: Path, given_by: str) -> Source:
    """The source ``path`` names and the model it records; exit 2 for a path that is none."""
    from zebractl.hf import load as hf_load

    path = Path(path)
    if hf_load.is_hf_folder(path):
        return Source(path, "hf", hf_load.embedded_model(path, hf_load.read_config(path)))
    if (path / ckpt.MARKER).is_file():
        return _recorded(path, "checkpoint", path)
    what = _what_is(path)
    if what is not None:
        raise ConfigError(f"{label(path, given_by)} {what}; expected {EXPECTED}")
    if (path / RunDir.CONFIG).is_file():
        return _run_source(path, given_by)
    return _recorded(path, "checkpoints", _newest(path))


def _newest(root: Path) -> Path | None:
    """The newest complete checkpoint folder under ``root`` (None: none complete)."""
    done = ckpt.complete(root)
    return done[-1].folder if done else None


def _run_source(path: Path, given_by: str) -> Source:
    """A run directory: its newest complete checkpoint, which must exist."""
    root = RunDir(path).checkpoints  # where the loader looks (as `zebractl convert` does)
    if not ckpt.candidates(root):
        raise ConfigError(
            f"{label(path, given_by)} is a run directory without a checkpoint in {root} (it has "
            "not saved one yet, or saves none: checkpoint.enabled false); expected "
            f"{EXPECTED}"
        )
    return _recorded(path, "run", _newest(root))


def _recorded(path: Path, kind: str, folder: Path | None) -> Source:
    """The model a checkpoint was saved with (its common state), else its run's record."""
    from zebractl.schemas.preset import ModelConfig

    config = ckpt.recorded_config(folder) if folder is not None else None
    if config is None:
        root = RunDir.containing(folder if folder is not None else path)
        try:
            config = RunDir(root).read_config().model_dump() if root is not None else None
        except ConfigError:
            config = None
    values = (config or {}).get("config") or {}
    try:
        model = ModelConfig.model_validate(values["model"])
    except Exception:  # noqa: BLE001 - no readable record: the loader names what is wrong
        return Source(path, kind)
    return Source(path, kind, model, values.get("preset"))


def check_fits(src: Source, m: Any, preset: str | None, opt: str) -> Source:
    """Exit 2 when the source's model is not ``m`` (the recipe's, of ``preset``) in a way its
    weights cannot be loaded across; returns the source with the notes of the differences they
    load across."""
    from zebractl.config import models
    from zebractl.hf import load as hf_load

    if src.kind == "hf" and src.model is None:  # FLA's own: its config.json, key by key
        hf_load.check_fits(src.path, m, preset, " of the recipe")
        return src
    if src.model is None:
        return src
    diffs = models.differences(src.model, m)
    refused = models.blocking(diffs)
    if refused:
        held = models.described(src.model, src.preset)
        wanted = models.described(m, preset) + " of the recipe"
        raise ConfigError(
            models.mismatch(str(src.path), held, wanted, refused)
            + f". {opt} loads weights only into the model they were trained as: start from a "
            "run or export of the recipe's model, or train with a recipe of the source's"
        )
    notes = models.loading_notes(str(src.path), src.model, diffs)
    return Source(src.path, src.kind, src.model, src.preset, notes)


def _same(a: Path, recorded: list[str | None]) -> bool:
    """Whether ``a`` is one of the recorded paths (each absolute, or relative to here)."""
    try:
        here = a.resolve()
        return any(r is not None and Path(r).resolve() == here for r in recorded)
    except OSError:
        return False


def _started_from(run: RunDir) -> tuple[str, list[str | None]]:
    """What the run in ``run`` started from, in words, and the paths that name it (``init.json``;
    for a run trained before it, the resolved ``init_from``)."""
    try:
        rec = run.read_init()
    except ConfigError:
        rec = None
    if rec is not None:
        return rec.init_from, [rec.path, rec.checkpoint, rec.run]
    try:
        given = run.read_config().config.get("init_from")
    except ConfigError:
        given = None
    return (given, [given]) if given else ("a fresh initialisation", [])


def check_conflict(run: RunDir, resume: str, path: Path, given_by: str) -> bool:
    """Whether the run resumes (True: ``init_from`` is the source it started from, and goes
    unused); exit 2 when ``run`` holds checkpoints of a run that started from anything else.
    ``resume``: ``checkpoint.resume`` (``never`` starts over, from ``path``)."""
    found = ckpt.candidates(run.checkpoints) if resume != "never" else []
    if not found:
        return False
    opt = label(path, given_by)
    drop = "without --init-from" if given_by == "--init-from" else "with --set init_from=null"
    if _same(path, [str(run.root)]):
        raise ConfigError(
            f"{opt} is the run directory this trains into, which holds checkpoints (iteration "
            f"{found[-1][0]}): rerun {drop} to resume it"
        )
    what, names = _started_from(run)
    if _same(path, names):
        return True
    raise ConfigError(
        f"{run.root} already holds checkpoints (iteration {found[-1][0]}) of a run that started "
        f"from {what}; {opt} applies to a fresh start only, and this would resume that run. "
        f"Resume it {drop}, or choose another --output for a run from {path}"
    )


def check_init(cfg: Any, run: RunDir, path: Path, given_by: str) -> Source | None:
    """:func:`check_conflict`, then (unless the run resumes) the source and its model against
    the recipe's (:func:`check_fits`). Returns the source to load, None when the run resumes."""
    if check_conflict(run, cfg.checkpoint.resume, path, given_by):
        return None
    opt = "--init-from" if given_by == "--init-from" else "init_from"
    return check_fits(open_source(path, given_by), cfg.model, cfg.preset, opt)
