"""Mamba2 in the fused Primus layout (see :mod:`zebractl.model.mixers`).

The SSD scan is computed as scalar-decay linear attention (q = C, k = dt*B, v = x,
g = dt*A), which is exactly FLA's ``chunk_simple_gla`` on CUDA — no mamba_ssm or causal_conv1d needed;
``o + D*x`` is then gated and normalised per group like Mamba2's ``RMSNormGated(norm_before_gate=False)``:
``y = GroupRMSNorm(o * silu(z)) * w``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.layout.mamba2 import mamba2_in_proj_rows
from zebractl.model import ops
from zebractl.model.mixers.common import conv, merge_leading
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


class Mamba2Mixer(nn.Module):
    """Mamba2. in_proj rows: z | x | B | C | dt; conv over x | B | C (with bias)."""

    def __init__(self, m: ModelConfig, opts: KernelOptions) -> None:
        super().__init__()
        assert m.mamba2 is not None
        self.cfg, self.opts = m.mamba2, opts
        mb, dims = m.mamba2, m.mamba2_dims
        self.d_inner, self.nheads = dims.d_inner, dims.num_heads
        self.gn = mb.num_groups * mb.state_dim
        conv_dim = self.d_inner + 2 * self.gn
        self.split = mamba2_in_proj_rows(m)
        self.in_proj = nn.Linear(m.hidden_size, sum(self.split), bias=m.linear_bias)
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, mb.conv_size, groups=conv_dim, bias=mb.conv_bias
        )
        self.A_log = nn.Parameter(torch.empty(self.nheads, dtype=torch.float32))
        self.D = nn.Parameter(torch.empty(self.nheads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(self.nheads, dtype=torch.float32))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(self.d_inner))
        self.eps = m.norm.eps
        self.out_proj = nn.Linear(self.d_inner, m.hidden_size, bias=m.linear_bias)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        mb, nh, p = self.cfg, self.nheads, self.cfg.head_dim
        z, xbc, dt = self.in_proj(x).split(
            [self.split[0], *merge_leading(self.split[1:], 3)], dim=-1
        )
        xbc = conv(
            xbc, self.conv1d, self.opts, cu_seqlens
        )  # x | B | C: adjacent columns, read in place
        xs, bb, cc = xbc.split([self.d_inner, self.gn, self.gn], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())  # [B,T,nh]
        a = -self.A_log.float().exp()
        rep = nh // mb.num_groups
        bh = bb.view(b, t, mb.num_groups, mb.state_dim).repeat_interleave(rep, dim=2)
        ch = cc.view(b, t, mb.num_groups, mb.state_dim).repeat_interleave(rep, dim=2)
        xh = xs.view(b, t, nh, p)
        k = (bh.float() * dt[..., None]).to(xh.dtype)
        g = (dt * a).to(torch.float32)
        o = ops.ssd(self.opts, ch.to(xh.dtype), k, xh, g, cu_seqlens=cu_seqlens)
        y = o + xh * self.D.to(xh.dtype)[:, None]
        y = y.reshape(b, t, self.d_inner) * F.silu(z)
        y = ops.torch_ops.group_rms_norm(y, self.norm.weight, self.eps, mb.num_groups)
        return self.out_proj(y)
