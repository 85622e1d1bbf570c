"""Mamba2's torch-free facts: its tensors, FLOPs and conversion entries (H hidden).

Mamba2 (d_inner di, G groups, N state, nh heads): ``mixer.in_proj`` rows z|x|B|C|dt =
[2di+2GN+nh, H], ``conv1d`` over x|B|C (+bias), ``A_log``/``D``/``dt_bias`` [nh], ``mixer.norm``
[di], ``out_proj`` [H, di].

FLOPs: the SSD as scalar-decay linear attention (chunk C = 64; FLA's simple_gla kernels), per head
(P head dim, N state): 2*C*P (intra-chunk scores x values) + 4*N*P (readout, state update), plus per
group 2*C*N (C B^T).
"""

from __future__ import annotations

from zebractl.layout.common import (
    CHUNK,
    OURS,
    PRE_NORM,
    THEIRS,
    MixerSpec,
    Rename,
    Shapes,
    linear,
    norm,
)
from zebractl.schemas.preset import ModelConfig


def mamba2_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of Mamba2's fused in_proj: z | x | B | C | dt."""
    assert m.mamba2 is not None
    gn = m.mamba2.num_groups * m.mamba2.state_dim
    di = m.mamba2_dims.d_inner
    return [di, di, gn, gn, m.mamba2_dims.num_heads]


def mamba2_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one Mamba2 mixer sublayer."""
    assert m.mamba2 is not None
    mb, d = m.mamba2, m.mamba2_dims
    h, gn = m.hidden_size, mb.num_groups * mb.state_dim
    conv_dim = d.d_inner + 2 * gn
    s: Shapes = norm(m, "norm", h)
    s |= linear(m, "mixer.in_proj", sum(mamba2_in_proj_rows(m)), h)
    s["mixer.conv1d.weight"] = (conv_dim, 1, mb.conv_size)
    if mb.conv_bias:
        s["mixer.conv1d.bias"] = (conv_dim,)
    s |= {"mixer.A_log": (d.num_heads,), "mixer.D": (d.num_heads,), "mixer.dt_bias": (d.num_heads,)}
    s["mixer.norm.weight"] = (d.d_inner,)  # grouped gated RMSNorm by design
    s |= linear(m, "mixer.out_proj", h, d.d_inner)
    return s


def mamba2_flops(m: ModelConfig) -> int:
    """The SSD scan's forward FLOPs per token (see the module docstring)."""
    assert m.mamba2 is not None
    d2, n, p = m.mamba2_dims, m.mamba2.state_dim, m.mamba2.head_dim
    return d2.num_heads * (2 * CHUNK * p + 4 * n * p) + m.mamba2.num_groups * 2 * CHUNK * n


MAMBA2_MIXER_TENSORS = (
    "in_proj.weight",
    "conv1d.weight",
    "conv1d.bias",
    "A_log",
    "D",
    "dt_bias",
    "norm.weight",
    "out_proj.weight",
)
"""A Mamba2 mixer's tensors: the same names here, in FLA's Mamba2 layer and in Primus."""


def _conv_bias(m: ModelConfig) -> bool:
    return m.mamba2 is not None and m.mamba2.conv_bias


def mamba2_activations(m: ModelConfig) -> tuple[int, int]:
    """Mamba2's :attr:`MixerSpec.activations`: in_proj, conv (x|B|C), o, gate, normed o."""
    assert m.mamba2 is not None
    di = m.mamba2_dims.d_inner
    in_rows = mamba2_shapes(m)["mixer.in_proj.weight"][0]
    conv = di + 2 * m.mamba2.num_groups * m.mamba2.state_dim
    return in_rows + conv + 3 * di, di


SPEC = MixerSpec(
    shapes=mamba2_shapes,
    recurrent_flops=mamba2_flops,
    activations=mamba2_activations,
    entries=(
        PRE_NORM,
        *(
            Rename(OURS + n, THEIRS + n, when=_conv_bias if n == "conv1d.bias" else None)
            for n in MAMBA2_MIXER_TENSORS
        ),
    ),
)
