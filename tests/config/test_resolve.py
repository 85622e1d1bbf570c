"""Merge order, inheritance and provenance."""

from __future__ import annotations

import json

import pytest

from zebractl.config.resolve import resolve_preset, resolve_recipe
from zebractl.errors import ConfigError
from zebractl.run.resolve import resolve_any

BODY = """
data:
  paths: [{path: d}]
  seq_length: 128
  tokenizer: tok
batch: {micro: 2, global: 4}
schedule: {lr: 1.0e-3, iterations: 10}
"""


def test_merge_order_default_preset_recipe_set(write):
    write(
        "base.yaml",
        """
        extends: tiny_kda
        hidden_size: 96
        norm: {eps: 1.0e-5}
    """,
    )
    write("child.yaml", "extends: base.yaml\nffn_hidden_size: 256\n")
    write("r.yaml", "preset: child.yaml\nmodel:\n  norm:\n    eps: 1.0e-4\n" + BODY)
    r = resolve_recipe(
        __import__("pathlib").Path("r.yaml"), ["schedule.lr=5e-4", "model.hidden_size=128"]
    )
    cfg, prov = r.run, r.provenance
    # default
    assert cfg.optimizer.beta2 == 0.999 and prov["optimizer.beta2"] == "default"
    # preset chain: shipped tiny_kda < base.yaml < child.yaml
    assert cfg.model.vocab_size == 50257 and prov["model.vocab_size"].startswith("presets/tiny_kda")
    assert cfg.model.ffn_hidden_size == 256 and prov["model.ffn_hidden_size"] == "child.yaml:2"
    # recipe beats preset
    assert cfg.model.norm.eps == 1e-4 and prov["model.norm.eps"] == "r.yaml:4"
    # --set beats everything
    assert cfg.schedule.lr == 5e-4 and prov["schedule.lr"] == "--set"
    assert cfg.model.hidden_size == 128 and prov["model.hidden_size"] == "--set"
    assert prov["batch.micro"] == "r.yaml:10"


def test_null_removes_an_inherited_section(write):
    write(
        "p.yaml",
        """
        extends: tiny_hybrid
        layout: {mixer: kda, hybrid_attention_ratio: 0.0}
        mla: null
    """,
    )
    r = resolve_preset(__import__("pathlib").Path("p.yaml"))
    assert r.config.mla is None and r.provenance["mla"] == "p.yaml:3"
    assert r.config.blocks == ["kda"] * 4


def test_recipe_extends_recipe(write):
    write("r.yaml", "extends: tiny_gdn\nseed: 7\n")
    r = resolve_any("r.yaml")
    assert r.kind == "recipe" and r.run.seed == 7 and r.provenance["seed"] == "r.yaml:2"
    assert r.run.preset == "tiny_gdn" and r.provenance["preset"].startswith(
        "recipes/tiny_gdn.yaml:"
    )


def test_preset_path_resolves_next_to_the_recipe(write, tmp_path, monkeypatch):
    write("sub/p.yaml", "extends: tiny_kda\n")
    write("sub/r.yaml", "preset: p.yaml\n" + BODY)
    monkeypatch.chdir(tmp_path / "sub" / "..")
    assert resolve_any("sub/r.yaml").run.model.hidden_size == 64


def test_set_can_switch_the_preset():
    r = resolve_recipe("tiny_kda", ["preset=tiny_gdn"])
    assert r.run.model.gdn is not None and r.provenance["preset"] == "--set"


def test_every_leaf_has_provenance():
    r = resolve_recipe("kda_300M")
    values = r.values()

    def leaves(v, p=""):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from leaves(x, f"{p}{k}.")
        else:
            yield p.rstrip(".")

    assert set(leaves(values)) == set(r.provenance)


def test_config_show_json_kda_300M_eps_and_dropout_come_from_files(cli):
    result = cli("config", "show", "recipes/kda_300M.yaml", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1 and set(doc) >= {"config", "provenance"}
    model, prov = doc["config"]["model"], doc["provenance"]
    assert model["norm"]["eps"] == 1e-6
    assert model["dropout"] == {"hidden": 0.0, "attention": 0.0}
    for key in ("model.norm.eps", "model.dropout.hidden", "model.dropout.attention"):
        assert prov[key].startswith("presets/kda_300M.yaml:"), (key, prov[key])
        assert int(prov[key].rsplit(":", 1)[1]) > 0
    assert prov["schedule.lr"].startswith("recipes/kda_300M.yaml:")
    assert doc["config"]["batch"] == {"micro": 128, "global": 1024}


def test_config_show_set_is_recorded(cli):
    result = cli("config", "show", "kda_300M", "--set", "model.norm.eps=1e-5", "--json")
    doc = json.loads(result.stdout)
    assert doc["config"]["model"]["norm"]["eps"] == 1e-5
    assert doc["provenance"]["model.norm.eps"] == "--set"


def test_config_show_table_has_sources(cli):
    result = cli("config", "show", "tiny_kda")
    assert result.exit_code == 0
    assert "recipes/tiny_kda.yaml:" in result.stdout and "default" in result.stdout
    assert "merge order: schema default < preset < recipe < --set" in result.stdout


def test_resolve_any_prefers_recipes_for_shared_names():
    assert resolve_any("kda_300M").kind == "recipe"
    assert resolve_preset("kda_300M").kind == "preset"


def test_plan_on_a_preset_says_it_is_not_a_recipe(cli):
    result = cli("plan", "presets/tiny_kda.yaml")
    assert result.exit_code == 2
    assert "preset: required key is missing" in result.stderr


def test_config_errors_collect_all_problems(write):
    write(
        "p.yaml",
        """
        extends: tiny_kda
        hidden_size: -1
        norm: {eps: 0}
    """,
    )
    with pytest.raises(ConfigError) as info:
        resolve_preset(__import__("pathlib").Path("p.yaml"))
    assert len(info.value.problems) == 2
