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


def check_fits(folder: Path, m: Any) -> None:
    """Refuse (exit 2) a folder whose config is not this model's, naming every difference."""
    from zebractl.hf import mapping

    config = read_config(folder)
    if folder_format(config) == "zebra":
        embedded = config.get(ZEBRACTL_KEY)
        problems = (
            model_differences(embedded, m.model_dump(mode="json"))
            if isinstance(embedded, dict)
            else [f"config.json has no {ZEBRACTL_KEY}"]
        )
        if problems:
            raise ConfigError(f"{folder} does not fit the model: " + "; ".join(problems[:8]))
        return
    try:  # FLA's own checkpoints have the tokenizer's rows, ours keep the padding rows too
        expected = mapping.fla_config(m, config.get("vocab_size") == m.padded_vocab_size)
    except mapping.MappingError as exc:
        raise ConfigError(f"{folder}: {exc}") from None
    want = {"kda": "kda", "gdn": "gated_deltanet"}[mapping.family(m)]
    problems = (
        []
        if config.get("model_type") == want
        else [f"model_type is {config.get('model_type')!r}, this model needs {want!r}"]
    )
    problems += config_problems(config, expected)
    if problems:
        raise ConfigError(f"{folder} does not fit the model: " + "; ".join(problems))


def hf_model_config(folder: Path, preset: str | None = None) -> Any:
    """The model of an HF folder: the config our exports embed, else ``preset`` (checked)."""
    from zebractl.config.resolve import resolve_preset
    from zebractl.schemas.preset import ModelConfig

    config = read_config(folder)
    if preset is not None:
        m = resolve_preset(preset).config
    elif isinstance(config.get(ZEBRACTL_KEY), dict):
        try:
            m = ModelConfig.model_validate(config[ZEBRACTL_KEY])
        except Exception as exc:  # noqa: BLE001 - a damaged embedded config is the user's input
            raise ConfigError(
                f"{folder}/config.json: {ZEBRACTL_KEY} is not a valid model ({exc})"
            ) from None
    else:
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
