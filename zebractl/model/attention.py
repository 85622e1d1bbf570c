"""MLA through megatron-core's MLASelfAttention, with a torch SDPA core attention.

megatron 0.16.1's local DotProductAttention cannot serve MLA (it rejects the k/v channel arguments MLA
passes, and materialises [b, n, s, s] scores); ours calls ``F.scaled_dot_product_attention`` (flash or
memory-efficient kernels on CUDA) with causal masking and MLA's softmax scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

from zebractl.model.ops import KernelOptions


class SDPACoreAttention(MegatronModule):
    """Causal attention over megatron's ``[s, b, n, d]`` tensors; returns ``[s, b, n * dv]``."""

    def __init__(
        self,
        config,
        layer_number,
        attn_mask_type,
        attention_type,
        attention_dropout=None,
        softmax_scale=None,
        k_channels=None,
        v_channels=None,
        cp_comm_type=None,
        pg_collection=None,
    ) -> None:
        super().__init__(config=config)
        self.softmax_scale = softmax_scale
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def forward(
        self,
        query,
        key,
        value,
        attention_mask=None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
        **_,
    ):
        if packed_seq_params is not None:
            raise NotImplementedError("packed sequences are not supported by SDPACoreAttention")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            scale=self.softmax_scale,
            dropout_p=self.dropout_p if self.training else 0.0,
        )
        s, b = query.shape[0], query.shape[1]
        return o.permute(2, 0, 1, 3).reshape(s, b, -1)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {}


def build_mla(config, layer_number: int, norm_cls: type, opts: KernelOptions) -> torch.nn.Module:
    """megatron's MLASelfAttention with local linears, our norms and our core attention."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.multi_latent_attention import (
        MLASelfAttention,
        MLASelfAttentionSubmodules,
    )

    subs = MLASelfAttentionSubmodules(
        linear_q_proj=ColumnParallelLinear,
        linear_q_down_proj=ColumnParallelLinear,
        linear_q_up_proj=ColumnParallelLinear,
        linear_kv_down_proj=ColumnParallelLinear,
        linear_kv_up_proj=ColumnParallelLinear,
        core_attention=SDPACoreAttention,
        linear_proj=RowParallelLinear,
        q_layernorm=norm_cls,
        kv_layernorm=norm_cls,
    )
    return MLASelfAttention(
        config=config,
        submodules=subs,
        layer_number=layer_number,
        attn_mask_type=AttnMaskType.causal,
    )
