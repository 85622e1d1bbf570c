"""Translate a resolved :class:`ModelConfig` into megatron-core's TransformerConfig.

Every field megatron's modules read in our model is set here from our config, never left at megatron's
default (0.16.1 defaults: dropout 0.1, eps 1e-5, LayerNorm, biased linears, gelu, YaRN factor 40,
depth-scaled output init...). :data:`EXPLICIT_FIELDS` lists them; a test fails when the translation
leaves one out, and another builds a model with non-default values and checks each module uses them.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from zebractl.schemas.preset import ModelConfig

# Fields megatron's modules (embedding, MLA, linears) read in our model. All must be set explicitly.
EXPLICIT_FIELDS: tuple[str, ...] = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "kv_channels",
    "hidden_dropout",
    "attention_dropout",
    "layernorm_epsilon",
    "normalization",
    "layernorm_zero_centered_gamma",
    "add_bias_linear",
    "add_qkv_bias",
    "gated_linear_unit",
    "activation_func",
    "init_method_std",
    "init_method",
    "output_layer_init_method",
    "embedding_init_method_std",
    "embedding_init_method",
    "perform_initialization",
    "use_cpu_initialization",
    "params_dtype",
    "pipeline_dtype",
    "bf16",
    "fp16",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "gradient_accumulation_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "apply_rope_fusion",
    "persist_layer_norm",
    "cross_entropy_loss_fusion",
    "attention_softmax_in_fp32",
    "apply_query_key_layer_scaling",
    "apply_residual_connection_post_layernorm",
    "fp32_residual_connection",
    "softmax_scale",
    "qk_layernorm",
    "qk_l2_norm",
    "rotary_interleaved",
    "transformer_impl",
    "deterministic_mode",
    "is_hybrid_model",
    "calculate_per_token_loss",
)
MLA_FIELDS: tuple[str, ...] = (
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "rope_type",
    "rotary_base",
    "rotary_percent",
    "rotary_scaling_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "cache_mla_latents",
)


def _normal(std: float) -> Any:
    return partial(torch.nn.init.normal_, mean=0.0, std=std)


def megatron_kwargs(
    m: ModelConfig, *, tp: int = 1, cp: int = 1, params_dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Every megatron config field our model depends on, from our config."""
    num_sublayers = 2 * m.num_blocks
    out_std = m.init_std / math.sqrt(num_sublayers) if m.init_scaled_output else m.init_std
    heads = m.mla.num_heads if m.mla is not None else 1
    kv = (m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim) if m.mla is not None else m.hidden_size
    kw: dict[str, Any] = {
        "num_layers": num_sublayers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": heads,
        "kv_channels": kv,
        "hidden_dropout": m.dropout.hidden,
        "attention_dropout": m.dropout.attention,
        "layernorm_epsilon": m.norm.eps,
        "normalization": "RMSNorm" if m.norm.type == "rmsnorm" else "LayerNorm",
        "layernorm_zero_centered_gamma": False,
        "add_bias_linear": m.linear_bias,
        "add_qkv_bias": False,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "init_method_std": m.init_std,
        "init_method": _normal(m.init_std),
        "output_layer_init_method": _normal(out_std),
        "embedding_init_method_std": m.init_std,
        "embedding_init_method": _normal(m.init_std),
        # zebractl initialises every tensor itself (zebractl.model.init), FLA's way
        "perform_initialization": False,
        "use_cpu_initialization": True,  # allocate on the current default device (cpu/meta/cuda)
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": cp,
        "sequence_parallel": False,
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "cross_entropy_loss_fusion": False,
        "attention_softmax_in_fp32": True,
        "apply_query_key_layer_scaling": False,
        "apply_residual_connection_post_layernorm": False,
        "fp32_residual_connection": False,
        "softmax_scale": None,  # MLA derives it from head dims and mscale
        "qk_layernorm": True,  # MLA's q/kv LoRA RMSNorms (missing them cost Primus +0.12 loss)
        "qk_l2_norm": False,
        "rotary_interleaved": False,
        "transformer_impl": "local",
        "deterministic_mode": False,
        "is_hybrid_model": True,
        "calculate_per_token_loss": False,
        "cuda_graph_impl": "none",
        "cuda_graph_scope": [],  # megatron's default "full" is deprecated and warns
    }
    if m.mla is not None:
        a = m.mla
        yarn = a.yarn
        kw |= {
            "multi_latent_attention": True,
            "q_lora_rank": a.q_lora_rank,
            "kv_lora_rank": a.kv_lora_rank,
            "qk_head_dim": a.qk_head_dim,
            "qk_pos_emb_head_dim": a.qk_pos_emb_head_dim,
            "v_head_dim": a.v_head_dim,
            "rope_type": a.rope_type,
            "rotary_base": a.rope_base,
            "rotary_percent": 1.0,
            "rotary_scaling_factor": yarn.factor if yarn else 1.0,
            "original_max_position_embeddings": (
                yarn.original_max_position_embeddings if yarn else m.max_position_embeddings
            ),
            "beta_fast": yarn.beta_fast if yarn else 32.0,
            "beta_slow": yarn.beta_slow if yarn else 1.0,
            "mscale": yarn.mscale if yarn else 1.0,
            "mscale_all_dim": yarn.mscale_all_dim if yarn else 1.0,
            "cache_mla_latents": False,
        }
    return kw


def transformer_config(m: ModelConfig, **kw: Any) -> Any:
    """A TransformerConfig (MLATransformerConfig when the model has MLA blocks)."""
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    args = megatron_kwargs(m, **kw)
    cls = MLATransformerConfig if m.mla is not None else TransformerConfig
    return cls(**args)
