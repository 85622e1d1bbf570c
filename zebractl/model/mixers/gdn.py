"""Gated DeltaNet in the fused Primus layout (see :mod:`zebractl.model.mixers`)."""

from __future__ import annotations

import torch
from torch import nn

from zebractl.layout.gdn import gdn_in_proj_rows
from zebractl.model import ops
from zebractl.model.mixers.common import delta_rule_conv, fused_qkv, merge_leading
from zebractl.model.norms import GatedNorm
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


class GDNMixer(nn.Module):
    """Gated DeltaNet. in_proj rows: q | k | v | z (output gate) | beta | alpha (decay logits)."""

    def __init__(self, m: ModelConfig, opts: KernelOptions) -> None:
        super().__init__()
        assert m.gdn is not None
        self.cfg, self.opts = m.gdn, opts
        d = m.linear_attention_dims("gdn")
        self.d = d
        h = m.hidden_size
        self.split = gdn_in_proj_rows(m)
        self.in_proj = nn.Linear(h, sum(self.split), bias=m.linear_bias)
        self.conv1d = delta_rule_conv(m, "gdn")
        self.A_log = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.out_norm = GatedNorm(d.head_v_dim, m.norm.eps, m.gdn.gate_activation, opts)
        self.out_proj = nn.Linear(d.value_dim, h, bias=m.linear_bias)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        qkv, z, beta, alpha = self.in_proj(x).split(merge_leading(self.split, 3), dim=-1)
        q, k, v = fused_qkv(self, qkv, cu_seqlens)
        o = ops.gdn(
            self.opts,
            q.view(b, t, d.num_heads, d.head_k_dim),
            k.view(b, t, d.num_heads, d.head_k_dim),
            v.view(b, t, d.num_v_heads, d.head_v_dim),
            alpha,
            beta,
            self.A_log,
            self.dt_bias,
            allow_neg_eigval=self.cfg.allow_neg_eigval,
            cu_seqlens=cu_seqlens,
        )
        gate = z.view(b, t, d.num_v_heads, d.head_v_dim) if self.cfg.use_gate else None
        o = self.out_norm(o, gate)
        return self.out_proj(o.reshape(b, t, d.value_dim))
