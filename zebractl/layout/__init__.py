"""The parameter layout of a Zebra model: every tensor's name and shape, from the config alone.

This is the one place the layout is written down. ``zebractl plan`` counts parameters from it, the
model built by the runtime must match it tensor for tensor, and checkpoint conversion maps these names.
Names follow Megatron's hybrid stack (sublayer ``i`` of ``decoder.layers``); fused tensors keep the
Primus row order so Primus checkpoints import unchanged.

Per-sublayer tensors (H hidden): each recurrent mixer's are written down in its own module
(:mod:`.kda`, :mod:`.gdn`, :mod:`.mamba2`; shared helpers in :mod:`.common`), which declares them
with its FLOPs and conversion entries as its ``SPEC`` (:data:`MIXER_SPECS`); MLA's and the MLP's here.

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

from zebractl.layout import gdn, kda, mamba2
from zebractl.layout.common import MixerSpec, Shapes, linear, norm
from zebractl.schemas.preset import ModelConfig

MIXER_SPECS: dict[str, MixerSpec] = {"kda": kda.SPEC, "gdn": gdn.SPEC, "mamba2": mamba2.SPEC}
"""Recurrent mixer kind -> its torch-free facts (tensors, FLOPs, conversion entries)."""


def mla_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one MLA attention sublayer."""
    assert m.mla is not None
    a, h = m.mla, m.hidden_size
    q_dim = a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
    p = "self_attention."
    s: Shapes = norm(m, "input_layernorm", h)
    # MLA's q and kv projections never carry a bias (megatron's MLA); linear_proj follows linear_bias
    if a.q_lora_rank is None:
        s |= linear(m, p + "linear_q_proj", q_dim, h, bias=False)
    else:
        s |= linear(m, p + "linear_q_down_proj", a.q_lora_rank, h, bias=False)
        s |= norm(m, p + "q_layernorm", a.q_lora_rank)
        s |= linear(m, p + "linear_q_up_proj", q_dim, a.q_lora_rank, bias=False)
    kv_down = a.kv_lora_rank + a.qk_pos_emb_head_dim
    s |= linear(m, p + "linear_kv_down_proj", kv_down, h, bias=False)
    s |= norm(m, p + "kv_layernorm", a.kv_lora_rank)
    kv_up = a.num_heads * (a.qk_head_dim + a.v_head_dim)
    s |= linear(m, p + "linear_kv_up_proj", kv_up, a.kv_lora_rank, bias=False)
    s |= linear(m, p + "linear_proj", h, a.num_heads * a.v_head_dim)
    return s


def mlp_shapes(m: ModelConfig) -> Shapes:
    """Tensors of one SwiGLU MLP sublayer."""
    h, f = m.hidden_size, m.ffn_hidden_size
    s: Shapes = norm(m, "pre_mlp_layernorm", h)
    s |= linear(m, "mlp.linear_fc1", 2 * f, h)
    s |= linear(m, "mlp.linear_fc2", h, f)
    return s


SUBLAYER_SHAPES = {
    **{kind: spec.shapes for kind, spec in MIXER_SPECS.items()},
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
    s |= {f"decoder.{k}": v for k, v in norm(m, "final_norm", h).items()}
    if not m.tie_embeddings:
        s["output_layer.weight"] = (v, h)
    return s


def numel(shapes: Shapes) -> int:
    """Total element count of a shape table."""
    return sum(prod(shape) for shape in shapes.values())
