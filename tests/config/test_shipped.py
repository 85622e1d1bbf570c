"""Every shipped preset and recipe is a test case."""

from __future__ import annotations

from pathlib import Path

import pytest

from zebractl.config import catalog
from zebractl.config.resolve import resolve_preset, resolve_recipe
from zebractl.schemas.preset import ModelConfig
from zebractl.schemas.recipe import RunConfig

PRESETS = sorted(catalog.shipped("preset"))
RECIPES = sorted(catalog.shipped("recipe"))
SEED_PRESETS = [
    "kda_300M",
    "kda_1B",
    "gdn_300M",
    "gdn_1B",
    "zebra_mamba_300M_hybrid",
    "zebra_mamba_1B_hybrid",
    "zebra_mamba_3B_hybrid",
    "zebra_mamba_8B_hybrid",
    "zebra_gdn_300M_hybrid",
    "zebra_gdn_1B_hybrid",
    "zebra_kda_1B_hybrid",
]
TINY = ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"]


def test_catalog_is_complete():
    assert set(SEED_PRESETS + TINY) <= set(PRESETS)
    assert {"kda_300M", "gdn_300M", "kda_1B", "gdn_1B", *TINY} <= set(RECIPES)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_resolves(name):
    r = resolve_preset(name)
    m = r.config
    assert isinstance(m, ModelConfig) and m.description
    assert len(m.blocks) == m.num_blocks and len(m.sublayers) == 2 * m.num_blocks


@pytest.mark.parametrize("name", SEED_PRESETS)
def test_seed_presets_are_clean(name):
    """RMSNorm 1e-6, no dropout, no linear biases, tied, unscaled init, and every one of these
    values written in a file (never a schema default)."""
    r = resolve_preset(name)
    m = r.config
    assert m.norm.type == "rmsnorm" and m.norm.eps == 1e-6
    assert m.dropout.hidden == 0.0 and m.dropout.attention == 0.0
    assert not m.linear_bias and m.tie_embeddings and not m.init_scaled_output
    for key in (
        "norm.type",
        "norm.eps",
        "dropout.hidden",
        "dropout.attention",
        "linear_bias",
        "tie_embeddings",
        "init_std",
        "init_scaled_output",
    ):
        assert r.provenance[key] != "default", key


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_resolves(name):
    r = resolve_recipe(name)
    assert isinstance(r.config, RunConfig) and r.config.description
    assert r.derived is not None and r.derived.iterations > 0


@pytest.mark.parametrize(
    "path",
    sorted((catalog.data_root() / "presets").glob("*.yaml"))
    + sorted((catalog.data_root() / "recipes").glob("*.yaml")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_yaml_starts_with_schema_line(path: Path):
    kind = "preset" if path.parent.name == "presets" else "recipe"
    first = path.read_text().splitlines()[0]
    assert first == f"# yaml-language-server: $schema=../schemas/{kind}.schema.json"


def test_kda_300M_recipe_is_the_seed_parity_recipe():
    cfg = resolve_recipe("kda_300M").run
    s, o = cfg.schedule, cfg.optimizer
    assert (s.iterations, s.lr, s.min_lr, s.warmup_iterations, s.decay_style) == (
        4768,
        2e-4,
        2e-5,
        200,
        "cosine",
    )
    assert (cfg.batch.global_, cfg.data.seq_length, cfg.seed, cfg.precision) == (
        1024,
        2048,
        42,
        "bf16",
    )
    assert (o.beta1, o.beta2, o.weight_decay, o.clip_grad) == (0.9, 0.95, 0.01, 1.0)


def test_every_schema_field_is_documented():
    from pydantic import BaseModel

    from zebractl.schemas import preset, recipe

    for module in (preset, recipe):
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseModel)
                and obj.__module__ == module.__name__
            ):
                for name, field in obj.model_fields.items():
                    assert field.description, f"{obj.__name__}.{name} has no docstring"
