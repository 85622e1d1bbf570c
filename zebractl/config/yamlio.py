"""YAML reading that remembers where every value came from.

:func:`load_with_lines` returns the document as plain Python plus a map ``dotted.key -> line`` (1-based)
for every mapping key. Scalars follow YAML 1.2 for floats (``1e-6`` is a float, as users expect, where
PyYAML's YAML 1.1 default reads it as a string), and only ``true``/``false`` are booleans (not
``yes``/``no``/``on``/``off``). Duplicate keys are an error, not a silent overwrite.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from zebractl.config.errors import ConfigError


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.2 core-schema floats: accept 1e-6, 1E5, .5, 5. alongside PyYAML's forms.
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))
# YAML 1.2 booleans: only true/false. YAML 1.1's yes/no/on/off silently became booleans.
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_scalar(text: str) -> Any:
    """Parse one YAML value the way a config file would (used for ``--set key=value``)."""
    try:
        return yaml.load(text, Loader=_Loader) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _convert(
    node: yaml.Node, loader: _Loader, prefix: str, lines: dict[str, int], where: str
) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConfigError(
                    f"{where}:{key_node.start_mark.line + 1}: key {key!r} must be a string",
                    key=prefix.rstrip(".") or None,
                )
            dotted = prefix + key
            if key in out:
                raise ConfigError(
                    f"{where}:{key_node.start_mark.line + 1}: {dotted}: duplicate key "
                    f"(first set on line {lines[dotted]})",
                    key=dotted,
                )
            lines[dotted] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, loader, dotted + ".", lines, where)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(v, loader, prefix + f"{i}.", {}, where) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_with_lines(
    path: Path, display: str | None = None
) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML mapping; return it and the line of every (nested) key."""
    where = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        lines: dict[str, int] = {}
        if node is None:
            return {}, lines
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(
                f"{where}:{node.start_mark.line + 1}: the file must be a mapping of keys to values"
            )
        data = _convert(node, loader, "", lines, where)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}{line}: invalid YAML: {exc.problem or exc}") from None
    finally:
        loader.dispose()
    return data, lines
