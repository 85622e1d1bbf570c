"""Kimi Delta Attention in the fused Primus layout (see :mod:`zebractl.model.mixers`)."""

from __future__ import annotations

import torch
from torch import nn

from zebractl.layout.kda import kda_in_proj_rows
from zebractl.model import ops
from zebractl.model.mixers.common import delta_rule_conv, fused_qkv, merge_leading
from zebractl.model.norms import GatedNorm
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


class KDAMixer(nn.Module):
    """Kimi Delta Attention. in_proj rows: q | k | v | f_a | g_a | beta."""

    def __init__(self, m: ModelConfig, opts: KernelOptions) -> None:
        super().__init__()
        assert m.kda is not None
        self.cfg, self.opts = m.kda, opts
        d = m.linear_attention_dims("kda")
        self.d = d
        h = m.hidden_size
        self.split = kda_in_proj_rows(m)
        self.in_proj = nn.Linear(h, sum(self.split), bias=m.linear_bias)
        self.conv1d = delta_rule_conv(m, "kda")
        self.f_b_proj = nn.Linear(d.head_v_dim, d.num_v_heads * d.head_k_dim, bias=False)
        self.g_b_proj = nn.Linear(d.head_v_dim, d.value_dim, bias=True)
        self.A_log = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(d.num_v_heads * d.head_k_dim, dtype=torch.float32))
        self.out_norm = GatedNorm(d.head_v_dim, m.norm.eps, "sigmoid", opts)
        self.out_proj = nn.Linear(d.value_dim, h, bias=m.linear_bias)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        qkv, f_a, g_a, beta = self.in_proj(x).split(merge_leading(self.split, 3), dim=-1)
        q, k, v = fused_qkv(self, qkv, cu_seqlens)
        f = self.f_b_proj(f_a).view(b, t, d.num_v_heads, d.head_k_dim)
        o = ops.kda(
            self.opts,
            q.view(b, t, d.num_heads, d.head_k_dim),
            k.view(b, t, d.num_heads, d.head_k_dim),
            v.view(b, t, d.num_v_heads, d.head_v_dim),
            f,
            beta,
            self.A_log,
            self.dt_bias,
            allow_neg_eigval=self.cfg.allow_neg_eigval,
            safe_gate=self.cfg.safe_gate,
            lower_bound=self.cfg.lower_bound,
            cu_seqlens=cu_seqlens,
        )
        gate = self.g_b_proj(g_a).view(b, t, d.num_v_heads, d.head_v_dim)
        o = self.out_norm(o, gate)
        return self.out_proj(o.reshape(b, t, d.value_dim))
