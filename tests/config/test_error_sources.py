"""Every config error names the source that caused it (issue 42, item 4), as families.

- A key set to null at any level of a recipe: the error names that file's line, not "missing" and
  not the preset whose value the recipe nulled.
- A cross-field check failed by a ``--set`` (or a recipe's override of a preset value): the line
  names the ``--set`` (or the recipe's line) and says where the other key came from.
- An empty or comment-only preset (or one whose whole chain is empty) is named, with where it was
  named; every file of an ``extends`` chain emptied in turn.
- A ``--set`` of a key that exists nowhere names that ``--set``.
"""

from __future__ import annotations

import pytest

from zebractl.config.resolve import resolve_recipe, schema_keys
from zebractl.errors import ConfigError


def _error(cli, *args: str) -> str:
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    return r.stderr


def test_preset_null_names_its_line(cli, write):
    write("r.yaml", "extends: tiny_kda\npreset: null\n")
    assert "r.yaml:2: preset: set to null" in _error(cli, "config", "validate", "r.yaml")
    err = _error(cli, "plan", "tiny_kda", "--set", "preset=null")
    assert "--set preset: preset: set to null" in err


def _leaf_keys() -> list[str]:
    """Every key of the recipe schema under the sections a tiny recipe sets (a sample of each
    section's leaves: all of them would run for minutes)."""
    keys = [
        k for k in schema_keys() if not k.startswith(("model.mamba2", "model.mla", "model.gdn"))
    ]
    return keys[::3]


@pytest.mark.parametrize("key", _leaf_keys())
def test_any_key_nulled_by_a_recipe_is_reported_at_the_recipes_line(write, key):
    """Set to null at its level in a recipe file: accepted (an optional key), or an error whose
    every line naming the key or a section above it points at the recipe, never at the preset
    and never as a bare "missing" without a line."""
    parts = key.split(".")
    text = "extends: tiny_kda\n" + "".join(
        f"{'  ' * i}{p}:{' null' if i == len(parts) - 1 else ''}\n" for i, p in enumerate(parts)
    )
    write("r.yaml", text)
    try:
        resolve_recipe("r.yaml")
    except ConfigError as exc:
        lines = exc.problems or str(exc).splitlines()
        assert all(x.startswith("r.yaml:") for x in lines), (key, lines)  # a line, this file
        assert any(x.startswith(f"r.yaml:{len(parts) + 1}:") for x in lines) or any(
            "required key is missing" in x
            for x in lines  # a section it made lacks a key
        ), (key, lines)


CROSS = [
    ("batch.micro=7", "batch.global", "--set batch.micro"),
    ("batch.global=20", "batch.global", "--set"),
    ("schedule.iterations=1", "schedule.warmup_iterations", "--set schedule.iterations"),
    ("schedule.lr=1e-9", "schedule.min_lr", "--set schedule.lr"),
    ("parallelism.num_gpus=3", "batch.global", "--set parallelism.num_gpus"),
    ("model.max_position_embeddings=64", "data.seq_length", "--set model.max_position_embeddings"),
    ("model.kda=null", "model.layout", "--set model.kda"),
    ("model.layout.mixer=gdn", "model.layout", "--set model.layout.mixer"),
    ("recompute.blocks=1", "recompute.blocks", "--set"),
]


@pytest.mark.parametrize(("setting", "key", "blamed"), CROSS)
def test_a_cross_field_error_caused_by_set_names_the_set(cli, setting, key, blamed):
    err = _error(cli, "config", "show", "tiny_kda", "--set", setting)
    line = next(x for x in err.splitlines() if f" {key}: " in x or f": {key}: " in x)
    assert line.removeprefix("error: ").lstrip().startswith(f"{blamed}: {key}:"), err


def test_a_recipe_override_of_a_preset_value_is_blamed_on_the_recipe(cli, write):
    write("r.yaml", "extends: tiny_kda\nmodel:\n  kda: null\n")
    err = _error(cli, "config", "validate", "r.yaml")
    assert "r.yaml:3: model.layout:" in err and "model.kda set to null" in err
    assert "presets/tiny_kda.yaml" in err  # where the layout itself came from


@pytest.mark.parametrize("text", ["", "# nothing\n", "\n\n"])
def test_an_empty_preset_is_named(cli, write, text):
    write("p.yaml", text)
    write("r.yaml", "extends: tiny_kda\npreset: p.yaml\n")
    err = _error(cli, "config", "validate", "r.yaml")
    assert "p.yaml:1: the preset is empty" in err and "named at r.yaml:2" in err
    assert "required key is missing" not in err


@pytest.mark.parametrize("emptied", [0, 1, 2])
def test_every_file_of_a_chain_emptied(cli, write, emptied):
    """A three-file recipe chain with one file emptied: the chain still resolves (an emptied
    file adds nothing) or the error names a file of the chain with a line, never a traceback."""
    files = ["extends: tiny_kda\nseed: 1\n", "extends: a0.yaml\nseed: 2\n", "extends: a1.yaml\n"]
    files[emptied] = ""
    for i, text in enumerate(files):
        write(f"a{i}.yaml", text)
    r = cli("config", "validate", "a2.yaml")
    assert r.exit_code == 2, r.output
    if emptied == 2:  # the named file itself holds nothing
        assert "a2.yaml:1: the file is empty" in r.stdout + r.stderr, r.output
    else:  # a file it extends holds nothing: named, with the line that extends it
        said = f"a{emptied}.yaml:1: the file is empty (no keys); it is extended at a{emptied + 1}.yaml:"
        assert said in r.stdout + r.stderr, r.output


@pytest.mark.parametrize("key", ["no.such.key", "batch.nope", "model.kda.nope", "kernels.x.y"])
def test_a_set_of_a_key_that_exists_nowhere_names_the_set(cli, key):
    err = _error(cli, "config", "show", "tiny_kda", "--set", f"{key}=1")
    said = err.removeprefix("error: ")
    assert said.startswith(f"--set {key}: ") or said.startswith(f"--set: {key}:"), err
    assert "recipes/tiny_kda.yaml" not in err


TOP = ["data", "logging", "kernels", "model", "batch"]


def _nested(depth: int) -> str:
    return (
        "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth)) + "  " * (depth + 1) + "v: 1\n"
    )


@pytest.mark.parametrize("top", TOP)
@pytest.mark.parametrize("kind", ["block", "flow", "aliases"])
def test_a_limit_tripped_deep_inside_names_the_top_level_key(cli, write, top, kind):
    """Over-deep nesting (block or flow style) or an alias expansion past the value budget,
    under any top-level key: the error names that key at its own line (and where it tripped)."""
    head = "extends: tiny_kda\nseed: 3\n"
    if kind == "block":
        body = f"{top}:\n" + _nested(40)
    elif kind == "flow":
        body = f"{top}:\n  x: " + "[" * 40 + "1" + "]" * 40 + "\n"
    else:
        lines = ["  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
        body = f"{top}:\n" + "\n".join(lines) + "\n"
    write("r.yaml", head + body)
    err = _error(cli, "config", "validate", "r.yaml")
    assert f"r.yaml:3: {top}: " in err and "(at line " in err, err
