"""`zebractl presets` and `zebractl recipes`: what ships, with the numbers the listings show (a
preset's exact parameter count from :mod:`zebractl.layout`, a recipe's derived tokens)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zebractl.schemas.reports import PresetsReport, RecipesReport


def presets() -> PresetsReport:
    """Every shipped preset: size and layout."""
    from zebractl.config import catalog
    from zebractl.config.resolve import resolve_preset
    from zebractl.layout import model_shapes, numel
    from zebractl.schemas.reports import PresetEntry, PresetsReport

    items: list[PresetEntry] = []
    for name, path in catalog.shipped("preset").items():
        m = resolve_preset(path).config
        items.append(
            PresetEntry(
                name=name,
                description=m.description,
                parameters=numel(model_shapes(m)),  # type: ignore[arg-type]
                num_blocks=m.num_blocks,  # type: ignore[union-attr]
                hidden_size=m.hidden_size,  # type: ignore[union-attr]
                mixers=sorted(set(m.blocks)),  # type: ignore[union-attr]
                path=catalog.display_path(path),
            )
        )
    return PresetsReport(presets=items)


def recipes() -> RecipesReport:
    """Every shipped recipe: preset, GPUs, batch, length, tokens."""
    from zebractl.config import catalog
    from zebractl.config.resolve import resolve_recipe
    from zebractl.schemas.reports import RecipeEntry, RecipesReport

    items: list[RecipeEntry] = []
    for name, path in catalog.shipped("recipe").items():
        r = resolve_recipe(path)
        cfg, d = r.run, r.derived
        assert d is not None
        items.append(
            RecipeEntry(
                name=name,
                description=cfg.description,
                preset=cfg.preset,
                num_gpus=cfg.parallelism.num_gpus,
                micro_batch=cfg.batch.micro,
                global_batch=cfg.batch.global_,
                seq_length=cfg.data.seq_length,
                iterations=d.iterations,
                total_tokens=d.total_tokens,
                path=catalog.display_path(path),
            )
        )
    return RecipesReport(recipes=items)
