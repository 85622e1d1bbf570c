"""MLA through megatron-core's MLASelfAttention, with a torch SDPA core attention.

megatron 0.16.1's local DotProductAttention cannot serve MLA (it rejects the k/v channel arguments MLA
passes, and materialises [b, n, s, s] scores); ours calls ``F.scaled_dot_product_attention`` (flash or
memory-efficient kernels on CUDA) with causal masking and MLA's softmax scale. For documents kept
apart (``data.packing: isolated``) it calls flash attention's variable-length kernel
(``torch.nn.attention.varlen``) with the documents' offsets where that kernel serves (a CUDA tensor
in bf16/fp16, no attention dropout: :func:`varlen_usable`), and SDPA with the documents'
block-diagonal causal bias elsewhere (CPU, fp32, dropout). The bias costs ``[B, T, T]`` memory and
runs SDPA's memory-efficient kernel instead of flash's: on the H200 the SFT run with it trained at
0.885x of pretraining at the same shape (benchmarks/README.md).

MLA's constructor needs :func:`zebractl.runtime.megatron_compat.patched` (no TE, no CUDA), entered by
:func:`build_mla` for exactly that call. Its forward needs no patch: megatron's rotary module is
replaced by :class:`RotaryTable`, which computes the same table on the model's device.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.module import MegatronModule
from torch import nn

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
        """``attention_mask``: None (causal over the row) or the row's
        :class:`~zebractl.model.segments.Segments` (causal within each document)."""
        if packed_seq_params is not None:
            raise NotImplementedError("packed sequences are not supported by SDPACoreAttention")
        dropout_p = self.dropout_p if self.training else 0.0
        if attention_mask is not None and varlen_usable(query.device, query.dtype, dropout_p):
            return varlen_attention(query, key, value, attention_mask, self.softmax_scale)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        bias = None if attention_mask is None else attention_mask.attention_bias(q.dtype)
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=bias,
            is_causal=bias is None,
            scale=self.softmax_scale,
            dropout_p=dropout_p,
        )
        s, b = query.shape[0], query.shape[1]
        return o.permute(2, 0, 1, 3).reshape(s, b, -1)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {}


@functools.cache
def _varlen_kernel():
    """``(varlen_attn, its causal keyword arguments, whether it takes ``scale``)``, or None where
    this torch has no variable-length attention. torch 2.10 spells causality ``is_causal=True``;
    later versions ``window_size=(-1, 0)`` and add ``scale``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return varlen_attn, causal, "scale" in params


def varlen_usable(device: torch.device, dtype: torch.dtype, dropout_p: float) -> bool:
    """Whether documents kept apart go through flash's variable-length kernel (else the bias)."""
    return (
        device.type == "cuda"
        and dtype in (torch.bfloat16, torch.float16)
        and dropout_p == 0.0
        and _varlen_kernel() is not None
    )


def varlen_attention(query, key, value, segments, softmax_scale: float | None):
    """Causal attention within each document of ``segments``, megatron's ``[s, b, n, d]`` in,
    ``[s, b, n * dv]`` out. The batch runs as one sequence of ``b * s`` tokens (the order of
    ``segments.cu_seqlens``). Flash needs one head size for q, k and v (a multiple of 8): MLA's
    values (128) are zero-padded to its query/key size (192) and the padding cut from the output;
    the scale is taken from the unpadded query size."""
    kernel, causal, takes_scale = _varlen_kernel()
    s, b, n, dq = query.shape
    dv = value.shape[-1]
    scale = softmax_scale if softmax_scale is not None else dq**-0.5
    width = -(-max(dq, dv) // 8) * 8
    q, k, v = (
        F.pad(t.transpose(0, 1).reshape(b * s, t.shape[2], t.shape[3]), (0, width - t.shape[3]))
        for t in (query, key, value)
    )
    if not takes_scale:  # the kernel's own scale is 1/sqrt(width)
        q = q * (scale * width**0.5)
    cu, max_len = segments.varlen_args()
    extra = {"scale": scale} if takes_scale else {}
    o = kernel(q, k, v, cu, cu, max_len, max_len, **causal, **extra)
    return o[..., :dv].reshape(b, s, n * dv).transpose(0, 1).contiguous()


class RotaryTable(nn.Module):
    """MLA's rotary table from megatron's own frequencies (RoPE or YaRN), on the model's device.

    megatron's RotaryEmbedding keeps its inverse frequencies as plain tensors and moves them to
    ``torch.cuda.current_device()`` at the first forward: that fails without CUDA, and would pull a
    CPU model's table onto a GPU. This module takes the frequencies (and YaRN's mscale) from the
    megatron module MLA built, keeps them fp32 in a buffer that follows the model's device (never its
    dtype, as megatron's), and computes the table as megatron does: ``cat(p * f, p * f)`` per position.
    """

    get_rotary_seq_len = RotaryEmbedding.get_rotary_seq_len  # uses only its arguments

    def __init__(self, rope: RotaryEmbedding) -> None:
        super().__init__()
        from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
            YarnRotaryEmbedding,
        )

        self.yarn = isinstance(rope, YarnRotaryEmbedding)
        # megatron's table at position 1 is the frequencies themselves (YaRN's blend included)
        table = rope.get_emb(2)
        emb, self.mscale = table if self.yarn else (table, 1.0)
        self._inv_freq = emb[1, 0, 0, : emb.shape[-1] // 2].float().cpu()
        self.register_buffer(
            "inv_freq", self._inv_freq.to(torch.get_default_device()), persistent=False
        )

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.inv_freq = self._inv_freq.to(self.inv_freq.device)
        return out

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None):
        """``[s, 1, 1, dim]`` angles (and YaRN's mscale), as megatron's module returns them."""
        if packed_seq:
            raise NotImplementedError("packed sequences are not supported by MLA here")
        f = self.inv_freq
        seq = torch.arange(max_seq_len, device=f.device, dtype=f.dtype) + offset
        freqs = torch.outer(seq, f)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
        return (emb, self.mscale) if self.yarn else emb

    def extra_repr(self) -> str:
        return f"dim={2 * self.inv_freq.numel()}, yarn={self.yarn}, mscale={self.mscale}"


def build_mla(config, layer_number: int, norm_cls: type, opts: KernelOptions) -> torch.nn.Module:
    """megatron's MLASelfAttention with local linears, our norms, core attention and rotary table."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.multi_latent_attention import (
        MLASelfAttention,
        MLASelfAttentionSubmodules,
    )

    from zebractl.model.layers import RowLinear, process_groups
    from zebractl.runtime import megatron_compat

    if config.context_parallel_size != 1 or config.tensor_model_parallel_size != 1:
        raise NotImplementedError("MLA here supports tensor and context parallel size 1 only")
    subs = MLASelfAttentionSubmodules(
        linear_q_proj=ColumnParallelLinear,
        # MLA accepts only these exact classes for its down projections
        linear_q_down_proj=ColumnParallelLinear,
        linear_q_up_proj=ColumnParallelLinear,
        linear_kv_down_proj=ColumnParallelLinear,
        linear_kv_up_proj=ColumnParallelLinear,
        core_attention=SDPACoreAttention,
        linear_proj=RowLinear,
        q_layernorm=norm_cls,
        kv_layernorm=norm_cls,
    )
    with megatron_compat.patched():
        attn = MLASelfAttention(
            config=config,
            submodules=subs,
            layer_number=layer_number,
            attn_mask_type=AttnMaskType.causal,
            pg_collection=process_groups(),
        )
        attn.rotary_pos_emb = RotaryTable(attn.rotary_pos_emb)
    for layer in attn.modules():
        if isinstance(layer, ColumnParallelLinear):
            # tp = 1: no input-gradient all-reduce, so no process group (see zebractl.model.layers)
            layer.disable_grad_reduce = True
    return attn
