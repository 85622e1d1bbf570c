"""The recurrent mixers: Kimi Delta Attention, Gated DeltaNet and Mamba2, in the fused Primus layout.

Tensor names and shapes are those of :mod:`zebractl.layout`. Mixers are tensor-parallel size 1 (KDA's
f_a/g_a bottleneck cannot be split; the schema and the builder refuse tp > 1 for recurrent mixers), so
their projections are plain ``nn.Linear``. Inputs and outputs are batch-first ``[B, T, H]``.

``forward(x, cu_seqlens)``: with ``cu_seqlens`` (``x`` one flattened sequence ``[1, N, H]``) each
document is mixed on its own, its convolution and state starting from zero
(:mod:`zebractl.model.segments`).

Mamba2: the SSD scan is computed as scalar-decay linear attention (q = C, k = dt*B, v = x,
g = dt*A), which is exactly FLA's ``chunk_simple_gla`` on CUDA — no mamba_ssm or causal_conv1d needed;
``o + D*x`` is then gated and normalised per group like Mamba2's ``RMSNormGated(norm_before_gate=False)``:
``y = GroupRMSNorm(o * silu(z)) * w``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.layout import gdn_in_proj_rows, kda_in_proj_rows, mamba2_in_proj_rows
from zebractl.model import ops
from zebractl.model.layers import GatedNorm
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


def _conv(
    x: Tensor, conv: nn.Conv1d | None, opts: KernelOptions, cu_seqlens: Tensor | None
) -> Tensor:
    if conv is None:
        return F.silu(x)
    return ops.short_conv(opts, x, conv.weight, conv.bias, cu_seqlens)


def _delta_rule_block(m: ModelConfig, kind: str) -> nn.Conv1d | None:
    """The depthwise short convolution over q|k|v of a KDA/GDN mixer (None without one)."""
    block = getattr(m, kind)
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    channels = 2 * d.key_dim + d.value_dim
    if not block.use_short_conv:
        return None
    return nn.Conv1d(channels, channels, block.conv_size, groups=channels, bias=False)


def _leading(split: list[int], n: int) -> list[int]:
    """``split`` with its first ``n`` sizes merged: in_proj's adjacent rows taken as one view."""
    return [sum(split[:n]), *split[n:]]


def _qkv(mixer: nn.Module, qkv: Tensor, cu_seqlens: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Short conv + SiLU over in_proj's adjacent q|k|v columns (or SiLU alone), split.

    ``qkv`` is a strided view of the projection: the conv reads it in place (no concatenated copy).
    """
    d = mixer.d
    x = _conv(qkv, mixer.conv1d, mixer.opts, cu_seqlens)
    return x.split([d.key_dim, d.key_dim, d.value_dim], dim=-1)


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
        self.conv1d = _delta_rule_block(m, "kda")
        self.f_b_proj = nn.Linear(d.head_v_dim, d.num_v_heads * d.head_k_dim, bias=False)
        self.g_b_proj = nn.Linear(d.head_v_dim, d.value_dim, bias=True)
        self.A_log = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(d.num_v_heads * d.head_k_dim, dtype=torch.float32))
        self.out_norm = GatedNorm(d.head_v_dim, m.norm.eps, "sigmoid", opts)
        self.out_proj = nn.Linear(d.value_dim, h, bias=m.linear_bias)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        qkv, f_a, g_a, beta = self.in_proj(x).split(_leading(self.split, 3), dim=-1)
        q, k, v = _qkv(self, qkv, cu_seqlens)
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
        self.conv1d = _delta_rule_block(m, "gdn")
        self.A_log = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(d.num_v_heads, dtype=torch.float32))
        self.out_norm = GatedNorm(d.head_v_dim, m.norm.eps, m.gdn.gate_activation, opts)
        self.out_proj = nn.Linear(d.value_dim, h, bias=m.linear_bias)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        qkv, z, beta, alpha = self.in_proj(x).split(_leading(self.split, 3), dim=-1)
        q, k, v = _qkv(self, qkv, cu_seqlens)
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
        z, xbc, dt = self.in_proj(x).split([self.split[0], *_leading(self.split[1:], 3)], dim=-1)
        xbc = _conv(
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


MIXERS = {"kda": KDAMixer, "gdn": GDNMixer, "mamba2": Mamba2Mixer}
