"""Gated DeltaNet (see :mod:`zebractl.model.mixers`): ``GDNMixer`` in the fused Primus layout
(training), ``GDNUnfused`` with FLA's names (the Hugging Face model); one op call serves both.

Init (:meth:`GDNMixer.init_own`, FLA's GatedDeltaNet): A_log = log U(0, 16) per value head (the 0
end nudged to the smallest positive float so log never gives -inf); dt_bias = softplus^-1(dt),
dt = exp(U(ln 1e-3, ln 0.1)) clamped >= 1e-4, per value head.
"""

from __future__ import annotations

import torch
from torch import nn

from zebractl.layout.gdn import gdn_in_proj_rows
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


def _gdn(
    mixer: nn.Module,
    qkv: tuple[Tensor, Tensor, Tensor],
    alpha: Tensor,
    beta: Tensor,
    cu_seqlens: Tensor | None = None,
    cache: Cache | None = None,
) -> Tensor:
    """``ops.gdn`` with the mixer's decay parameters and options (and a cache's state)."""
    out = ops.gdn(
        mixer.opts,
        *qkv,
        alpha,
        beta,
        mixer.A_log,
        mixer.dt_bias,
        allow_neg_eigval=mixer.cfg.allow_neg_eigval,
        cu_seqlens=cu_seqlens,
        **state_io(cache),
    )
    return keep_state(out, cache)


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
        qkv, (z, beta, alpha) = split_in_proj(self, self.in_proj(x))
        o = _gdn(self, fused_qkv(self, qkv, cu_seqlens), alpha, beta, cu_seqlens)
        gate = z.view(b, t, d.num_v_heads, d.head_v_dim) if self.cfg.use_gate else None
        return gated_output(self.out_norm, self.out_proj, o, gate)

    def init_own(self, name: str, p: Tensor, gen: torch.Generator) -> None:
        """Initialise ``A_log`` or ``dt_bias`` (see the module docstring)."""
        if name == "dt_bias":
            inv_softplus_dt_(p, gen)
        elif name == "A_log":
            log_uniform_(p, 0, 16, gen)
        else:
            raise no_init_rule(self, name)


class GDNUnfused(DeltaRuleUnfused):
    """Gated DeltaNet with FLA's names (``GatedDeltaNetForCausalLM``'s ``attn``), with a cache."""

    def __init__(self, m: ModelConfig, opts: KernelOptions) -> None:
        assert m.gdn is not None
        d = m.linear_attention_dims("gdn")
        super().__init__(m, "gdn", d.num_v_heads, m.gdn.gate_activation, opts)
        h, bias = m.hidden_size, m.linear_bias
        *_, z, beta, alpha = gdn_in_proj_rows(m)
        self.g_proj = nn.Linear(h, z, bias=bias) if z else None
        self.b_proj = nn.Linear(h, beta, bias=bias)
        self.a_proj = nn.Linear(h, alpha, bias=bias)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        b, t, _ = x.shape
        d = self.d
        out = _gdn(self, self.qkv(x, cache), self.a_proj(x), self.b_proj(x), cache=cache)
        gate = None
        if self.g_proj is not None:
            gate = self.g_proj(x).view(b, t, d.num_v_heads, d.head_v_dim)
        return gated_output(self.o_norm, self.o_proj, out, gate)
