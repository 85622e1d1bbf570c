"""Configs named on the command line, run directories included: ``zebractl config show|diff|
validate`` accept a shipped name, a YAML file, or a run directory (the resolved config it recorded,
``RUN/config.resolved.json``). Reading a run directory is run/'s (it owns RUN/'s layout), so this
dispatch lives here, above :mod:`zebractl.config.resolve`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

from zebractl.config import catalog
from zebractl.config.resolve import Resolved, apply_sets, resolve_ref, validated_run
from zebractl.errors import ConfigError
from zebractl.run.rundir import RunDir

if TYPE_CHECKING:
    from zebractl.schemas.reports import ConfigShowReport, ConfigValidateReport


def resolve_run(ref: str | Path, sets: list[str] | None = None) -> Resolved:
    """The resolved config a run recorded: ``RUN`` or ``RUN/config.resolved.json``, with the
    provenance as recorded, then ``--set`` overrides (validated as a recipe again)."""
    path = Path(ref)
    if path.is_dir():
        root = path
        if not (root / RunDir.CONFIG).is_file():
            raise ConfigError(
                f"{ref}: a directory but not a zebractl run directory (no {RunDir.CONFIG}); give a "
                "shipped recipe or preset name, a .yaml file, or a run directory"
            )
    elif path.name == RunDir.CONFIG:
        root = path.parent
    else:
        raise ConfigError(
            f"{ref}: not a recipe or preset (.yaml) nor a run's {RunDir.CONFIG}; give a shipped "
            "name, a .yaml file, or a run directory"
        )
    run = RunDir(root)
    record = run.read_config()
    raw = copy.deepcopy(record.config)
    where = dict(record.provenance)
    apply_sets(raw, sets or [], where)
    return validated_run(record.name, str(run.config_path), raw, where)


def _is_run(path: Path) -> bool:
    try:
        if path.is_dir():  # a run directory or a mistake (resolve_run says which), unless it is
            # a folder named like a shipped config in the working directory
            names = {*catalog.shipped("recipe"), *catalog.shipped("preset")}
            return (path / RunDir.CONFIG).is_file() or str(path) not in names
        return path.name == RunDir.CONFIG or path.suffix == ".json"
    except (OSError, ValueError):
        return False


def resolve_any(ref: str, sets: list[str] | None = None) -> Resolved:
    """A recipe or preset, by path (kind detected) or shipped name (recipes first), or the
    resolved config a run directory recorded (``RUN`` or ``RUN/config.resolved.json``)."""
    if _is_run(Path(ref)) and (Path(ref).is_dir() or catalog.is_file(ref)):  # RUN or its JSON
        return resolve_run(ref, sets)
    if (catalog.looks_like_path(ref) or catalog.is_file(ref)) and not catalog.is_file(Path(ref)):
        raise ConfigError(
            f"{ref}: no such file or run directory (give a shipped name, a .yaml recipe "
            f"or preset, or a run directory holding {RunDir.CONFIG})"
        )
    return resolve_ref(ref, sets)


def show_report(r: Resolved) -> ConfigShowReport:
    """``config show --json``: the resolved values of ``r``, their sources and derived values."""
    from zebractl.schemas.reports import ConfigShowReport

    return ConfigShowReport(
        kind=r.kind,
        name=r.name,
        source=r.source,
        config=r.config,
        provenance=r.provenance,
        derived=r.derived,
    )


def validate(refs: list[str]) -> ConfigValidateReport:
    """``config validate``: each of ``refs`` resolved (:func:`resolve_any`), or its problems."""
    from zebractl.schemas.reports import ConfigValidateReport, ConfigValidateResult

    results = []
    for ref in refs:
        try:
            r = resolve_any(ref)
        except ConfigError as exc:
            results.append(ConfigValidateResult(path=ref, ok=False, errors=list(exc.problems)))
            continue
        results.append(ConfigValidateResult(path=ref, ok=True, kind=r.kind, name=r.name, errors=[]))
    return ConfigValidateReport(results=results, ok=all(x.ok for x in results))
