"""Two config inputs that crashed (issue 42, item 5), each as a family.

An ``extends`` chain of any length ends in one error naming its first file and line (a chain of
~1,000 files was a RecursionError, exit 1); a lone surrogate escape in any string of a recipe or a
``--set`` value (a key, a value, a list item, nested, through an alias) is exit 2 naming its line,
for every command that reads a config (validate said ok, then plan/show --json failed with exit 1).
"""

from __future__ import annotations

import json

import pytest

from zebractl.config.resolve import MAX_EXTENDS

COMMANDS = (("config", "validate"), ("plan",), ("config", "show", "--json"), ("plan", "--json"))


def _chain(write, n: int) -> str:
    """c0 extends tiny_kda, c{i} extends c{i-1}: returns the name of the last (n files)."""
    write("c0.yaml", "extends: tiny_kda\n")
    for i in range(1, n):
        write(f"c{i}.yaml", f"# link {i}\nextends: c{i - 1}.yaml\n")
    return f"c{n - 1}.yaml"


@pytest.mark.parametrize("n", [MAX_EXTENDS - 1, MAX_EXTENDS, 1000])
def test_an_extends_chain_of_any_length_is_read_or_refused_by_name(cli, write, n):
    top = _chain(write, n)
    r = cli("config", "validate", top)
    if n < MAX_EXTENDS:  # with tiny_kda itself: MAX_EXTENDS files
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2, r.output
    assert f"{top}:2: extends: the chain is longer than {MAX_EXTENDS} files" in r.stderr


RECIPES = {
    "value": 'extends: tiny_kda\ndescription: "a \\ud800 b"\n',
    "key": 'extends: tiny_kda\n"k\\udfff": 1\n',
    "list item": 'extends: tiny_kda\ndata:\n  paths:\n    - path: "d\\udc00"\n',
    "nested": 'extends: tiny_kda\nlogging:\n  wandb:\n    project: "p\\ud83d"\n',
    "alias": 'extends: tiny_kda\nx: &a "q\\udbff"\ndescription: *a\n',
    "preset": 'extends: tiny_kda\nmodel:\n  description: "m\\ud800"\n',
}
LINES = {"value": 2, "key": 2, "list item": 4, "nested": 4, "alias": 2, "preset": 3}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("where", sorted(RECIPES))
def test_a_lone_surrogate_anywhere_is_refused_at_its_line(cli, write, where, command):
    path = write("r.yaml", RECIPES[where])
    r = cli(*command, str(path.name))
    assert r.exit_code == 2, r.output
    assert f"r.yaml:{LINES[where]}: a lone surrogate escape" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ['"\\ud800"', '["ok", "\\udfff"]', '{a: "\\udc12"}'])
def test_a_lone_surrogate_in_a_set_value_is_refused_naming_the_set(cli, value):
    r = cli("config", "show", "tiny_kda", "--json", "--set", f"description={value}")
    assert r.exit_code == 2, r.output
    assert "--set description" in r.stderr and "lone surrogate" in r.stderr


def test_valid_escapes_still_load(cli, write):
    """A surrogate pair written as two escapes is one character: accepted and shown."""
    path = write("ok.yaml", 'extends: tiny_kda\ndescription: "smile \\ud83d\\ude00 and \\u00e9"\n')
    r = cli("config", "show", str(path.name), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["config"]["description"] == "smile \U0001f600 and \u00e9"
