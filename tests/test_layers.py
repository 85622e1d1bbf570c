"""The layer table holds on the import graph: each layer imports only the layers below it (or its
own), the "never" rules hold, and no two modules import each other, even through others.

Every import counts, a function's lazy ``import`` included: it is a dependency all the same, only a
later one. Imports under ``if TYPE_CHECKING:`` do not (they are annotations, never executed). The
table is the one in the README's "Layers" section; a change to either is a change to both.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zebractl"

# bottom to top: a layer may import its own and the ones before it
LAYERS: list[tuple[str, ...]] = [
    ("zebractl", "errors", "util", "deps"),  # the version, error types, shared helpers, extras
    ("config", "schemas"),  # YAML with lines, resolve with provenance, every schema
    ("layout", "planning"),  # parameter layout, FLOPs, memory, throughput: from the config alone
    ("data",),  # corpus readers, tokenizers, prepare, verify, the dataset contract
    ("runtime",),  # process environment: devices, distributed, kernel caches, patches, quiet
    ("model",),  # the megatron model, mixers, kernels, init
    ("hf",),  # Hugging Face classes, the conversion tables, HF folders read into our names
    ("run",),  # the RUN directory contract: paths, records, checkpoints, metrics, tracking
    ("train",),  # Trainer, engines, data loader, launch, the FLA reference run
    ("convert",),  # export/import, Primus, verify
    ("evaluate",),  # lm-eval adapter, offline tasks
    ("generate",),  # sampling with the generation cache, chat sessions
    ("compare",),  # deltas between two runs as a report
    ("cli", "__main__"),  # argument parsing, rendering, exit codes
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}

HEAVY = ("torch", "megatron", "fla", "transformers", "triton", "tilelang")
NEVER: dict[str, tuple[str, ...]] = {
    "compare": ("zebractl.train",),
    "evaluate": ("zebractl.train",),
    "generate": ("zebractl.train",),
    "convert": ("zebractl.train",),
    "planning": HEAVY,
    "layout": HEAVY,
    "config": HEAVY,
    "schemas": HEAVY,
}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) of every executed import."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.extend((f"{child.module}.{a.name}", child.lineno, top) for a in child.names)
            inner = top and not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            visit(child, inner)

    visit(tree, True)
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported zebractl module, line, at module level)]; ``from zebractl.x import
    y`` is module ``zebractl.x.y`` where that is a module, else ``zebractl.x``."""
    mods = _modules()
    graph: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for mod, f in mods.items():
        for name, line, top in _imports(ast.parse(f.read_text(encoding="utf-8"))):
            while name not in mods and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in mods and name != mod:
                graph[mod].append((name, line, top))
    return graph


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_layer():
    names = {_layer(m) for m in _modules()}
    assert names <= set(RANK), f"not in the layer table: {sorted(names - set(RANK))}"


def test_no_layer_imports_a_layer_above_it():
    upward = [
        f"{_modules()[mod].relative_to(PACKAGE.parent)}:{line} imports {dep}"
        for mod, deps in _graph().items()
        for dep, line, _ in deps
        if RANK[_layer(dep)] > RANK[_layer(mod)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def _all_imports(mod: str, f: Path) -> list[tuple[str, int, bool]]:
    return _imports(ast.parse(f.read_text(encoding="utf-8")))


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_never_rules(layer):
    broken = [
        f"{f.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for mod, f in _modules().items()
        if _layer(mod) == layer
        for name, line, _ in _all_imports(mod, f)
        if any(name == p or name.startswith(p + ".") for p in NEVER[layer])
    ]
    assert not broken, "\n".join(broken)


def test_the_cli_imports_nothing_heavy_at_module_level():
    """Completion and --help stay instant: torch and friends only inside the commands."""
    broken = [
        f"{f.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for mod, f in _modules().items()
        if _layer(mod) in ("cli", "__main__", "zebractl")
        for name, line, top in _all_imports(mod, f)
        if top and name.split(".")[0] in HEAVY
    ]
    assert not broken, "\n".join(broken)


def test_no_import_cycles():
    graph = {m: sorted({d for d, _, _ in deps}) for m, deps in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not cycles, f"modules importing each other: {cycles}"


def test_the_checker_sees_what_it_must():
    """The graph is not empty and finds a known edge, a lazy one and a TYPE_CHECKING one left out."""
    graph = _graph()
    deps = {d: top for d, _, top in graph["zebractl.train.setup"]}
    assert deps["zebractl.run.rundir"] and not deps["zebractl.hf.load"]  # a lazy import counts
    assert not [d for d, _, _ in graph["zebractl.run.metrics"] if d == "zebractl.run.tracking"]
    tree = ast.parse("import a\ndef f():\n    import b\nif TYPE_CHECKING:\n    import c\n")
    assert _imports(tree) == [("a", 1, True), ("b", 3, False)]
