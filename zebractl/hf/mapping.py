"""Declarative weight mapping between zebractl's (Megatron/Primus) layout and FLA's HF classes.

Each recurrent mixer's entries are declared with its layout (``MixerSpec.entries`` in
:mod:`zebractl.layout.kda`, ``.gdn``, ``.mamba2``; the entry types in :mod:`zebractl.layout.common`),
MLA's, the MLP's and the global ones here; one strict engine for both directions. Names use ``{mixer}`` for
our mixer sublayer index (2i), ``{mlp}`` for our MLP sublayer (2i + 1) and ``{i}`` for FLA's block i.
Each source tensor is consumed exactly once and each target produced exactly once; anything else is an
error listing the offenders. Embedding rows beyond the tokenizer vocabulary (padding) are dropped on
export and zero-filled on import.

Two targets (``fmt``): ``fla``, FLA's classes ``KDAForCausalLM`` (pure KDA) and
``GatedDeltaNetForCausalLM`` (pure GDN); ``zebra``, :mod:`zebractl.hf`'s ``ZebraForCausalLM`` for
every layout: block i is ``model.layers.{i}`` with ``attn_norm`` / ``attn`` (the mixer or the MLA) /
``mlp_norm`` / ``mlp``; KDA and GDN blocks have FLA's names (the same tables), Mamba2 blocks FLA's
Mamba2 layer names, MLA blocks transformers' DeepSeek-V3 attention names (pure renames of megatron's;
megatron and DeepSeek-V3 order the rope dims alike).
"""

from __future__ import annotations

from typing import Any

import torch

from zebractl.layout import MIXER_SPECS
from zebractl.layout.common import THEIRS, Entry, Rename, Split, Vocab
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor

_MLP: tuple[Entry, ...] = (
    Rename("decoder.layers.{mlp}.pre_mlp_layernorm.weight", "model.layers.{i}.mlp_norm.weight"),
    Split(
        "decoder.layers.{mlp}.mlp.linear_fc1.weight",
        ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
        lambda m: [m.ffn_hidden_size, m.ffn_hidden_size],
    ),
    Rename("decoder.layers.{mlp}.mlp.linear_fc2.weight", "model.layers.{i}.mlp.down_proj.weight"),
)
BLOCKS: dict[str, tuple[Entry, ...]] = {
    kind: (*spec.entries, *_MLP) for kind, spec in MIXER_SPECS.items()
}
"""Recurrent mixer kind -> its block's entries: the mixer sublayer's (its ``MixerSpec``), the MLP's."""

_S = "decoder.layers.{mixer}.self_attention."
_MLA_COMMON: tuple[Entry, ...] = (
    Rename("decoder.layers.{mixer}.input_layernorm.weight", "model.layers.{i}.attn_norm.weight"),
    Rename(_S + "linear_kv_down_proj.weight", THEIRS + "kv_a_proj_with_mqa.weight"),
    Rename(_S + "kv_layernorm.weight", THEIRS + "kv_a_layernorm.weight"),
    Rename(_S + "linear_kv_up_proj.weight", THEIRS + "kv_b_proj.weight"),
    Rename(_S + "linear_proj.weight", THEIRS + "o_proj.weight"),
    *_MLP,
)
MLA_BLOCK_LORA: tuple[Entry, ...] = (
    Rename(_S + "linear_q_down_proj.weight", THEIRS + "q_a_proj.weight"),
    Rename(_S + "q_layernorm.weight", THEIRS + "q_a_layernorm.weight"),
    Rename(_S + "linear_q_up_proj.weight", THEIRS + "q_b_proj.weight"),
    *_MLA_COMMON,
)
"""MLA with a low-rank query (``q_lora_rank`` set)."""
MLA_BLOCK_FULL: tuple[Entry, ...] = (
    Rename(_S + "linear_q_proj.weight", THEIRS + "q_proj.weight"),
    *_MLA_COMMON,
)
"""MLA with a full-rank query projection (``q_lora_rank: null``)."""

GLOBAL: tuple[Entry, ...] = (
    Vocab("embedding.word_embeddings.weight", "model.embeddings.weight"),
    Rename("decoder.final_norm.weight", "model.norm.weight"),
    Vocab("output_layer.weight", "lm_head.weight", when=lambda m: not m.tie_embeddings),
)

FAMILIES = tuple(kind for kind, spec in MIXER_SPECS.items() if spec.fla_family)
"""The mixers FLA has a model class for (a model of one of them alone)."""


class MappingError(ValueError):
    """The state dict does not match the mapping (missing, unexpected or misshapen tensors)."""


def family(m: ModelConfig) -> str:
    """The FLA family of a pure model, or an error for layouts FLA has no class for."""
    kinds = set(m.blocks)
    if len(kinds) == 1 and next(iter(kinds)) in FAMILIES:
        return next(iter(kinds))
    raise MappingError(
        f"no FLA model class for blocks {sorted(kinds)}: FLA conversion supports "
        "pure KDA and pure GDN models"
    )


FORMATS = ("fla", "zebra")


def _block_table(m: ModelConfig, kind: str) -> tuple[Entry, ...]:
    if kind == "mla":
        assert m.mla is not None
        return MLA_BLOCK_LORA if m.mla.q_lora_rank is not None else MLA_BLOCK_FULL
    return BLOCKS[kind]


def _applies(m: ModelConfig, e: Entry) -> bool:
    """Whether the model has the entry's tensor (some exist only with an option)."""
    return e.when is None or e.when(m)


def _entries(m: ModelConfig, fmt: str = "fla") -> list[tuple[Entry, dict[str, int]]]:
    if fmt == "fla":
        kinds = [family(m)] * m.num_blocks
    elif fmt == "zebra":
        kinds = [m.sublayers[2 * i] for i in range(m.num_blocks)]
    else:
        raise MappingError(f"unknown conversion format {fmt!r} (expected one of {FORMATS})")
    out: list[tuple[Entry, dict[str, int]]] = [(e, {}) for e in GLOBAL if _applies(m, e)]
    for i, kind in enumerate(kinds):
        ix = {"i": i, "mixer": 2 * i, "mlp": 2 * i + 1}
        out += [(e, ix) for e in _block_table(m, kind) if _applies(m, e)]
    return out


def check_table(m: ModelConfig, fmt: str = "fla") -> None:
    """Every tensor of the model's table is mapped once in each direction: no name of ours and no
    name of theirs appears twice (raises listing every doubly mapped name)."""
    ours: list[str] = []
    theirs: list[str] = []
    for e, ix in _entries(m, fmt):
        ours.append(e.ours.format(**ix))
        if isinstance(e, Split):
            theirs += [n.format(**ix) for n, size in zip(e.theirs, e.sizes(m), strict=True) if size]
        else:
            theirs.append(e.theirs.format(**ix))
    doubled = sorted(
        {n for n in ours if ours.count(n) > 1} | {n for n in theirs if theirs.count(n) > 1}
    )
    if doubled:
        raise MappingError(f"doubly mapped tensors in the {fmt} table: {doubled}")


def origins(m: ModelConfig, fmt: str = "fla") -> dict[str, str]:
    """Their tensor name -> our tensor name it is taken from (a split tensor's parts all name
    the fused tensor)."""
    out: dict[str, str] = {}
    for e, ix in _entries(m, fmt):
        parts = e.theirs if isinstance(e, Split) else (e.theirs,)
        for n in parts:
            out[n.format(**ix)] = e.ours.format(**ix)
    return out


def _take(sd: dict[str, Tensor], key: str, used: set[str]) -> Tensor:
    if key not in sd:
        raise MappingError(f"missing tensor {key}")
    used.add(key)
    return sd[key]


def _check_consumed(sd: dict[str, Any], used: set[str], side: str) -> None:
    extra = sorted(set(sd) - used)
    if extra:
        raise MappingError(f"{side} tensors not covered by the mapping: {extra}")


def to_fla(sd: dict[str, Tensor], m: ModelConfig, keep_padding: bool = False) -> dict[str, Tensor]:
    """Our state dict -> FLA's (see :func:`to_hf`)."""
    return to_hf(sd, m, "fla", keep_padding)


def from_fla(sd: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
    """FLA's state dict -> ours (see :func:`from_hf`)."""
    return from_hf(sd, m, "fla")


def to_hf(
    sd: dict[str, Tensor], m: ModelConfig, fmt: str = "fla", keep_padding: bool = False
) -> dict[str, Tensor]:
    """Our state dict (``_extra_state`` entries ignored) -> the HF state dict of ``fmt``.

    ``keep_padding``: keep the vocabulary's padding rows (the export then has
    ``padded_vocab_size`` rows and computes exactly our softmax; see :func:`fla_config`)."""
    check_table(m, fmt)
    rows = m.padded_vocab_size if keep_padding else m.vocab_size
    sd = {k: v for k, v in sd.items() if not k.endswith("_extra_state")}
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for e, ix in _entries(m, fmt):
        ours = e.ours.format(**ix)
        t = _take(sd, ours, used)
        if isinstance(e, Rename):
            out[e.theirs.format(**ix)] = t
        elif isinstance(e, Vocab):
            out[e.theirs.format(**ix)] = t[:rows]
        else:
            sizes = e.sizes(m)
            if sum(sizes) != t.shape[0]:
                raise MappingError(f"{ours}: {t.shape[0]} rows, expected {sum(sizes)} = {sizes}")
            for name, part in zip(e.theirs, t.split(sizes, dim=0), strict=True):
                if part.shape[0]:
                    out[name.format(**ix)] = part
    _check_consumed(sd, used, "zebractl")
    return out


def from_hf(sd: dict[str, Tensor], m: ModelConfig, fmt: str = "fla") -> dict[str, Tensor]:
    """HF state dict of ``fmt`` -> our state dict (tied ``lm_head.weight`` ignored when present).

    Embedding-shaped tensors may have ``vocab_size`` rows (FLA's own checkpoints: the padding rows
    are zero-filled) or ``padded_vocab_size`` rows (our exports: kept as they are)."""
    check_table(m, fmt)
    if m.tie_embeddings:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for e, ix in _entries(m, fmt):
        ours = e.ours.format(**ix)
        if isinstance(e, Rename):
            out[ours] = _take(sd, e.theirs.format(**ix), used)
        elif isinstance(e, Vocab):
            t = _take(sd, e.theirs.format(**ix), used)
            if t.shape[0] not in (m.vocab_size, m.padded_vocab_size):
                raise MappingError(
                    f"{e.theirs.format(**ix)}: {t.shape[0]} rows, expected {m.vocab_size} (or "
                    f"{m.padded_vocab_size} with the padding rows)"
                )
            pad = m.padded_vocab_size - t.shape[0]
            out[ours] = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        else:
            parts = [
                _take(sd, n.format(**ix), used)
                for n, s in zip(e.theirs, e.sizes(m), strict=True)
                if s
            ]
            out[ours] = torch.cat(parts, dim=0)
    _check_consumed(sd, used, "FLA" if fmt == "fla" else "Hugging Face")
    return out


def fla_config(m: ModelConfig, keep_padding: bool = False) -> dict[str, Any]:
    """The FLA config (``KDAConfig`` / ``GatedDeltaNetConfig`` kwargs) of a pure KDA/GDN model
    (``keep_padding``: ``vocab_size`` counts the padding rows, as in :func:`to_fla`)."""
    fam = family(m)
    block = getattr(m, fam)
    d = m.linear_attention_dims(fam)  # type: ignore[arg-type]
    cfg: dict[str, Any] = {
        "hidden_size": m.hidden_size,
        "num_hidden_layers": m.num_blocks,
        "num_heads": d.num_heads,
        "head_dim": d.head_k_dim,
        "num_v_heads": d.num_v_heads,
        "expand_v": d.head_v_dim / d.head_k_dim,
        "use_short_conv": block.use_short_conv,
        "conv_size": block.conv_size,
        "allow_neg_eigval": block.allow_neg_eigval,
        "intermediate_size": m.ffn_hidden_size,
        "hidden_act": "swish",
        "norm_eps": m.norm.eps,
        "vocab_size": m.padded_vocab_size if keep_padding else m.vocab_size,
        "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": m.init_std,
        "max_position_embeddings": m.max_position_embeddings,
        # fused kernels off: the converted checkpoint loads and evaluates anywhere
        "fuse_norm": False,
        "fuse_swiglu": False,
        "fuse_cross_entropy": False,
    }
    if fam == "kda":
        cfg |= {"safe_gate": block.safe_gate, "lower_bound": block.lower_bound}
    else:
        cfg |= {
            "use_gate": block.use_gate,
            "output_gate_activation": block.gate_activation,
            "fuse_linear_cross_entropy": False,
        }
    return cfg
