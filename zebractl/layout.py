"""The parameter layout of a Zebra model: every tensor's name and shape, from the config alone.

This is the one place the layout is written down. ``zebractl plan`` counts parameters from it, the
model built by the runtime must match it tensor for tensor, and checkpoint conversion maps these names.
Names follow Megatron's hybrid stack (sublayer ``i`` of ``decoder.layers``); fused tensors keep the
Primus row order so Primus checkpoints import unchanged.

Per-sublayer tensors (H hidden, Hk/dk key heads/dim, Hv/dv value heads/dim, Kd = Hk*dk, Vd = Hv*dv):

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

GDN: ``mixer.in_proj`` rows q|k|v|z|beta|alpha = [2Kd+2Vd+2Hv, H] (z only with use_gate), conv1d over
q|k|v, ``A_log`` and ``dt_bias`` [Hv], ``out_norm`` [dv], ``out_proj`` [H, Vd].

Mamba2 (d_inner di, G groups, N state, nh heads): ``mixer.in_proj`` rows z|x|B|C|dt =
[2di+2GN+nh, H], ``conv1d`` over x|B|C (+bias), ``A_log``/``D``/``dt_bias`` [nh], ``mixer.norm``
[di], ``out_proj`` [H, di].

MLA: ``input_layernorm``, ``self_attention.linear_q_down_proj`` [q_lora, H], ``q_layernorm``,
``linear_q_up_proj`` [nh*(qk+rope), q_lora] (or ``linear_q_proj`` [nh*(qk+rope), H] without a q
rank), ``linear_kv_down_proj`` [kv_lora+rope, H] rows kv_latent|k_rope, ``kv_layernorm``,
``linear_kv_up_proj`` [nh*(qk+v), kv_lora], ``linear_proj`` [H, nh*v].

MLP: ``pre_mlp_layernorm``, ``mlp.linear_fc1`` [2F, H] rows gate|up, ``mlp.linear_fc2`` [H, F].

Top level: ``embedding.word_embeddings.weight`` [padded vocab, H], ``decoder.final_norm.weight`` [H],
``output_layer.weight`` [padded vocab, H] only when embeddings are untied.
"""

from __future__ import annotations

from math import prod

from zebractl.schemas.preset import ModelConfig

Shapes = dict[str, tuple[int, ...]]


def _norm(m: ModelConfig, name: str, size: int) -> Shapes:
    out: Shapes = {f"{name}.weight": (size,)}
    if m.norm.type == "layernorm":
        out[f"{name}.bias"] = (size,)
    return out


def _linear(m: ModelConfig, name: str, out_f: int, in_f: int, bias: bool | None = None) -> Shapes:
    shapes: Shapes = {f"{name}.weight": (out_f, in_f)}
    if m.linear_bias if bias is None else bias:
        shapes[f"{name}.bias"] = (out_f,)
    return shapes


def kda_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of KDA's fused in_proj: q | k | v | f_a | g_a | beta."""
    d = m.linear_attention_dims("kda")
    return [d.key_dim, d.key_dim, d.value_dim, d.head_v_dim, d.head_v_dim, d.num_v_heads]


def gdn_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of GDN's fused in_proj: q | k | v | z | beta | alpha (z empty without use_gate)."""
    assert m.gdn is not None
    d = m.linear_attention_dims("gdn")
    z = d.value_dim if m.gdn.use_gate else 0
    return [d.key_dim, d.key_dim, d.value_dim, z, d.num_v_heads, d.num_v_heads]


def conv_channels(m: ModelConfig, kind: str) -> list[int]:
    """Channel blocks of the short convolution: q | k | v."""
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    return [d.key_dim, d.key_dim, d.value_dim]


def mamba2_in_proj_rows(m: ModelConfig) -> list[int]:
    """Row blocks of Mamba2's fused in_proj: z | x | B | C | dt."""
    assert m.mamba2 is not None
    gn = m.mamba2.num_groups * m.mamba2.state_dim
    di = m.mamba2_dims.d_inner
    return [di, di, gn, gn, m.mamba2_dims.num_heads]


def kda_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one KDA mixer sublayer."""
    assert m.kda is not None
    d = m.linear_attention_dims("kda")
    h, conv_dim = m.hidden_size, 2 * d.key_dim + d.value_dim
    s: Shapes = _norm(m, "norm", h)
    s |= _linear(m, "mixer.in_proj", sum(kda_in_proj_rows(m)), h)
    if m.kda.use_short_conv:
        s["mixer.conv1d.weight"] = (conv_dim, 1, m.kda.conv_size)
    s |= _linear(m, "mixer.f_b_proj", d.num_v_heads * d.head_k_dim, d.head_v_dim, bias=False)
    s |= _linear(m, "mixer.g_b_proj", d.value_dim, d.head_v_dim, bias=True)
    s["mixer.A_log"] = (d.num_v_heads,)
    s["mixer.dt_bias"] = (d.num_v_heads * d.head_k_dim,)
    s["mixer.out_norm.weight"] = (d.head_v_dim,)  # gated RMSNorm by design
    s |= _linear(m, "mixer.out_proj", h, d.value_dim)
    return s


def gdn_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one GDN mixer sublayer."""
    assert m.gdn is not None
    d = m.linear_attention_dims("gdn")
    h, conv_dim = m.hidden_size, 2 * d.key_dim + d.value_dim
    s: Shapes = _norm(m, "norm", h)
    s |= _linear(m, "mixer.in_proj", sum(gdn_in_proj_rows(m)), h)
    if m.gdn.use_short_conv:
        s["mixer.conv1d.weight"] = (conv_dim, 1, m.gdn.conv_size)
    s["mixer.A_log"] = (d.num_v_heads,)
    s["mixer.dt_bias"] = (d.num_v_heads,)
    s["mixer.out_norm.weight"] = (d.head_v_dim,)  # gated RMSNorm by design
    s |= _linear(m, "mixer.out_proj", h, d.value_dim)
    return s


def mamba2_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one Mamba2 mixer sublayer."""
    assert m.mamba2 is not None
    mb, d = m.mamba2, m.mamba2_dims
    h, gn = m.hidden_size, mb.num_groups * mb.state_dim
    conv_dim = d.d_inner + 2 * gn
    s: Shapes = _norm(m, "norm", h)
    s |= _linear(m, "mixer.in_proj", sum(mamba2_in_proj_rows(m)), h)
    s["mixer.conv1d.weight"] = (conv_dim, 1, mb.conv_size)
    if mb.conv_bias:
        s["mixer.conv1d.bias"] = (conv_dim,)
    s |= {"mixer.A_log": (d.num_heads,), "mixer.D": (d.num_heads,), "mixer.dt_bias": (d.num_heads,)}
    s["mixer.norm.weight"] = (d.d_inner,)  # grouped gated RMSNorm by design
    s |= _linear(m, "mixer.out_proj", h, d.d_inner)
    return s


def mla_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one MLA attention sublayer."""
    assert m.mla is not None
    a, h = m.mla, m.hidden_size
    q_dim = a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
    p = "self_attention."
    s: Shapes = _norm(m, "input_layernorm", h)
    # MLA's q and kv projections never carry a bias (megatron's MLA); linear_proj follows linear_bias
    if a.q_lora_rank is None:
        s |= _linear(m, p + "linear_q_proj", q_dim, h, bias=False)
    else:
        s |= _linear(m, p + "linear_q_down_proj", a.q_lora_rank, h, bias=False)
        s |= _norm(m, p + "q_layernorm", a.q_lora_rank)
        s |= _linear(m, p + "linear_q_up_proj", q_dim, a.q_lora_rank, bias=False)
    kv_down = a.kv_lora_rank + a.qk_pos_emb_head_dim
    s |= _linear(m, p + "linear_kv_down_proj", kv_down, h, bias=False)
    s |= _norm(m, p + "kv_layernorm", a.kv_lora_rank)
    kv_up = a.num_heads * (a.qk_head_dim + a.v_head_dim)
    s |= _linear(m, p + "linear_kv_up_proj", kv_up, a.kv_lora_rank, bias=False)
    s |= _linear(m, p + "linear_proj", h, a.num_heads * a.v_head_dim)
    return s


def mlp_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one SwiGLU MLP sublayer."""
    h, f = m.hidden_size, m.ffn_hidden_size
    s: Shapes = _norm(m, "pre_mlp_layernorm", h)
    s |= _linear(m, "mlp.linear_fc1", 2 * f, h)
    s |= _linear(m, "mlp.linear_fc2", h, f)
    return s


SUBLAYER_SHAPES = {
    "kda": kda_shapes,
    "gdn": gdn_shapes,
    "mamba2": mamba2_shapes,
    "mla": mla_shapes,
    "mlp": mlp_shapes,
}


def model_shapes(m: ModelConfig) -> Shapes:
    """Every tensor of the model, in module order."""
    h, v = m.hidden_size, m.padded_vocab_size
    s: Shapes = {"embedding.word_embeddings.weight": (v, h)}
    for i, kind in enumerate(m.sublayers):
        for name, shape in SUBLAYER_SHAPES[kind](m).items():
            s[f"decoder.layers.{i}.{name}"] = shape
    s |= {f"decoder.{k}": v for k, v in _norm(m, "final_norm", h).items()}
    if not m.tie_embeddings:
        s["output_layer.weight"] = (v, h)
    return s


def numel(shapes: Shapes) -> int:
    """Total element count of a shape table."""
    return sum(prod(shape) for shape in shapes.values())
