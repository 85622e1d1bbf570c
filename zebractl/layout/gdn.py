"""GDN's torch-free facts: its tensors, FLOPs and conversion entries (H hidden, Hk/dk key heads/dim, Hv/dv value heads/dim, Kd = Hk*dk, Vd = Hv*dv).

GDN: ``mixer.in_proj`` rows q|k|v|z|beta|alpha = [2Kd+2Vd+2Hv, H] (z only with use_gate), conv1d over
q|k|v, ``A_log`` and ``dt_bias`` [Hv], ``out_norm`` [dv], ``out_proj`` [H, Vd].
"""

from __future__ import annotations

from zebractl.layout.common import (
    MixerSpec,
    Shapes,
    delta_rule_activations,
    delta_rule_entries,
    delta_rule_flops,
    linear,
    norm,
)
from zebractl.schemas.preset import ModelConfig


def gdn_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of GDN's fused in_proj: q | k | v | z | beta | alpha (z empty without use_gate)."""
    assert m.gdn is not None
    d = m.linear_attention_dims("gdn")
    z = d.value_dim if m.gdn.use_gate else 0
    return [d.key_dim, d.key_dim, d.value_dim, z, d.num_v_heads, d.num_v_heads]


def gdn_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one GDN mixer sublayer."""
    assert m.gdn is not None
    d = m.linear_attention_dims("gdn")
    h, conv_dim = m.hidden_size, 2 * d.key_dim + d.value_dim
    s: Shapes = norm(m, "norm", h)
    s |= linear(m, "mixer.in_proj", sum(gdn_in_proj_rows(m)), h)
    if m.gdn.use_short_conv:
        s["mixer.conv1d.weight"] = (conv_dim, 1, m.gdn.conv_size)
    s["mixer.A_log"] = (d.num_v_heads,)
    s["mixer.dt_bias"] = (d.num_v_heads,)
    s["mixer.out_norm.weight"] = (d.head_v_dim,)  # gated RMSNorm by design
    s |= linear(m, "mixer.out_proj", h, d.value_dim)
    return s


SPEC = MixerSpec(
    shapes=gdn_shapes,
    recurrent_flops=lambda m: delta_rule_flops(m, "gdn"),
    activations=lambda m: delta_rule_activations(m, "gdn", gdn_shapes(m)),
    entries=delta_rule_entries(
        "gdn", ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj"), gdn_in_proj_rows
    ),
    fla_family=True,
)
