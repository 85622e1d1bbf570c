"""Kimi Delta Attention (see :mod:`zebractl.model.mixers`): ``KDAMixer`` in the fused Primus layout
(training), ``KDAUnfused`` with FLA's names (the Hugging Face model); one op call serves both.

Init (:meth:`KDAMixer.init_own`, FLA's): A_log = log U(1, 16) per value head (0 with safe_gate);
dt_bias = softplus^-1(dt), dt = exp(U(ln 1e-3, ln 0.1)) clamped >= 1e-4, per (value head, key
channel).
"""

from __future__ import annotations

import torch
from torch import nn

from zebractl.layout.kda import kda_in_proj_rows
from zebractl.model import ops
from zebractl.model.mixers.common import (
    Cache,
    DeltaRuleUnfused,
    delta_rule_conv,
    fused_qkv,
    gated_output,
    inv_softplus_dt_,
    keep_state,
    log_uniform_,
    no_init_rule,
    split_in_proj,
    state_io,
)
from zebractl.model.norms import GatedNorm
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


def _kda(
    mixer: nn.Module,
    qkv: tuple[Tensor, Tensor, Tensor],
    f: Tensor,
    beta: Tensor,
    cu_seqlens: Tensor | None = None,
    cache: Cache | None = None,
) -> Tensor:
    """``ops.kda`` with the mixer's decay parameters and options (and a cache's state)."""
    cfg = mixer.cfg
    out = ops.kda(
        mixer.opts,
        *qkv,
        f,
        beta,
        mixer.A_log,
        mixer.dt_bias,
        allow_neg_eigval=cfg.allow_neg_eigval,
        safe_gate=cfg.safe_gate,
        lower_bound=cfg.lower_bound,
        cu_seqlens=cu_seqlens,
        **state_io(cache),
    )
    return keep_state(out, cache)


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
        qkv, (f_a, g_a, beta) = split_in_proj(self, self.in_proj(x))
        qkv = fused_qkv(self, qkv, cu_seqlens)
        f = self.f_b_proj(f_a).view(b, t, d.num_v_heads, d.head_k_dim)
        o = _kda(self, qkv, f, beta, cu_seqlens)
        gate = self.g_b_proj(g_a).view(b, t, d.num_v_heads, d.head_v_dim)
        return gated_output(self.out_norm, self.out_proj, o, gate)

    def init_own(self, name: str, p: Tensor, gen: torch.Generator) -> None:
        """Initialise ``A_log`` or ``dt_bias`` (see the module docstring)."""
        if name == "dt_bias":
            inv_softplus_dt_(p, gen)
        elif name == "A_log" and self.cfg.safe_gate:
            p.zero_()
        elif name == "A_log":
            log_uniform_(p, 1, 16, gen)
        else:
            raise no_init_rule(self, name)


class KDAUnfused(DeltaRuleUnfused):
    """Kimi Delta Attention with FLA's names (``KDAForCausalLM``'s ``attn``), with a cache."""

    def __init__(self, m: ModelConfig, opts: KernelOptions) -> None:
        d = m.linear_attention_dims("kda")
        super().__init__(m, "kda", d.num_v_heads * d.head_k_dim, "sigmoid", opts)
        h, bias = m.hidden_size, m.linear_bias
        *_, fa, ga, beta = kda_in_proj_rows(m)
        self.f_proj = nn.Sequential(
            nn.Linear(h, fa, bias=bias), nn.Linear(fa, d.num_v_heads * d.head_k_dim, bias=False)
        )
        self.g_proj = nn.Sequential(nn.Linear(h, ga, bias=bias), nn.Linear(ga, d.value_dim))
        self.b_proj = nn.Linear(h, beta, bias=bias)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        qkv = self.qkv(x, cache)
        f = self.f_proj(x).view(b, t, d.num_v_heads, d.head_k_dim)
        out = _kda(self, qkv, f, self.b_proj(x), cache=cache)
        gate = self.g_proj(x).view(b, t, d.num_v_heads, d.head_v_dim)
        return gated_output(self.o_norm, self.o_proj, out, gate)
