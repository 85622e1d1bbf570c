"""KDA's torch-free facts: its tensors, FLOPs and conversion entries (H hidden, Hk/dk key heads/dim, Hv/dv value heads/dim, Kd = Hk*dk, Vd = Hv*dv).

KDA (kda_300M: H 1024, Hk = Hv = 8, dk 32, dv 64)::

    norm.weight                 [H]                               [1024]
    mixer.in_proj.weight        [2Kd+Vd+2dv+Hv, H]  rows q|k|v|f_a|g_a|beta   [1160, 1024]
    mixer.conv1d.weight         [2Kd+Vd, 1, conv]   channels q|k|v            [1024, 1, 4]
    mixer.f_b_proj.weight       [Hv*dk, dv]         (no bias)                 [256, 64]
    mixer.g_b_proj.weight/.bias [Vd, dv] / [Vd]     (the one bias)            [512, 64] / [512]
    mixer.A_log                 [Hv]                fp32                      [8]
    mixer.dt_bias               [Hv*dk]             fp32                      [256]
    mixer.out_norm.weight       [dv]                gated RMSNorm, shared by heads   [64]
    mixer.out_proj.weight       [H, Vd]                                       [1024, 512]
"""

from __future__ import annotations

from zebractl.layout.common import (
    OURS,
    THEIRS,
    MixerSpec,
    Rename,
    Shapes,
    delta_rule_activations,
    delta_rule_entries,
    delta_rule_flops,
    linear,
    norm,
)
from zebractl.schemas.preset import ModelConfig


def kda_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of KDA's fused in_proj: q | k | v | f_a | g_a | beta."""
    d = m.linear_attention_dims("kda")
    return [d.key_dim, d.key_dim, d.value_dim, d.head_v_dim, d.head_v_dim, d.num_v_heads]


def kda_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one KDA mixer sublayer."""
    assert m.kda is not None
    d = m.linear_attention_dims("kda")
    h, conv_dim = m.hidden_size, 2 * d.key_dim + d.value_dim
    s: Shapes = norm(m, "norm", h)
    s |= linear(m, "mixer.in_proj", sum(kda_in_proj_rows(m)), h)
    if m.kda.use_short_conv:
        s["mixer.conv1d.weight"] = (conv_dim, 1, m.kda.conv_size)
    s |= linear(m, "mixer.f_b_proj", d.num_v_heads * d.head_k_dim, d.head_v_dim, bias=False)
    s |= linear(m, "mixer.g_b_proj", d.value_dim, d.head_v_dim, bias=True)
    s["mixer.A_log"] = (d.num_v_heads,)
    s["mixer.dt_bias"] = (d.num_v_heads * d.head_k_dim,)
    s["mixer.out_norm.weight"] = (d.head_v_dim,)  # gated RMSNorm by design
    s |= linear(m, "mixer.out_proj", h, d.value_dim)
    return s


SPEC = MixerSpec(
    shapes=kda_shapes,
    recurrent_flops=lambda m: delta_rule_flops(m, "kda"),
    activations=lambda m: delta_rule_activations(m, "kda", kda_shapes(m)),
    entries=delta_rule_entries(
        "kda",
        ("q_proj", "k_proj", "v_proj", "f_proj.0", "g_proj.0", "b_proj"),
        kda_in_proj_rows,
        own=(
            Rename(OURS + "f_b_proj.weight", THEIRS + "f_proj.1.weight"),
            Rename(OURS + "g_b_proj.weight", THEIRS + "g_proj.1.weight"),
            Rename(OURS + "g_b_proj.bias", THEIRS + "g_proj.1.bias"),
        ),
    ),
    fla_family=True,
)
