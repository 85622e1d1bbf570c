"""Mamba2's tensors (H hidden).

Mamba2 (d_inner di, G groups, N state, nh heads): ``mixer.in_proj`` rows z|x|B|C|dt =
[2di+2GN+nh, H], ``conv1d`` over x|B|C (+bias), ``A_log``/``D``/``dt_bias`` [nh], ``mixer.norm``
[di], ``out_proj`` [H, di].
"""

from __future__ import annotations

from zebractl.layout.common import Shapes, linear, norm
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
