"""Mamba2 in the fused Primus layout (see :mod:`zebractl.model.mixers`).

The SSD scan is computed as scalar-decay linear attention (q = C, k = dt*B, v = x,
g = dt*A), which is exactly FLA's ``chunk_simple_gla`` on CUDA — no mamba_ssm or causal_conv1d needed;
``o + D*x`` is then gated and normalised per group like Mamba2's ``RMSNormGated(norm_before_gate=False)``:
``y = GroupRMSNorm(o * silu(z)) * w``. The same module serves the Hugging Face model (its tensor
names are FLA's Mamba2 layer's), with a generation cache there.

Init (:meth:`Mamba2Mixer.init_own`): A_log = log U(1, 16), D = 1, dt_bias = softplus^-1(dt),
dt = exp(U(ln 1e-3, ln 0.1)) clamped >= 1e-4, per head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.layout.mamba2 import mamba2_in_proj_rows
from zebractl.model import ops
from zebractl.model.mixers.common import (
    Cache,
    conv,
    inv_softplus_dt_,
    keep_state,
    log_uniform_,
    merge_leading,
    no_init_rule,
    state_io,
)
from zebractl.model.norms import GroupGatedNorm, group_gated_norm
from zebractl.model.ops import KernelOptions, regions
from zebractl.schemas.preset import ModelConfig

Tensor = torch.Tensor


def ssd_inputs(
    dt: Tensor,
    dt_bias: Tensor,
    a_log: Tensor,
    bb: Tensor,
    cc: Tensor,
    groups: int,
    state_dim: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """The scan's q = C, k = dt * B (both expanded from groups to heads) and log decay g = dt * A
    from the projections ``dt [B,T,H]``, ``bb``/``cc [B,T,groups*state_dim]`` (dt = softplus(dt +
    dt_bias) and A = -exp(A_log), in fp32)."""
    b, t, nh = dt.shape
    rep = nh // groups
    dt = F.softplus(dt.float() + dt_bias.float())  # [B,T,nh]
    a = -a_log.float().exp()
    bh = bb.view(b, t, groups, state_dim).repeat_interleave(rep, dim=2)
    ch = cc.view(b, t, groups, state_dim).repeat_interleave(rep, dim=2)
    k = (bh.float() * dt[..., None]).to(dtype)
    return ch.to(dtype), k, dt * a


def ssd_output(
    o: Tensor, xh: Tensor, d: Tensor, z: Tensor, weight: Tensor, eps: float, groups: int
) -> Tensor:
    """``GroupRMSNorm((o + D * x) * silu(z)) * weight`` over ``[B,T,d_inner]`` (the skip, the gate
    and Mamba2's grouped norm; :class:`GroupGatedNorm`'s arithmetic)."""
    y = (o + xh * d.to(xh.dtype)[:, None]).reshape(z.shape)
    return group_gated_norm(y, z, weight, eps, groups)


def _glue(opts: KernelOptions) -> bool:
    """Whether the glue runs compiled (``kernels.compile``: glue, or auto on FLA's kernels)."""
    mode = opts.kernels.compile
    return mode == "glue" or (mode == "auto" and opts.backend == "fla")


@functools.cache
def _compiled(fn: Callable) -> Callable:
    """``fn`` compiled once per process (``kernels.compile: glue``): Inductor, fixed shapes, one
    graph (:mod:`zebractl.model.ops.regions`: eager past Dynamo's recompile limit)."""
    return regions.region(fn)


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
        self.norm = GroupGatedNorm(self.d_inner, m.norm.eps, mb.num_groups)
        self.out_proj = nn.Linear(self.d_inner, m.hidden_size, bias=m.linear_bias)

    def forward(
        self, x: Tensor, cu_seqlens: Tensor | None = None, cache: Cache | None = None
    ) -> Tensor:
        """``cache`` (generation, no ``cu_seqlens``): the conv's last inputs and the SSD state
        are continued from it and kept in it."""
        b, t, _ = x.shape
        z, xbc, dt = self.in_proj(x).split(
            [self.split[0], *merge_leading(self.split[1:], 3)], dim=-1
        )
        # x | B | C: adjacent columns, read in place
        xbc = conv(xbc, self.conv1d, self.opts, cu_seqlens, cache, "xbc")
        xs, bb, cc = xbc.split([self.d_inner, self.gn, self.gn], dim=-1)
        xh = xs.view(b, t, self.nheads, self.cfg.head_dim)
        glue = cache is None and self.training and _glue(self.opts)
        prep, post = (
            (_compiled(ssd_inputs), _compiled(ssd_output)) if glue else (ssd_inputs, ssd_output)
        )
        mb, n = self.cfg, self.norm
        c, k, g = prep(dt, self.dt_bias, self.A_log, bb, cc, mb.num_groups, mb.state_dim, xh.dtype)
        o = keep_state(
            ops.ssd(self.opts, c, k, xh, g, cu_seqlens=cu_seqlens, **state_io(cache)), cache
        )
        return self.out_proj(post(o, xh, self.D, z, n.weight, n.eps, n.groups))

    def init_own(self, name: str, p: Tensor, gen: torch.Generator) -> None:
        """Initialise ``A_log``, ``D`` or ``dt_bias`` (see the module docstring)."""
        if name == "dt_bias":
            inv_softplus_dt_(p, gen)
        elif name == "D":
            p.fill_(1.0)
        elif name == "A_log":
            log_uniform_(p, 1, 16, gen)
        else:
            raise no_init_rule(self, name)
