"""Hugging Face folders (ours or FLA's) read into zebractl's names: what ``--init-from HF_FOLDER``,
``zebractl convert --import``, ``verify`` and ``eval`` share.

A folder is ``config.json`` plus safetensors weights (one file, or shards with an index). Our
exports embed the full model config (``zebractl_model``); FLA's are checked against the preset's
model key by key. Weights are renamed by the declarative tables of :mod:`zebractl.hf.mapping`.
Every problem with a folder is a :class:`~zebractl.errors.ConfigError` naming it (exit 2).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from zebractl.errors import ConfigError

Tensor = torch.Tensor


ZEBRACTL_KEY = "zebractl_model"
"""config.json key of our exports holding the full model config (so an import needs no preset)."""


FLA_CLASSES = {
    "kda": ("KDAConfig", "KDAForCausalLM"),
    "gdn": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM"),
}


def read_safetensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of an exported folder (single file or sharded with an index)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{index}: not a safetensors index ({exc})") from None
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ConfigError(f"{folder}: no model.safetensors (or index) here")
    out: dict[str, Tensor] = {}
    for f in files:
        try:
            out |= load_file(folder / f)
        except Exception as exc:  # noqa: BLE001 - a damaged file is the user's input
            raise ConfigError(f"{folder / f}: cannot be read as safetensors ({exc})") from None
    return out


def is_hf_folder(path: Path) -> bool:
    """A folder with ``config.json`` and safetensors weights."""
    p = Path(path)
    return (p / "config.json").is_file() and (
        (p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file()
    )


def read_config(folder: Path) -> dict[str, Any]:
    """A folder's ``config.json`` as a dict (exit 2 naming it when unreadable)."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return config


def folder_format(config: dict[str, Any]) -> str:
    """``zebra`` for a ``ZebraConfig`` folder, else ``fla``."""
    return "zebra" if config.get("model_type") == "zebra" else "fla"


def architecture(m: Any) -> str:
    """``kda`` / ``gdn`` for pure models, else the block kinds joined (``mla+kda``)."""
    from zebractl.hf import mapping

    try:
        return mapping.family(m)
    except mapping.MappingError:
        return "+".join(dict.fromkeys(m.blocks))


def model_differences(theirs: Any, ours: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys where an embedded model config differs from the model's."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        out = []
        for k in sorted(set(theirs) | set(ours)):
            out += model_differences(theirs.get(k), ours.get(k), f"{prefix}{k}.")
        return out
    return [] if theirs == ours else [f"{prefix[:-1]} is {theirs!r}, the model's is {ours!r}"]


FLA_FAMILIES = {"kda": "kda", "gated_deltanet": "gdn"}
"""FLA's ``model_type`` of each of its classes zebractl reads, and the mixer it is made of."""


def embedded_model(folder: Path, config: dict[str, Any]) -> Any:
    """The model config our exports embed in ``config.json`` (a ``ModelConfig``); None in a folder
    without one (FLA's own). A damaged one is exit 2 naming it."""
    from zebractl.schemas.preset import ModelConfig

    embedded = config.get(ZEBRACTL_KEY)
    if embedded is None:
        return None
    try:
        return ModelConfig.model_validate(embedded)
    except Exception as exc:  # noqa: BLE001 - a damaged embedded config is the user's input
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"{folder}/config.json: {ZEBRACTL_KEY} is not a valid model ({first})"
        ) from None


def fla_blocks(config: dict[str, Any]) -> list[str]:
    """The mixer of each layer of an FLA ``config.json``: its family's, ``attn`` where its hybrid
    attention layers are (``attn.layers``)."""
    family = FLA_FAMILIES.get(str(config.get("model_type")), str(config.get("model_type")))
    n = config.get("num_hidden_layers")
    attn = config.get("attn") if isinstance(config.get("attn"), dict) else {}
    layers = set(attn.get("layers") or [])
    return ["attn" if i in layers else family for i in range(n if isinstance(n, int) else 0)]


def fla_described(config: dict[str, Any]) -> str:
    """``an FLA KDA model (2 blocks: kda, kda; hidden 64)``."""
    from zebractl.config.models import blocks_text

    kind = str(config.get("model_type"))
    blocks = fla_blocks(config)
    cls = FLA_CLASSES.get(FLA_FAMILIES.get(kind, ""), (f"{kind!r}",))[0].removesuffix("Config")
    return (
        f"an FLA {cls} model ({len(blocks)} blocks: {blocks_text(blocks)}; hidden "
        f"{config.get('hidden_size')})"
    )


def check_fits(folder: Path, m: Any, preset: str | None = None, where: str = "") -> list[str]:
    """Refuse (exit 2) a folder whose model is not ``m`` (of ``preset``, when known; ``where``
    says whose model that is: `` of the recipe``), naming both models and every difference.
    Returns what the differences weights load across mean (the notes of
    :func:`zebractl.config.models.loading_notes`)."""
    from zebractl.config import models

    config = read_config(folder)
    theirs = embedded_model(folder, config)
    if theirs is not None:  # ours (either format): the model it was exported from
        diffs = models.differences(theirs, m)
        refused = models.blocking(diffs)
        if refused:
            raise ConfigError(
                models.mismatch(
                    str(folder), models.described(theirs), models.described(m, preset) + where,
                    refused,
                )
            )  # fmt: skip
        return models.loading_notes(str(folder), theirs, diffs)
    if folder_format(config) == "zebra":
        raise ConfigError(f"{folder} does not fit the model: config.json has no {ZEBRACTL_KEY}")
    _check_fla_fits(folder, config, m, models.described(m, preset) + where)
    return []


def _check_fla_fits(folder: Path, config: dict[str, Any], m: Any, wanted: str) -> None:
    """FLA's own folder (no embedded model): its layers' mixer first, then config.json key by key
    against the config FLA's class of ``m`` has."""
    from zebractl.config import models
    from zebractl.hf import mapping

    held = fla_described(config)
    layout = models.layout_differences(fla_blocks(config), list(m.blocks))
    if layout:
        raise ConfigError(models.mismatch(str(folder), held, wanted, layout))
    try:  # FLA's own checkpoints have the tokenizer's rows, ours keep the padding rows too
        expected = mapping.fla_config(m, config.get("vocab_size") == m.padded_vocab_size)
    except mapping.MappingError as exc:
        raise ConfigError(f"{folder}: {exc}") from None
    problems = config_problems(config, expected)
    if problems:
        raise ConfigError(
            f"{folder} holds {held}, which does not fit the model {wanted}: " + "; ".join(problems)
        )


def hf_model_config(folder: Path, preset: str | None = None) -> Any:
    """The model of an HF folder: the config our exports embed, else ``preset`` (checked)."""
    from zebractl.config.resolve import resolve_preset

    config = read_config(folder)
    if preset is not None:
        m = resolve_preset(preset).config
        check_fits(folder, m, preset, f" of --preset {preset}")
        return m
    m = embedded_model(folder, config)
    if m is None:
        raise ConfigError(
            f"{folder} was not exported by zebractl: name its architecture with --preset NAME "
            "(checked against the folder's config.json)"
        )
    check_fits(folder, m)
    return m


def load_hf_state(folder: Path, m: Any) -> dict[str, Tensor]:
    """An HF folder's weights by our names (padding rows of the vocabulary zero-filled)."""
    from zebractl.hf import mapping

    fmt = folder_format(read_config(Path(folder)))
    try:
        return mapping.from_hf(read_safetensors(Path(folder)), m, fmt)
    except mapping.MappingError as exc:
        raise ConfigError(f"{folder}: {exc}") from None


def config_problems(config: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """Where ``config.json`` differs from the keys the model expects (floats to 1e-12)."""
    out = []
    for k, v in expected.items():
        if k not in config:
            out.append(f"config.json has no {k}")
            continue
        got = config[k]
        same = (
            math.isclose(float(got), float(v), rel_tol=1e-12, abs_tol=0.0)
            if isinstance(v, float) and isinstance(got, int | float)
            else got == v
        )
        if not same:
            out.append(f"config.json {k} is {got!r}, the model's is {v!r}")
    return out


def state_for(model: Any, folder: Path, m: Any) -> dict[str, Tensor]:
    """``--init-from HF_FOLDER``: the folder's weights by our names (checked against the model
    first), in the built ``model``'s dtypes (bf16 on the megatron engine). Loading them is the
    caller's (:func:`zebractl.run.checkpoint.load_model_state` reports an unknown name)."""
    check_fits(folder, m)
    own = model.state_dict()
    return {k: v.to(own[k].dtype) if k in own else v for k, v in load_hf_state(folder, m).items()}
