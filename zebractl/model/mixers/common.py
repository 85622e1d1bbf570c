"""What the recurrent mixers share: the short convolution and the views of a fused in_proj."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.model import ops
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


def conv(
    x: Tensor, conv1d: nn.Conv1d | None, opts: KernelOptions, cu_seqlens: Tensor | None
) -> Tensor:
    """Causal short conv + SiLU over ``x`` (SiLU alone without a convolution)."""
    if conv1d is None:
        return F.silu(x)
    return ops.short_conv(opts, x, conv1d.weight, conv1d.bias, cu_seqlens)


def delta_rule_conv(m: ModelConfig, kind: str) -> nn.Conv1d | None:
    """The depthwise short convolution over q|k|v of a KDA/GDN mixer (None without one)."""
    block = getattr(m, kind)
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    channels = 2 * d.key_dim + d.value_dim
    if not block.use_short_conv:
        return None
    return nn.Conv1d(channels, channels, block.conv_size, groups=channels, bias=False)


def merge_leading(split: list[int], n: int) -> list[int]:
    """``split`` with its first ``n`` sizes merged: in_proj's adjacent rows taken as one view."""
    return [sum(split[:n]), *split[n:]]


def fused_qkv(
    mixer: nn.Module, qkv: Tensor, cu_seqlens: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Short conv + SiLU over in_proj's adjacent q|k|v columns (or SiLU alone), split.

    ``qkv`` is a strided view of the projection: the conv reads it in place (no concatenated copy).
    """
    d = mixer.d
    x = conv(qkv, mixer.conv1d, mixer.opts, cu_seqlens)
    return x.split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
