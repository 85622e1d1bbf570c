"""Merge presets, recipes and ``--set`` overrides into one validated config, with provenance.

One merge order: schema default < preset (its ``extends`` chain, base first) < recipe (its ``extends``
chain; its ``model:`` section overrides the preset) < ``--set dotted.key=value``. ``extends`` is the
only inheritance key; any other key the schema does not know is an error naming the key, the file and
line, and the closest valid key.

Every resolved leaf value gets a provenance string: ``default``, ``<file>:<line>`` or ``--set``.
"""

from __future__ import annotations

import copy
import difflib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from zebractl.config import catalog
from zebractl.config.yamlio import load_with_lines, parse_scalar
from zebractl.errors import ConfigError
from zebractl.schemas.preset import ModelConfig, model_problems
from zebractl.schemas.recipe import Derived, RunConfig, derive, related_keys, run_problems
from zebractl.util import flatten

INHERIT_KEY = "extends"
# Keys people reach for when they mean `extends`; named in the error so the fix is obvious.
_RECIPE_ONLY_KEYS = set(RunConfig.model_fields) - {"description"}
_INHERIT_LOOKALIKES = {
    "bases",
    "base",
    "inherit",
    "inherits",
    "include",
    "includes",
    "defaults",
    "_base_",
    "parent",
    "parents",
    "extend",
    "extents",
    "import",
    "imports",
}


@dataclass(frozen=True)
class Resolved:
    """A validated config and where each of its values came from."""

    kind: Literal["preset", "recipe"]
    name: str
    source: str
    config: RunConfig | ModelConfig
    provenance: dict[str, str]

    @property
    def run(self) -> RunConfig:
        """The config as a recipe (errors for a preset)."""
        if not isinstance(self.config, RunConfig):
            raise ConfigError(
                f"{self.source} is a preset (an architecture), not a recipe; plan and "
                "train need a recipe that names it with `preset:`"
            )
        return self.config

    @property
    def derived(self) -> Derived | None:
        """Derived values of a recipe; None for a preset."""
        return derive(self.config) if isinstance(self.config, RunConfig) else None

    def values(self) -> dict[str, Any]:
        """The nested resolved values (aliases as written in YAML)."""
        return self.config.model_dump(mode="json", by_alias=True)


# ---- reading files ---------------------------------------------------------------------------------


@dataclass
class _Layer:
    data: dict[str, Any]
    lines: dict[str, int]
    display: str
    path: Path


MAX_EXTENDS = 64
"""The longest ``extends`` chain read (files, the first included): deeper is an error naming the
first file, not a recursion that runs out of stack."""


def _read_chain(path: Path, kind: catalog.Kind) -> list[_Layer]:
    """The file and what it extends, base first (a loop, not a recursion: a chain of any length
    ends in a cycle or depth error naming where it started)."""
    layers: list[_Layer] = []
    seen: list[Path] = []
    real = path.resolve()
    first_line = extended_at = 1
    while True:
        display = catalog.display_path(real)
        if real in seen:
            cycle = " -> ".join(catalog.display_path(p) for p in (*seen, real))
            raise ConfigError(f"{display}: `extends` cycle: {cycle}")
        if len(seen) == MAX_EXTENDS:
            raise ConfigError(
                f"{layers[0].display}:{first_line}: extends: the chain is longer than "
                f"{MAX_EXTENDS} files (it reached {display})"
            )
        seen.append(real)
        data, lines = load_with_lines(real, display)
        if not data and layers:
            raise ConfigError(
                f"{display}:1: the file is empty (no keys); it is extended at "
                f"{layers[-1].display}:{extended_at}"
            )
        layer = _Layer(data, lines, display, real)
        layers.append(layer)
        if INHERIT_KEY not in data:
            return layers[::-1]
        ref, line = data.pop(INHERIT_KEY), lines.pop(INHERIT_KEY)
        extended_at = line
        if len(layers) == 1:
            first_line = line  # the first file's `extends` (named by a depth error)
        if not isinstance(ref, str) or not ref:
            raise ConfigError(
                f"{display}:{line}: extends: expected the name or path of one {kind}, got {ref!r}"
            )
        try:
            real = catalog.find(ref, kind, real.parent).resolve()
        except ConfigError as exc:
            raise ConfigError(f"{display}:{line}: extends: {exc}") from None


def _where_of_leaves(
    value: Any, prefix: str, lines: dict[str, int], display: str, where: dict[str, str]
) -> None:
    line = lines.get(prefix)
    if line is not None:
        where[prefix] = f"{display}:{line}"
    if isinstance(value, dict):
        for k, v in value.items():
            _where_of_leaves(v, f"{prefix}.{k}", lines, display, where)
    elif isinstance(value, list):  # list items (e.g. data.paths.1.weight) have lines too
        for i, v in enumerate(value):
            _where_of_leaves(v, f"{prefix}.{i}", lines, display, where)


def _merge(
    target: dict[str, Any],
    src: dict[str, Any],
    *,
    prefix: str,
    lines: dict[str, int],
    line_prefix: str,
    display: str,
    where: dict[str, str],
) -> None:
    """Deep-merge ``src`` into ``target``; mappings merge key by key, anything else replaces."""
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        line_key = f"{line_prefix}{key}"
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            if line_key in lines:
                where[dotted] = f"{display}:{lines[line_key]}"
            _merge(
                target[key],
                value,
                prefix=dotted + ".",
                lines=lines,
                line_prefix=line_key + ".",
                display=display,
                where=where,
            )
            continue
        for stale in [k for k in where if k == dotted or k.startswith(dotted + ".")]:
            del where[stale]
        target[key] = copy.deepcopy(value)
        shifted = {
            prefix + k[len(line_prefix) :]: v
            for k, v in lines.items()
            if k == line_key or k.startswith(line_key + ".")
        }
        _where_of_leaves(value, dotted, shifted, display, where)


def _merge_layers(
    target: dict[str, Any], layers: list[_Layer], prefix: str, where: dict[str, str]
) -> None:
    """Merge file layers (base first) into ``target``, whose keys live under ``prefix``."""
    for layer in layers:
        _merge(
            target,
            layer.data,
            prefix=prefix,
            lines=layer.lines,
            line_prefix="",
            display=layer.display,
            where=where,
        )


EXCLUSIVE = {
    "schedule.iterations": "schedule.train_tokens",
    "schedule.train_tokens": "schedule.iterations",
}
"""Keys of which a config sets exactly one: a --set of one clears the other (its provenance then
says ``cleared by --set KEY``)."""


def _clear_exclusive(raw: dict[str, Any], key: str, where: dict[str, str]) -> None:
    other = EXCLUSIVE.get(key)
    if other is None:
        return
    section, _, leaf = other.rpartition(".")
    node = raw.get(section)
    if isinstance(node, dict) and node.get(leaf) is not None:
        node[leaf] = None
        where[other] = f"cleared by --set {key}"


def apply_sets(raw: dict[str, Any], sets: list[str], where: dict[str, str]) -> None:
    """Apply ``--set dotted.key=value`` overrides (YAML scalars) in order; setting one of two
    :data:`EXCLUSIVE` keys clears the other."""
    for item in sets:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key or any(not part for part in key.split(".")):
            raise ConfigError(
                f"--set {item!r}: expected dotted.key=value, e.g. --set schedule.lr=3e-4"
            )
        parts = key.split(".")
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"--set {item!r}: {'.'.join(parts[: i + 1])} is a value, not a section"
                )
            node = child
        for stale in [k for k in where if k == key or k.startswith(key + ".")]:
            del where[stale]
        node[parts[-1]] = parse_scalar(text, f"--set {key}")
        where[key] = "--set"
        if node[parts[-1]] is not None:
            _clear_exclusive(raw, key, where)
        if isinstance(node[parts[-1]], dict):
            for leaf in flatten(node[parts[-1]], key):
                where[leaf] = "--set"


# ---- validation and error rendering ----------------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """The model class inside Optional[...] / list[...] annotations, else None."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema class that owns the keys at ``loc`` (indices into lists are skipped)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model


def schema_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every settable dotted key of a schema (leaves; sections are expanded)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        sub = _unwrap(field.annotation)
        if sub is not None and typing.get_origin(field.annotation) is not list:
            out += schema_keys(sub, key + ".")
        else:
            out.append(key)
    return out


def schema_choices(dotted: str, model: type[BaseModel] = RunConfig) -> list[str]:
    """The values a leaf key of the schema can take when they are a fixed set (a ``Literal``, a
    bool; ``null`` where the key is optional), as ``--set`` spells them; [] for any other key."""
    head, _, rest = dotted.partition(".")
    field = next((f for n, f in model.model_fields.items() if (f.alias or n) == head), None)
    if field is None:
        return []
    if rest:
        sub = _unwrap(field.annotation)
        return schema_choices(rest, sub) if sub is not None else []
    out: list[str] = []
    todo = [field.annotation]
    while todo:
        annotation = todo.pop(0)
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            todo[:0] = list(typing.get_args(annotation))
        elif origin is Literal:
            out += [str(v).lower() if isinstance(v, bool) else str(v) for v in annotation.__args__]
        elif annotation is bool:
            out += ["true", "false"]
        elif annotation is type(None):
            out.append("null")
        else:
            return []  # a free-form value among the choices: nothing to offer
    return list(dict.fromkeys(out))


def _source_of(dotted: str, where: dict[str, str], default: str) -> str:
    """Where ``dotted`` was set; else where a key under it was (an unknown section brought in by
    ``--set no.such=1`` is the --set's, not the recipe's that has a section above it); else where
    the section holding it was; else ``default``."""
    if dotted in where:
        return where[dotted]
    below = [src for k, src in where.items() if dotted and k.startswith(dotted + ".")]
    if below:
        return below[0]
    key = dotted.rpartition(".")[0]
    while key:
        if key in where:
            return where[key]
        key = key.rpartition(".")[0]
    return default


_EXPECTED = {
    "float_type": "a number",
    "float_parsing": "a number",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}
_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        what = f"a {len(text)}-digit integer" if isinstance(value, int) else f"{text[:40]}..."
        return f"{what} ({type(value).__name__})"
    return f"{text} ({type(value).__name__})"


def _render(
    err: Any, root: type[BaseModel], prefix: str, where: dict[str, str], default_src: str
) -> tuple[str, str]:
    """One pydantic error as (dotted key, 'file:line: key: message')."""
    loc = tuple(err["loc"])
    dotted = prefix + ".".join(str(p) for p in loc)
    src = _source_of(dotted, where, default_src)
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(root, loc[:-1])
        valid = _keys_of(owner) if owner else []
        if key in _INHERIT_LOOKALIKES and tuple(loc[:-1]) in ((), ("model",)):
            msg = (
                f"unknown key '{key}': zebractl has exactly one inheritance key, "
                f"'{INHERIT_KEY}' (did you mean '{INHERIT_KEY}'?)"
            )
        else:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = (
                f"did you mean '{close[0]}'?"
                if close
                else f"valid keys here: {', '.join(valid)}"
                if valid
                else ""
            )
            msg = f"unknown key '{key}'" + (f" ({hint})" if hint else "")
    elif kind == "missing":
        msg = "required key is missing"
    elif kind in _EXPECTED:
        msg = f"expected {_EXPECTED[kind]}, got {_describe(err.get('input'))}"
    elif kind in _BOUNDS:
        bound = next(iter(err.get("ctx", {}).values()), "?")
        msg = f"must be {_BOUNDS[kind]} {bound}, got {_describe(err.get('input'))}"
    elif kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        value = err.get("input")
        choices = [c.strip().strip("'") for c in expected.replace(" or ", ",").split(",")]
        close = (
            difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
        )
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        msg = f"expected one of {expected}, got {_describe(value)}{hint}"
    elif kind == "finite_number":
        msg = f"must be a finite number, got {_describe(err.get('input'))}"
    elif kind in ("too_short", "too_long"):
        msg = err["msg"][0].lower() + err["msg"][1:]
    else:
        msg = err["msg"].removeprefix("Value error, ")  # a validator's own words
    if src == "--set" and dotted not in where:  # a --set under the key (a section it made)
        under = [k for k, v in where.items() if v == "--set" and k.startswith(dotted + ".")]
        src = f"--set {under[0]}" if under else src
    return dotted, f"{src}: {dotted or '(top level)'}: {msg}"


def _validate(
    cls: type[RunConfig] | type[ModelConfig],
    raw: dict[str, Any],
    where: dict[str, str],
    default_src: str,
    order: dict[str, int] | None = None,
) -> RunConfig | ModelConfig:
    try:
        cfg = cls.model_validate(raw)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        lines = [_render(e, cls, "", where, default_src)[1] for e in errors]
        raise ConfigError("\n".join(lines), problems=lines) from None
    found = run_problems(cfg) if isinstance(cfg, RunConfig) else model_problems(cfg)
    if found:
        lines = [_blame(k, msg, raw, where, default_src, order or {}) for k, msg in found]
        raise ConfigError("\n".join(lines), problems=lines)
    return cfg


def _rank(src: str, order: dict[str, int]) -> int:
    """How late in the merge order a source is: ``--set`` last, then the files in ``order``
    (display -> position: the preset's chain, then the recipe's), then anything else."""
    if src == "--set" or src.startswith("cleared by --set"):
        return 1 << 30
    return order.get(src.rpartition(":")[0], 0)


def _blame(
    key: str, msg: str, raw: dict[str, Any], where: dict[str, str], default: str,
    order: dict[str, int],
) -> str:  # fmt: skip
    """A cross-field problem at ``key``, as ``source: key: message``. When a key it depends on
    (:func:`related_keys`) was set later in the merge order than ``key`` itself (a recipe that
    nulls the preset's mixer section, a ``--set`` of the micro batch), that setting is the cause:
    the line names its source and says where ``key`` came from."""
    own = _source_of(key, where, default)
    cause, best = None, _rank(own, order)
    for other in related_keys(key):
        if other in where and _rank(where[other], order) > best:
            cause, best = other, _rank(where[other], order)
    if cause is None:
        return f"{own}: {key}: {msg}"
    src = where[cause]
    src = f"--set {cause}" if src == "--set" else src
    value = _lookup(raw, cause)
    what = f"{cause} set to null" if value is None else f"{cause} = {_describe(value)}"
    return f"{src}: {key}: {msg} ({what} here; {key} from {own})"


def _lookup(raw: dict[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _provenance(cfg: BaseModel, where: dict[str, str]) -> dict[str, str]:
    dumped = cfg.model_dump(mode="json", by_alias=True)
    return {leaf: where.get(leaf, "default") for leaf in flatten(dumped)}


# ---- entry points ----------------------------------------------------------------------------------


def detect_kind(path: Path) -> catalog.Kind:
    """A recipe says so in its $schema line, or has a key only recipes have (preset, data, ...)."""
    try:
        head = path.read_text(encoding="utf-8").splitlines()[:1]
    except (OSError, UnicodeDecodeError):
        head = []
    if head and "$schema=" in head[0]:
        if "recipe.schema.json" in head[0]:
            return "recipe"
        if "preset.schema.json" in head[0]:
            return "preset"
    data, _ = load_with_lines(path)
    return "recipe" if set(data) & _RECIPE_ONLY_KEYS else "preset"


def resolve_preset(ref: str | Path, sets: list[str] | None = None) -> Resolved:
    """Validate a preset (architecture) file or shipped name on its own."""
    path = Path(ref) if isinstance(ref, Path) else catalog.find(ref, "preset")
    raw: dict[str, Any] = {}
    where: dict[str, str] = {}
    layers = _read_chain(path, "preset")
    _refuse_empty(layers, "")
    _merge_layers(raw, layers, "", where)
    apply_sets(raw, sets or [], where)
    source = layers[-1].display
    order = {layer.display: i for i, layer in enumerate(layers, 1)}
    cfg = _validate(ModelConfig, raw, where, source, order)
    return Resolved("preset", path.stem, source, cfg, _provenance(cfg, where))


def _refuse_empty(chain: list[_Layer], named_at: str) -> None:
    """A preset whose files hold no keys at all (an empty or comment-only file) is named as such,
    not reported as every required key missing from the recipe that names it."""
    if any(layer.data for layer in chain):
        return
    files = " <- ".join(layer.display for layer in reversed(chain))
    if not named_at:  # the file given on the command line: a recipe or a preset, it says nothing
        raise ConfigError(f"{chain[-1].display}:1: the file is empty (no keys in {files})")
    raise ConfigError(
        f"{chain[-1].display}:1: the preset is empty (no keys in {files}); it was named at "
        f"{named_at}"
    )


def resolve_recipe(ref: str | Path, sets: list[str] | None = None) -> Resolved:
    """Resolve a recipe: its preset, its own chain, then ``--set`` overrides."""
    path = Path(ref) if isinstance(ref, Path) else catalog.find(ref, "recipe")
    chain = _read_chain(path, "recipe")
    _refuse_empty(chain, "")
    source = chain[-1].display

    # Which preset, and from which file (relative paths resolve next to the file that names it).
    preset_ref: Any = None
    preset_layer: _Layer | None = None
    nulled = ""  # where the preset was set to null, if the last word on it was null
    for layer in chain:
        if "preset" in layer.data:
            preset_ref, preset_layer = layer.data["preset"], layer
            nulled = f"{layer.display}:{layer.lines['preset']}" if preset_ref is None else ""
    for item in sets or []:
        if item.partition("=")[0].strip() == "preset":
            preset_ref, preset_layer = parse_scalar(item.partition("=")[2], "--set preset"), None
            nulled = "--set preset" if preset_ref is None else ""
    if nulled:
        raise ConfigError(
            f"{nulled}: preset: set to null; a recipe names its architecture (e.g. "
            "`preset: kda_300M`; `zebractl presets` lists them)"
        )
    if preset_ref is None:
        problems = [
            f"{layer.display}:{layer.lines[key]}: unknown key '{key}': zebractl has exactly one "
            f"inheritance key, '{INHERIT_KEY}' (did you mean '{INHERIT_KEY}: {value}' to start "
            f"from another recipe, or 'preset: {value}' to name the architecture?)"
            for layer in chain
            for key, value in layer.data.items()
            if key in _INHERIT_LOOKALIKES
        ]
        problems.append(
            f"{source}: preset: required key is missing (name the architecture, e.g. "
            "`preset: kda_300M`; `zebractl presets` lists them)"
        )
        raise ConfigError("\n".join(problems), problems=problems)
    named_at = f"{preset_layer.display}:{preset_layer.lines['preset']}" if preset_layer else "--set"
    if not isinstance(preset_ref, str):
        raise ConfigError(
            f"{named_at}: preset: expected a preset name or path, got {_describe(preset_ref)}"
        )
    try:
        preset_path = catalog.find(
            preset_ref, "preset", preset_layer.path.parent if preset_layer else None
        )
    except ConfigError as exc:
        raise ConfigError(f"{named_at}: preset: {exc}") from None

    raw: dict[str, Any] = {"model": {}}
    where: dict[str, str] = {}
    preset_chain = _read_chain(preset_path, "preset")
    _refuse_empty(preset_chain, named_at)
    _merge_layers(raw["model"], preset_chain, "model.", where)
    _merge_layers(raw, chain, "", where)
    apply_sets(raw, sets or [], where)
    order = {layer.display: i for i, layer in enumerate([*preset_chain, *chain], 1)}
    cfg = _validate(RunConfig, raw, where, source, order)
    return Resolved("recipe", path.stem, source, cfg, _provenance(cfg, where))


def validated_run(name: str, source: str, raw: dict[str, Any], where: dict[str, str]) -> Resolved:
    """A run's recorded config (``raw``, its provenance ``where``) validated as a recipe again."""
    cfg = _validate(RunConfig, raw, where, source)
    return Resolved("recipe", name, source, cfg, _provenance(cfg, where))


def resolve_ref(ref: str, sets: list[str] | None = None) -> Resolved:
    """A recipe or preset by path (kind detected) or shipped name (recipes first); run
    directories are :func:`zebractl.run.resolve.resolve_any`'s."""
    if catalog.looks_like_path(ref) or catalog.is_file(ref):
        path = Path(ref)
        kind = detect_kind(path)
        return resolve_recipe(path, sets) if kind == "recipe" else resolve_preset(path, sets)
    if ref in catalog.shipped("recipe"):
        return resolve_recipe(ref, sets)
    if ref in catalog.shipped("preset"):
        return resolve_preset(ref, sets)
    names = [*catalog.shipped("recipe"), *catalog.shipped("preset")]
    close = difflib.get_close_matches(ref, names, n=1)
    did = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(
        f"no recipe or preset named '{ref}'{did}; give a path or see `zebractl "
        "recipes` / `zebractl presets`"
    )
