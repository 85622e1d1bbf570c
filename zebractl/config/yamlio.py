"""YAML reading that remembers where every value came from, and survives hostile input.

:func:`load_with_lines` returns the document as plain Python plus a map ``dotted.key -> line`` (1-based)
for every mapping key (list items as ``key.0``, ``key.1``, ...). Guarantees:

- **YAML 1.2 core schema for scalars.** Integers are decimal (``010`` is ten), ``0o17`` octal or
  ``0x1F`` hex, never YAML 1.1's sexagesimal ``1:00`` (a string) or ``0b``/underscore forms; floats
  include ``1e-6`` (PyYAML's YAML 1.1 reads it as a string); only ``true``/``false`` are booleans
  (``yes``/``no``/``on``/``off`` stay strings); no timestamps.
- **Duplicate keys** are an error naming both lines.
- **Aliases** expand to at most :data:`MAX_NODES` values in all (an alias bomb is an error, not a
  hang) and may not contain themselves.
- **Nesting** deeper than :data:`MAX_DEPTH` levels is an error.
- **Control characters** (anything below U+0020 but tab, line feed and carriage return, and DEL) are
  an error naming the line and column; the file must be UTF-8 and at most :data:`MAX_BYTES`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from zebractl.errors import ConfigError

MAX_NODES = 100_000
"""Values a document may expand to, aliases included (shipped configs hold a few hundred)."""
MAX_DEPTH = 32
"""Levels of nested mappings and lists (shipped configs use four)."""
MAX_BYTES = 1 << 20
"""Largest config file read (shipped configs are a few KB)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class _Loader(yaml.SafeLoader):
    pass


def _only(tags: set[str]) -> None:
    _Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag not in tags]
        for k, v in _Loader.yaml_implicit_resolvers.items()
    }


_INT, _FLOAT, _BOOL = (f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool"))
_Loader.yaml_implicit_resolvers = dict(yaml.SafeLoader.yaml_implicit_resolvers)
_only({_INT, _FLOAT, _BOOL, "tag:yaml.org,2002:timestamp"})
# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
_INT_RE = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.add_implicit_resolver(_INT, _INT_RE, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+0123456789."))
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


_Loader.add_constructor(_INT, _construct_int)
_Loader.add_constructor(_FLOAT, _construct_float)


def parse_scalar(text: str, where: str = "--set") -> Any:
    """Parse one YAML value the way a config file would (used for ``--set key=value``), with the
    same guarantees as :func:`load_with_lines`; problems are named after ``where``."""
    bad = _CONTROL.search(text)
    if bad:
        raise ConfigError(f"{where}: control character U+{ord(bad.group()):04X} in the value")
    if not text.strip():
        return ""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else _value(node, loader, _Budget(where), ())
    except (yaml.YAMLError, RecursionError):
        return text
    finally:
        loader.dispose()


class _Budget:
    """Counts the values a document expands to (aliases included)."""

    def __init__(self, where: str) -> None:
        self.where, self.left = where, MAX_NODES
        self.top: tuple[str, int] | None = None  # the top-level key being read, and its line

    def at(self, node: yaml.Node) -> str:
        """``file:line`` of a node (a --set value has one line)."""
        return (
            self.where
            if self.where.startswith("--set")
            else f"{self.where}:{node.start_mark.line + 1}"
        )

    def limit(self, node: yaml.Node, what: str) -> ConfigError:
        """A limit tripped at ``node``: named at the top-level key holding it (its line), with
        the line where it tripped."""
        if self.top is None or self.where.startswith("--set"):
            return ConfigError(f"{self.at(node)}: {what}")
        key, line = self.top
        return ConfigError(
            f"{self.where}:{line}: {key}: {what} (at line {node.start_mark.line + 1})"
        )

    def spend(self, node: yaml.Node) -> None:
        self.left -= 1
        if self.left < 0:
            raise self.limit(
                node,
                f"the document expands to more than {MAX_NODES:,} values (aliases repeated "
                "inside aliases?); write it out plainly",
            )


def _enter(node: yaml.Node, budget: _Budget, stack: tuple[int, ...], label: str = "") -> tuple:
    """Count ``node`` against the alias budget and refuse recursion and depth; returns the stack of
    its children."""
    budget.spend(node)
    if id(node) in stack:
        raise budget.limit(node, "an alias refers to a value that contains it; remove the alias")
    if len(stack) > MAX_DEPTH:
        raise budget.limit(node, f"nested more than {MAX_DEPTH} levels deep; flatten it")
    return (*stack, id(node))


_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _pair(m: re.Match[str]) -> str:
    return m.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def _scalar(node: yaml.Node, loader: _Loader, budget: _Budget) -> Any:
    """A scalar's value. A surrogate pair written as two escapes (``"\\ud83d\\ude00"``, as JSON
    spells it) is joined into its one character; a lone surrogate (which YAML accepts and no UTF-8
    writer can print) is refused here, at its line, rather than where the config is shown or
    written."""
    value = loader.construct_object(node, deep=True)
    if isinstance(value, str) and _SURROGATE.search(value):
        value = _PAIR.sub(_pair, value)
        bad = _SURROGATE.search(value)
        if bad:
            raise ConfigError(
                f"{budget.at(node)}: a lone surrogate escape (\\u{ord(bad.group()):04x}), not "
                "Unicode text"
            )
    return value


def _value(node: yaml.Node, loader: _Loader, budget: _Budget, stack: tuple[int, ...]) -> Any:
    """A plain value (no line bookkeeping) with the depth, alias and recursion checks."""
    inner = _enter(node, budget, stack)
    if isinstance(node, yaml.MappingNode):
        return {
            _value(k, loader, budget, inner): _value(v, loader, budget, inner)
            for k, v in node.value
        }
    if isinstance(node, yaml.SequenceNode):
        return [_value(v, loader, budget, inner) for v in node.value]
    return _scalar(node, loader, budget)


def _convert(
    node: yaml.Node,
    loader: _Loader,
    prefix: str,
    lines: dict[str, int],
    budget: _Budget,
    stack: tuple[int, ...] = (),
) -> Any:
    where = budget.where
    inner = _enter(node, budget, stack, prefix.rstrip(".") or "(top level)")
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _value(key_node, loader, budget, inner)
            if not isinstance(key, str):
                raise ConfigError(
                    f"{where}:{key_node.start_mark.line + 1}: key {key!r} must be a string"
                )
            dotted = prefix + key
            if key in out:
                raise ConfigError(
                    f"{where}:{key_node.start_mark.line + 1}: {dotted}: duplicate key "
                    f"(first set on line {lines[dotted]})"
                )
            lines[dotted] = key_node.start_mark.line + 1
            if not prefix:  # a top-level key: limits tripped inside it are named at it
                budget.top = (key, lines[dotted])
            out[key] = _convert(value_node, loader, dotted + ".", lines, budget, inner)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, v in enumerate(node.value):
            lines[f"{prefix}{i}"] = v.start_mark.line + 1
            items.append(_convert(v, loader, f"{prefix}{i}.", lines, budget, inner))
        return items
    return _scalar(node, loader, budget)


_TOP_KEY = re.compile(r"""^(?:"([^"]+)"|'([^']+)'|([^\s#:'"{}\[\]-][^:#]*?))\s*:(?:\s|$)""")


def _top_key_at(text: str, line: int) -> tuple[str, int] | None:
    """The top-level key (written at column 0) whose value holds ``line``, and its line."""
    rows = text.splitlines()
    for n in range(min(line, len(rows)), 0, -1):
        m = _TOP_KEY.match(rows[n - 1])
        if m:
            return next(g for g in m.groups() if g is not None).strip(), n
    return None


def _check_flow_depth(text: str, where: str) -> None:
    """Refuse ``[[[[...`` / ``{{{{...`` deeper than :data:`MAX_DEPTH` before the parser recurses
    into it (quoted text and comments are skipped)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth, quote, line = 0, "", 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j - 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                what = f"nested more than {MAX_DEPTH} levels deep; flatten it"
                top = _top_key_at(text, line)
                if top is None:
                    raise ConfigError(f"{where}:{line}: {what}")
                raise ConfigError(f"{where}:{top[1]}: {top[0]}: {what} (at line {line})")
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1


def load_with_lines(
    path: Path, display: str | None = None
) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML mapping; return it and the line of every (nested) key."""
    where = display or str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_BYTES >> 20} MiB; not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{where}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x}); save it as UTF-8"
        ) from None
    bad = _CONTROL.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        col = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise ConfigError(
            f"{where}:{line}:{col}: control character U+{ord(bad.group()):04X}; remove it"
        )
    _check_flow_depth(text, where)
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
        data = _convert(node, loader, "", lines, _Budget(where))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}{line}: invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{where}: nested too deeply to read (more than {MAX_DEPTH} levels are refused)"
        ) from None
    finally:
        loader.dispose()
    return data, lines
