"""What the per-mixer modules share: shape-table helpers, conversion-table entries, the
:class:`MixerSpec` each one declares, and what KDA and GDN have in common."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zebractl.schemas.preset import ModelConfig

Shapes = dict[str, tuple[int, ...]]


def norm(m: ModelConfig, name: str, size: int) -> Shapes:
    """A norm's tensors: weight, and bias for LayerNorm."""
    out: Shapes = {f"{name}.weight": (size,)}
    if m.norm.type == "layernorm":
        out[f"{name}.bias"] = (size,)
    return out


def linear(m: ModelConfig, name: str, out_f: int, in_f: int, bias: bool | None = None) -> Shapes:
    """A linear layer's tensors: weight, and bias when ``bias`` (default: ``m.linear_bias``)."""
    shapes: Shapes = {f"{name}.weight": (out_f, in_f)}
    if m.linear_bias if bias is None else bias:
        shapes[f"{name}.bias"] = (out_f,)
    return shapes


# ---- conversion-table entries (applied by zebractl.hf.mapping) ---------------------------------

Condition = Callable[[ModelConfig], bool]


@dataclass(frozen=True)
class Rename:
    """Same tensor, another name (``when``: only in models where it holds)."""

    ours: str
    theirs: str
    when: Condition | None = None


@dataclass(frozen=True)
class Split:
    """Our fused tensor = FLA's tensors concatenated along dim 0, in order (empty parts skipped)."""

    ours: str
    theirs: tuple[str, ...]
    sizes: Callable[[ModelConfig], list[int]]
    when: Condition | None = None


@dataclass(frozen=True)
class Vocab:
    """An embedding-shaped tensor: FLA keeps vocab_size rows, we keep the padded count."""

    ours: str
    theirs: str
    when: Condition | None = None


Entry = Rename | Split | Vocab

OURS = "decoder.layers.{mixer}.mixer."
"""Our names of a mixer's tensors (``{mixer}``: the mixer sublayer's index, 2i)."""
THEIRS = "model.layers.{i}.attn."
"""FLA's and ZebraForCausalLM's names of block ``{i}``'s mixer (or MLA) tensors."""
PRE_NORM = Rename("decoder.layers.{mixer}.norm.weight", "model.layers.{i}.attn_norm.weight")
"""A mixer sublayer's pre-norm."""


@dataclass(frozen=True)
class MixerSpec:
    """What the torch-free layers know of a recurrent mixer, from the config alone."""

    shapes: Callable[[ModelConfig], Shapes]
    """The sublayer's tensors (pre-norm included), in module order."""
    recurrent_flops: Callable[[ModelConfig], int]
    """Forward FLOPs per token of its recurrence (:mod:`zebractl.planning.flops`)."""
    entries: tuple[Entry, ...]
    """The sublayer's conversion entries to FLA's / ZebraForCausalLM's names (its block's MLP
    entries are added by :mod:`zebractl.hf.mapping`)."""
    activations: Callable[[ModelConfig], tuple[int, int]]
    """Activation elements per token the mixer keeps for backward by the analytic count (in_proj's
    output, the convolution's, the output, the gate and the normed output), and the width its
    kernels' fitted extra scales with (value_dim; Mamba2: d_inner) for
    :data:`zebractl.planning.plan.FLA_SAVED_PER_VALUE_DIM`."""
    fla_family: bool = False
    """FLA has a model class for a model of this mixer alone (``convert --format fla``)."""


# ---- what KDA and GDN share --------------------------------------------------------------------

CHUNK = 64
"""Chunk length of FLA's chunked kernels, as the FLOP count assumes it."""


def conv_channels(m: ModelConfig, kind: str) -> list[int]:
    """Channel blocks of the short convolution: q | k | v."""
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    return [d.key_dim, d.key_dim, d.value_dim]


def delta_rule_activations(m: ModelConfig, kind: str, shapes: Shapes) -> tuple[int, int]:
    """KDA's / GDN's :attr:`MixerSpec.activations`: in_proj, conv, o, gate, normed o."""
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    in_rows = shapes["mixer.in_proj.weight"][0]
    conv = 2 * d.key_dim + d.value_dim
    return in_rows + conv + 3 * d.value_dim, d.value_dim


def delta_rule_flops(m: ModelConfig, kind: str) -> int:
    """The chunked delta rule's forward FLOPs per token (chunk C = 64), per value head (dk key,
    dv value dim): intra-chunk QK^T, KK^T and W = T(beta K): 6*C*dk; U = T(beta V) and
    A(U - WS): 4*C*dv; inter-chunk W S, Q S and the state update K^T U: 6*dk*dv; the triangular
    inverse T: 2*C^2/3."""
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    dk, dv, c = d.head_k_dim, d.head_v_dim, CHUNK
    return d.num_v_heads * (6 * c * dk + 4 * c * dv + 6 * dk * dv + (2 * c * c) // 3)


def delta_rule_entries(
    kind: str,
    in_proj_parts: tuple[str, ...],
    rows: Callable[[ModelConfig], list[int]],
    own: tuple[Entry, ...] = (),
) -> tuple[Entry, ...]:
    """Entries of a KDA/GDN sublayer: the fused in_proj and conv split into FLA's tensors."""
    return (
        PRE_NORM,
        Split(OURS + "in_proj.weight", tuple(THEIRS + f"{n}.weight" for n in in_proj_parts), rows),
        Split(
            OURS + "conv1d.weight",
            tuple(THEIRS + f"{x}_conv1d.weight" for x in "qkv"),
            lambda m: conv_channels(m, kind),
            when=lambda m: getattr(m, kind).use_short_conv,
        ),
        *own,
        Rename(OURS + "A_log", THEIRS + "A_log"),
        Rename(OURS + "dt_bias", THEIRS + "dt_bias"),
        Rename(OURS + "out_norm.weight", THEIRS + "o_norm.weight"),
        Rename(OURS + "out_proj.weight", THEIRS + "o_proj.weight"),
    )
