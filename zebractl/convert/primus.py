"""Import a Primus / Megatron-LM checkpoint (TP = PP = 1, torch format) through a declarative table.

Primus trains the same Zebra layout zebractl does (the mixers' fused ``in_proj``, megatron's MLA and
MLP), so most names are ours; what differs is listed here once (the reference: primus.md §5):

- Transformer Engine specs fuse a sublayer's pre-norm into its first linear
  (``mixer.in_proj.layer_norm_weight``, ``mlp.linear_fc1.layer_norm_weight``, MLA's
  ``linear_q_down_proj.layer_norm_weight`` / ``linear_kv_down_proj.layer_norm_weight`` for the input
  norm and ``linear_q_up_proj`` / ``linear_kv_up_proj`` ``.layer_norm_weight`` for MLA's LoRA norms);
  the no-TE specs name them as zebractl does. Either is accepted; where TE holds one norm twice
  (MLA's input norm) both copies must agree.
- KDA's ``A_log`` is ``[1, 1, H, 1]`` in Primus, ``[H]`` here.
- ``*._extra_state`` (TE's FP8 metadata) carries no weights and is skipped.
- Primus' no-TE Mamba2 layers have no pre-norm, zebractl's Mamba2 sublayer has one: such a
  checkpoint is refused (a ones-filled norm would still normalise, so the model would differ).

The file is ``ITER/mp_rank_00/model_optim_rng.pt`` (``torch.save`` of ``{"model": state_dict, ...}``).
It is read with an unpickler that builds torch tensors and plain containers only: anything else in
the pickle (megatron's ``args``, enums) becomes an inert placeholder, so a checkpoint cannot run code
here. Each of its tensors is consumed exactly once; anything unmapped is an error naming it.
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zebractl.errors import ConfigError
from zebractl.hf.mapping import MappingError
from zebractl.layout.mamba2 import MAMBA2_MIXER_TENSORS
from zebractl.schemas.preset import ModelConfig
from zebractl.schemas.reports import ConvertReport

Tensor = torch.Tensor

FILE = "model_optim_rng.pt"
"""megatron's torch-format checkpoint file, in ``mp_rank_00/``."""


@dataclass(frozen=True)
class Take:
    """Our tensor ``ours`` from the first of ``theirs`` present (all present ones are consumed and
    must be equal), reshaped to our shape when ``reshape``."""

    ours: str
    theirs: tuple[str, ...]
    reshape: bool = False


def _same(name: str) -> tuple[str, ...]:
    return (name,)


_L = "decoder.layers.{s}."
_MX = _L + "mixer."
_SA = _L + "self_attention."

DELTA_RULE: tuple[Take, ...] = (
    Take(_L + "norm.weight", (_L + "norm.weight", _MX + "in_proj.layer_norm_weight")),
    *(
        Take(_MX + n, _same(_MX + n))
        for n in (
            "in_proj.weight",
            "conv1d.weight",
            "dt_bias",
            "out_norm.weight",
            "out_proj.weight",
        )
    ),
    Take(_MX + "A_log", _same(_MX + "A_log"), reshape=True),
)
KDA_ONLY: tuple[Take, ...] = tuple(
    Take(_MX + n, _same(_MX + n)) for n in ("f_b_proj.weight", "g_b_proj.weight", "g_b_proj.bias")
)
MAMBA2: tuple[Take, ...] = (
    Take(_L + "norm.weight", (_L + "norm.weight", _MX + "in_proj.layer_norm_weight")),
    *(Take(_MX + n, _same(_MX + n)) for n in MAMBA2_MIXER_TENSORS),
)
MLA: tuple[Take, ...] = (
    Take(
        _L + "input_layernorm.weight",
        (
            _L + "input_layernorm.weight",
            _SA + "linear_q_down_proj.layer_norm_weight",
            _SA + "linear_kv_down_proj.layer_norm_weight",
            _SA + "linear_q_proj.layer_norm_weight",
        ),
    ),
    Take(
        _SA + "q_layernorm.weight",
        (_SA + "q_layernorm.weight", _SA + "linear_q_up_proj.layer_norm_weight"),
    ),
    Take(
        _SA + "kv_layernorm.weight",
        (_SA + "kv_layernorm.weight", _SA + "linear_kv_up_proj.layer_norm_weight"),
    ),
    *(
        Take(_SA + n, _same(_SA + n))
        for n in (
            "linear_q_down_proj.weight",
            "linear_q_up_proj.weight",
            "linear_q_proj.weight",
            "linear_kv_down_proj.weight",
            "linear_kv_up_proj.weight",
            "linear_proj.weight",
        )
    ),
)
MLP: tuple[Take, ...] = (
    Take(
        _L + "pre_mlp_layernorm.weight",
        (_L + "pre_mlp_layernorm.weight", _L + "mlp.linear_fc1.layer_norm_weight"),
    ),
    Take(_L + "mlp.linear_fc1.weight", _same(_L + "mlp.linear_fc1.weight")),
    Take(_L + "mlp.linear_fc2.weight", _same(_L + "mlp.linear_fc2.weight")),
)
GLOBAL: tuple[Take, ...] = (
    Take("embedding.word_embeddings.weight", _same("embedding.word_embeddings.weight")),
    Take("decoder.final_norm.weight", _same("decoder.final_norm.weight")),
)
UNTIED: tuple[Take, ...] = (Take("output_layer.weight", _same("output_layer.weight")),)
VOCAB = {"embedding.word_embeddings.weight", "output_layer.weight"}

TABLES: dict[str, tuple[Take, ...]] = {
    "kda": DELTA_RULE + KDA_ONLY,
    "gdn": DELTA_RULE,
    "mamba2": MAMBA2,
    "mla": MLA,
    "mlp": MLP,
}


def _entries(ours: dict[str, Tensor], m: ModelConfig) -> list[Take]:
    out = list(GLOBAL) + ([] if m.tie_embeddings else list(UNTIED))
    for s, kind in enumerate(m.sublayers):
        out += [
            Take(t.ours.format(s=s), tuple(n.format(s=s) for n in t.theirs), t.reshape)
            for t in TABLES[kind]
        ]
    return [t for t in out if t.ours in ours]  # options this model does not have (q_lora, conv)


def from_primus(sd: dict[str, Tensor], template: dict[str, Tensor], m: ModelConfig) -> dict:
    """Primus state dict -> ours, shaped like ``template`` (our model's state dict)."""
    sd = {k: v for k, v in sd.items() if not k.endswith("_extra_state") and v is not None}
    entries = _entries(template, m)
    theirs = [n for t in entries for n in t.theirs]
    ours = [t.ours for t in entries]
    doubled = sorted({n for side in (theirs, ours) for n in side if side.count(n) > 1})
    if doubled:
        raise MappingError(f"doubly mapped tensors in the Primus table: {doubled}")
    used: set[str] = set()
    out: dict[str, Tensor] = {}
    problems: list[str] = []
    for t in entries:
        present = [n for n in t.theirs if n in sd]
        if not present:
            problems.append(
                f"missing {t.theirs[0]}" + (" (or a TE name)" if len(t.theirs) > 1 else "")
            )
            continue
        first = sd[present[0]]
        for n in present[1:]:
            if not torch.equal(sd[n], first):
                problems.append(f"{n} differs from {present[0]} (the same norm held twice)")
        used.update(present)
        want = template[t.ours].shape
        x = first.reshape(want) if t.reshape and first.numel() == want.numel() else first
        if t.ours in VOCAB and x.shape[1:] == want[1:] and x.shape[0] < want[0]:
            x = torch.cat([x, x.new_zeros(want[0] - x.shape[0], *x.shape[1:])])  # padding rows
        if x.shape != want:
            problems.append(
                f"{present[0]}: shape {list(first.shape)}, the model needs {list(want)}"
            )
            continue
        out[t.ours] = x
    extra = sorted(set(sd) - used)
    if extra:
        problems.append(f"Primus tensors not covered by the table: {extra[:12]}")
    if problems:
        raise MappingError("; ".join(problems[:12]))
    return out


# ---- reading the file without running its pickle ------------------------------------------------


class _Inert:
    """Stands in for any object of a checkpoint's pickle that is not a tensor or a container."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()


_TORCH_REBUILD = {"torch._utils", "torch._tensor", "torch.storage"}


def _allowed(module: str, name: str) -> bool:
    """What a tensor's pickle needs: torch's rebuild functions, storages, dtypes, sizes, devices and
    ordered dicts; nothing that can import or run anything else."""
    if (module, name) == ("collections", "OrderedDict"):
        return True
    if module in _TORCH_REBUILD:
        return name.startswith("_rebuild") or name == "_load_from_bytes"
    if module == "torch":
        return (
            name.endswith("Storage")
            or name in ("Size", "device", "dtype")
            or isinstance(getattr(torch, name, None), torch.dtype)
        )
    return False


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(module, name) if _allowed(module, name) else _Inert


_SAFE_PICKLE = types.SimpleNamespace(
    Unpickler=_Unpickler, load=lambda f, **kw: _Unpickler(f, **kw).load(), __name__="safe"
)


def find_file(path: Path) -> Path | None:
    """The ``model_optim_rng.pt`` of a Primus checkpoint: ``path`` itself, ``ITER/mp_rank_00/``,
    or the newest iteration of a save directory (``latest_checkpointed_iteration.txt``)."""
    path = Path(path)
    if path.is_file() and path.name == FILE:
        return path
    if (path / "mp_rank_00" / FILE).is_file():
        return path / "mp_rank_00" / FILE
    if (path / FILE).is_file():
        return path / FILE
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        text = latest.read_text().strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else ""
        if name and (path / name / "mp_rank_00" / FILE).is_file():
            return path / name / "mp_rank_00" / FILE
    return None


def read_state(file: Path) -> dict[str, Tensor]:
    """The ``model`` state dict of a torch-format megatron checkpoint (tensors only)."""
    mp = Path(file).parent
    if (
        mp.name.startswith("mp_rank_")
        and mp.name != "mp_rank_00"
        or any(p.name != "mp_rank_00" for p in mp.parent.glob("mp_rank_*"))
    ):
        raise ConfigError(
            f"{file}: tensor or pipeline parallel shards ({sorted(p.name for p in mp.parent.glob('mp_rank_*'))}); "
            "zebractl imports TP = PP = 1 Primus checkpoints only"
        )
    try:
        obj = torch.load(file, map_location="cpu", pickle_module=_SAFE_PICKLE, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's input
        raise ConfigError(f"{file}: cannot be read as a megatron checkpoint ({exc})") from None
    model = obj.get("model") if isinstance(obj, dict) else None
    if model is None and isinstance(obj, dict) and "model0" in obj:
        raise ConfigError(f"{file}: a virtual-pipeline checkpoint (model0, ...); not supported")
    if not isinstance(model, dict) or not model:
        raise ConfigError(f"{file}: holds no 'model' state dict")
    return {k: v for k, v in model.items() if isinstance(v, Tensor)}


def import_primus(
    path: Path,
    output: Path,
    *,
    preset: str | None,
    console: Callable[[str], None] = print,
) -> ConvertReport:
    """Write a Primus checkpoint (``path``: see :func:`find_file`) as a zebractl checkpoint folder
    ``OUTPUT/iter_0000000`` for ``train --init-from``; ``preset`` names its architecture. Returns
    the report of :func:`zebractl.convert.hf.write_weights`."""
    import time

    from zebractl.config.resolve import resolve_preset
    from zebractl.convert.hf import write_weights
    from zebractl.model.model import build_model
    from zebractl.runtime import dist

    t0 = time.perf_counter()
    file = find_file(path)
    assert file is not None
    if preset is None:
        raise ConfigError(
            f"{path} is a Primus/Megatron-LM checkpoint: name its architecture with --preset NAME "
            "(every tensor is checked against it)"
        )
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"{output}: exists and is not an empty folder; choose a new output")
    m = resolve_preset(preset).config
    sd = read_state(file)
    if "mamba2" in m.sublayers and not any(
        k.endswith(("mixer.in_proj.layer_norm_weight", ".norm.weight")) and ".mixer.norm" not in k
        for k in sd
        if ".layers." in k
    ):
        raise ConfigError(
            f"{file}: Primus' no-TE Mamba2 layers have no pre-norm and zebractl's Mamba2 sublayer "
            "has one; the model would differ, so this checkpoint is not imported"
        )
    console(f"reading {file} ({len(sd)} tensors) as {preset}")
    with dist.scoped():  # the shapes and dtypes of our tensors, nothing allocated
        meta = build_model(m, kernels=None, device="meta").state_dict()
    template = {k: v for k, v in meta.items() if not k.endswith("_extra_state")}
    try:
        ours = from_primus(sd, template, m)
    except MappingError as exc:
        raise ConfigError(f"{file} does not fit {preset}: {exc}") from None
    return write_weights(m, ours, output, t0)
