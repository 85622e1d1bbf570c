"""Hostile configs: every malformed or adversarial preset, recipe or ``--set`` value is exit 2 with a
message naming the file (and line) — never a traceback, a crash later on, or a hang.

Cases are generated per class where that is natural: every numeric field of the schemas gets
non-finite and out-of-range values, every inheritance look-alike key is tried, and random YAML-ish text
is thrown at the loader (hypothesis).
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from zebractl.config.resolve import _INHERIT_LOOKALIKES, resolve_recipe
from zebractl.config.yamlio import MAX_BYTES, MAX_DEPTH, MAX_NODES
from zebractl.errors import ConfigError
from zebractl.schemas.recipe import RunConfig

REPO = Path(__file__).resolve().parents[2]


def _numeric_leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type]]:
    """(dotted key, int or float) of every numeric field of a schema; list[float] items too."""
    out: list[tuple[str, type]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        ann = field.annotation
        args = (
            typing.get_args(ann)
            if typing.get_origin(ann) in (typing.Union, types.UnionType)
            else (ann,)
        )
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _numeric_leaves(arg, key + ".")
            elif arg in (int, float):
                out.append((key, arg))
            elif typing.get_origin(arg) is list:
                inner = typing.get_args(arg)[0]
                if typing.get_origin(inner) is typing.Annotated:
                    inner = typing.get_args(inner)[0]
                if inner in (int, float):
                    out.append((key + "[]", inner))
    return out


NUMERIC = _numeric_leaves(RunConfig)


def _base(key: str) -> str:
    """A tiny recipe that has the section ``key`` lives in."""
    for section, recipe in (
        ("model.mamba2", "tiny_mamba"),
        ("model.mla", "tiny_hybrid"),
        ("model.gdn", "tiny_gdn"),
    ):
        if key.startswith(section):
            return recipe
    return "tiny_kda"


def _problems(recipe: str, sets: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_recipe(recipe, ["data.paths=[{path: /data}]", *sets])
    return "\n".join(info.value.problems)


def test_every_numeric_field_is_found():
    keys = {k for k, _ in NUMERIC}
    assert {"schedule.lr", "model.norm.eps", "seed", "model.num_blocks", "data.split[]"} <= keys
    assert len(keys) > 60


@pytest.mark.parametrize(("key", "kind"), NUMERIC, ids=[k for k, _ in NUMERIC])
def test_non_finite_and_out_of_range_values_name_the_key(key, kind):
    recipe = _base(key)
    if key.endswith("[]"):
        key = key[:-2]
        for bad in (".nan", ".inf", "-.inf"):
            assert f"{key}.0: must be a finite number" in _problems(
                recipe, [f"{key}=[{bad}, 1, 0]"]
            )
        return
    values = ["1" + "0" * 400, str(2**64), str(-(2**64))]
    if kind is float:
        values += [".inf", "-.inf", ".nan", "1.0e309"]
    for bad in values:
        text = _problems(recipe, [f"{key}={bad}"])
        assert f"--set: {key}: must be" in text or f"--set: {key}: expected a number" in text, (
            bad,
            text,
        )


def _unbounded(node, where: str, found: list[str]) -> list[str]:
    """JSON-Schema paths of numbers without both a lower and an upper bound."""
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            low = "minimum" in node or "exclusiveMinimum" in node
            high = "maximum" in node or "exclusiveMaximum" in node
            if not (low and high):
                found.append(where)
        for k, v in node.items():
            _unbounded(v, f"{where}/{k}", found)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _unbounded(v, f"{where}/{i}", found)
    return found


def test_every_numeric_field_has_bounds_in_the_exported_schema():
    for name in ("recipe", "preset"):
        schema = json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())
        assert not _unbounded(schema, name, [])


@pytest.mark.parametrize("key", sorted(_INHERIT_LOOKALIKES))
def test_an_inheritance_look_alike_without_a_preset_names_the_key(write, key):
    write("r.yaml", f"{key}: tiny_kda\nschedule:\n  lr: 1.0e-3\n")
    text = _problems(str(Path("r.yaml").resolve()), [])
    assert f"r.yaml:1: unknown key '{key}'" in text and "'extends: tiny_kda'" in text, text
    assert "'preset: tiny_kda'" in text


def test_yaml_1_1_integer_readings_are_gone(cli, write):
    write("r.yaml", "extends: tiny_kda\nschedule:\n  iterations: 010\n")
    r = cli("plan", "r.yaml", "--json", "--set", "data.paths=[{path: d}]")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"]["iterations"] == 10  # decimal, not octal 8
    r = cli("plan", "tiny_kda", "--json", "--set", "batch.micro=008", "--set", "batch.global=016")
    assert r.exit_code == 0 and json.loads(r.stdout)["batch"]["micro"] == 8, r.output
    for text in ("1:00", "0b101", "1_000", "2024-01-01"):
        write("s.yaml", f"extends: tiny_kda\nschedule:\n  iterations: {text}\n")
        r = cli("config", "validate", "s.yaml")
        assert (
            r.exit_code == 2
            and f"s.yaml:3: schedule.iterations: expected an integer, got '{text}'" in r.stderr
        ), (text, r.stderr)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "alias-bomb",
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
                for p, c in zip("abcdef", "bcdefg", strict=True)
            ),
            f"expands to more than {MAX_NODES:,} values",
        ),
        (
            "recursive-alias",
            "preset: tiny_kda\na: &a [1, *a]\n",
            "an alias refers to a value that contains it",
        ),
        ("deep-flow", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
        (
            "deep-block",
            "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5))
            + "  " * (MAX_DEPTH + 5)
            + "x: 1\n",
            f"more than {MAX_DEPTH} levels",
        ),
        ("nul-byte", "preset: tiny_kda\x00\n", ":1:17: control character U+0000"),
        ("escape-char", "preset: tiny\x1bkda\n", ":1:13: control character U+001B"),
        (
            "delete-char",
            "description: a\x7f\npreset: tiny_kda\n",
            ":1:15: control character U+007F",
        ),
        ("not-utf8", "description: caf\xe9\n", "not UTF-8"),
        ("empty", "", "r.yaml:1: the file is empty"),
        ("only-comment", "# nothing here\n", "r.yaml:1: the file is empty"),
        ("a-list", "- preset: tiny_kda\n", "must be a mapping"),
        ("null-section", "extends: tiny_kda\ndata: null\n", "r.yaml:2: data: expected a mapping"),
        ("null-model", "extends: tiny_kda\nmodel: null\n", "r.yaml:2: model: expected a mapping"),
        (
            "list-item-line",
            "extends: tiny_kda\ndata:\n  paths:\n    - path: a\n    - path: b\n      weight: -1\n",
            "r.yaml:6: data.paths.1.weight: must be > 0",
        ),
    ],
)
def test_hostile_files_are_exit_2_naming_the_file(cli, tmp_path, monkeypatch, name, text, expected):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_bytes(text.encode("latin-1") if name == "not-utf8" else text.encode("utf-8"))
    for argv in (
        ["config", "validate", "r.yaml"],
        ["plan", "r.yaml"],
        ["config", "show", "r.yaml", "--json"],
    ):
        r = cli(*argv)
        assert r.exit_code == 2, (name, argv, r.output)
        assert "r.yaml" in r.stderr and expected in r.stderr, (name, argv, r.stderr)
        assert "Traceback" not in r.output


def test_a_huge_file_is_refused_before_parsing(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text("description: " + "x" * (MAX_BYTES + 10) + "\n")
    r = cli("config", "validate", "r.yaml")
    assert r.exit_code == 2 and "larger than 1 MiB" in r.stderr, r.stderr


def test_names_longer_than_the_file_system_allows(cli, tmp_path, monkeypatch, write):
    monkeypatch.chdir(tmp_path)
    long = "a" * 300
    for argv in (["plan", f"{long}.yaml"], ["config", "show", f"{long}.yaml"], ["plan", long]):
        r = cli(*argv)
        assert r.exit_code == 2 and "Traceback" not in r.output, (argv, r.output)
    write("r.yaml", f"extends: {long}.yaml\n")
    r = cli("config", "validate", "r.yaml")
    assert r.exit_code == 2 and "r.yaml:1: extends:" in r.stderr, r.stderr
    r = cli("plan", "tiny_kda", "--set", f"preset={long}/x.yaml")
    assert r.exit_code == 2 and "preset" in r.stderr, r.stderr


def test_set_values_get_the_same_guarantees(cli):
    r = cli("plan", "tiny_kda", "--set", "schedule.lr=1e-3\x00")
    assert r.exit_code == 2 and "control character U+0000" in r.stderr, r.stderr
    r = cli("plan", "tiny_kda", "--set", "schedule.lr=&a [*a]")
    assert r.exit_code == 2 and "--set schedule.lr: an alias refers" in r.stderr, r.stderr


def test_config_show_json_is_always_json(cli):
    for name in ("tiny_kda", "kda_300M", "zebra_mamba_8B_hybrid"):
        r = cli("config", "show", name, "--json")
        assert r.exit_code == 0
        json.loads(r.stdout, parse_constant=lambda c, n=name: pytest.fail(f"{n}: {c} in JSON"))


_PIECES = st.sampled_from(
    [
        "preset",
        "extends",
        "model",
        "schedule",
        "lr",
        "num_blocks",
        ":",
        " ",
        "\n",
        "  ",
        "- ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&a",
        "*a",
        "!!python/object",
        "'",
        '"',
        "#",
        "1e999",
        "-1",
        "010",
        ".nan",
        "null",
        "tiny_kda",
        "0x",
        "\t",
        "---",
        "...",
        "?",
        "|",
        ">",
        "%YAML 1.1",
        "\\u0000",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_random_yaml_never_escapes_as_a_crash(cli, tmp_path_factory, text):
    """Whatever the text, `config validate` answers 0 or 2, with a message and no traceback."""
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_text(text, encoding="utf-8")
    r = cli("config", "validate", str(path))
    assert r.exit_code in (0, 2), (text, r.output)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert str(path.name) in r.stderr, (text, r.stderr)
