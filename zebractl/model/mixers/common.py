"""What the recurrent mixers share: the short convolution and the generation cache, the views of a
fused in_proj, KDA's and GDN's q/k/v in both layouts, and the init of the decay parameters."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.model import ops
from zebractl.model.norms import GatedNorm
from zebractl.model.ops import KernelOptions
from zebractl.schemas.preset import LinearAttentionDims, ModelConfig

KEEP_FP32 = ("A_log", "dt_bias", "D")
"""Recurrent decay parameters stay fp32 whatever the training dtype (as FLA keeps them): their
exponentials set the state's memory, and bf16 would quantise them coarsely."""

Tensor = torch.Tensor
Cache = dict[str, Any]
"""One block's generation cache (:class:`zebractl.hf.modeling.ZebraCache`): each convolution's
last inputs by name and the recurrent ``state``."""


def conv(
    x: Tensor,
    conv1d: nn.Conv1d | None,
    opts: KernelOptions,
    cu_seqlens: Tensor | None = None,
    cache: Cache | None = None,
    name: str = "",
) -> Tensor:
    """Causal short conv + SiLU over ``x`` (SiLU alone without a convolution). With ``cache`` the
    previous ``W - 1`` inputs kept under ``name`` are prepended (and the new ones kept), so a
    continuation computes exactly what the whole sequence would."""
    if conv1d is None:
        return F.silu(x)
    if cache is None:
        return ops.short_conv(opts, x, conv1d.weight, conv1d.bias, cu_seqlens)
    keep = conv1d.weight.shape[-1] - 1
    tail = cache.get(name)
    if tail is not None and x.shape[1] == 1 and keep > 0:
        return _conv_step(x, tail, conv1d)
    if tail is None:
        tail = x.new_zeros(x.shape[0], keep, x.shape[2])
    xx = torch.cat((tail, x), dim=1)
    cache[name] = xx[:, xx.shape[1] - keep :].detach()
    return ops.short_conv(opts, xx, conv1d.weight, conv1d.bias)[:, keep:]


def _conv_step(x: Tensor, tail: Tensor, conv1d: nn.Conv1d) -> Tensor:
    """One token of the causal conv + SiLU against the kept ``tail [B, W-1, D]`` (oldest first),
    which is shifted in place to end with the new input: no concatenation, no new buffer."""
    w = conv1d.weight.squeeze(1)  # [D, W]
    y = (tail * w[:, :-1].t()).sum(1, keepdim=True) + x * w[:, -1]
    if conv1d.bias is not None:
        y = y + conv1d.bias
    tail.copy_(tail.roll(-1, dims=1))
    tail[:, -1:] = x.detach()
    return F.silu(y)


def state_io(cache: Cache | None) -> dict[str, Any]:
    """The recurrent ops' state arguments for a block's cache (none without one)."""
    if cache is None:
        return {}
    return {"initial_state": cache.get("state"), "output_final_state": True}


def keep_state(result: Any, cache: Cache | None) -> Tensor:
    """A recurrent op's output; with a cache, its final state is kept there: copied into the state
    already held (one buffer for the whole generation: a CUDA graph replays against it), or
    kept as it is on the first call."""
    if cache is None:
        return result
    out, state = result
    held = cache.get("state")
    if held is not None and held.shape == state.shape and held.dtype == state.dtype:
        held.copy_(state)
    else:
        cache["state"] = state
    return out


def merge_leading(split: list[int], n: int) -> list[int]:
    """``split`` with its first ``n`` sizes merged: in_proj's adjacent rows taken as one view."""
    return [sum(split[:n]), *split[n:]]


def _short_conv(channels: int, size: int) -> nn.Conv1d:
    return nn.Conv1d(channels, channels, size, groups=channels, bias=False)


def delta_rule_conv(m: ModelConfig, kind: str) -> nn.Conv1d | None:
    """The depthwise short convolution over q|k|v of a KDA/GDN mixer (None without one)."""
    block = getattr(m, kind)
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    if not block.use_short_conv:
        return None
    return _short_conv(2 * d.key_dim + d.value_dim, block.conv_size)


def heads(d: LinearAttentionDims, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k ``[B, T, H, K]`` and v ``[B, T, HV, V]`` from ``[B, T, width]``."""
    b, t = q.shape[:2]
    return (
        q.view(b, t, d.num_heads, d.head_k_dim),
        k.view(b, t, d.num_heads, d.head_k_dim),
        v.view(b, t, d.num_v_heads, d.head_v_dim),
    )


def split_in_proj(mixer: nn.Module, y: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """A KDA/GDN in_proj output as (its q|k|v columns, the other row blocks' columns): the q|k|v
    columns as one view (``kernels.qkv_conv: fused``) or three (per_tensor: one split of the
    projection, so autograd gathers every block's gradient in one concatenation)."""
    if mixer.opts.kernels.qkv_conv == "per_tensor":
        parts = y.split(mixer.split, dim=-1)
        return list(parts[:3]), list(parts[3:])
    qkv, *rest = y.split(merge_leading(mixer.split, 3), dim=-1)
    return [qkv], rest


def fused_qkv(
    mixer: nn.Module, qkv: list[Tensor], cu_seqlens: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Short conv + SiLU over in_proj's q|k|v columns (or SiLU alone), split into heads.

    ``qkv`` (:func:`split_in_proj`): one strided view of the three blocks, convolved by one kernel
    whose output is split (``kernels.qkv_conv: fused``), or a view per block, each convolved with
    its rows of the depthwise weight into a contiguous output (per_tensor). The conv reads the
    projection in place either way (no concatenated copy).
    """
    d = mixer.d
    if len(qkv) == 3:
        return heads(d, *_conv_per_tensor(qkv, mixer.conv1d, mixer.opts, cu_seqlens))
    x = conv(qkv[0], mixer.conv1d, mixer.opts, cu_seqlens)
    return heads(d, *x.split([d.key_dim, d.key_dim, d.value_dim], dim=-1))


def _conv_per_tensor(
    parts: list[Tensor],
    conv1d: nn.Conv1d | None,
    opts: KernelOptions,
    cu_seqlens: Tensor | None,
) -> list[Tensor]:
    """Conv + SiLU of each of ``parts`` with its rows of the depthwise weight (views: their
    gradients land in the one parameter)."""
    out, start = [], 0
    for x in parts:
        n = x.shape[-1]
        if conv1d is None:
            out.append(F.silu(x))
        else:
            bias = conv1d.bias[start : start + n] if conv1d.bias is not None else None
            out.append(ops.short_conv(opts, x, conv1d.weight[start : start + n], bias, cu_seqlens))
        start += n
    return out


def gated_output(norm: nn.Module, proj: nn.Module, o: Tensor, gate: Tensor | None) -> Tensor:
    """``proj(norm(o, gate))`` with the heads of ``o`` ``[B, T, HV, V]`` flattened."""
    b, t = o.shape[:2]
    return proj(norm(o, gate).reshape(b, t, -1))


class DeltaRuleUnfused(nn.Module):
    """KDA's and GDN's shared part with FLA's names (the Hugging Face model's): separate q/k/v
    projections and short convolutions, the decay parameters, the gated output norm and projection
    (``kind``: ``kda`` or ``gdn``; ``dt_size``: dt_bias's length)."""

    def __init__(
        self, m: ModelConfig, kind: str, dt_size: int, activation: str, opts: KernelOptions
    ) -> None:
        super().__init__()
        block = getattr(m, kind)
        self.cfg, self.opts = block, opts
        d = self.d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
        h, bias = m.hidden_size, m.linear_bias
        self.q_proj = nn.Linear(h, d.key_dim, bias=bias)
        self.k_proj = nn.Linear(h, d.key_dim, bias=bias)
        self.v_proj = nn.Linear(h, d.value_dim, bias=bias)
        size = block.conv_size
        self.q_conv1d = _short_conv(d.key_dim, size) if block.use_short_conv else None
        self.k_conv1d = _short_conv(d.key_dim, size) if block.use_short_conv else None
        self.v_conv1d = _short_conv(d.value_dim, size) if block.use_short_conv else None
        self.A_log = nn.Parameter(torch.zeros(d.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(dt_size, dtype=torch.float32))
        self.o_norm = GatedNorm(d.head_v_dim, m.norm.eps, activation, opts)
        self.o_proj = nn.Linear(d.value_dim, h, bias=bias)

    def qkv(self, x: Tensor, cache: Cache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Projected, convolved (+ SiLU) and split into heads."""
        o = self.opts
        q = conv(self.q_proj(x), self.q_conv1d, o, cache=cache, name="q")
        k = conv(self.k_proj(x), self.k_conv1d, o, cache=cache, name="k")
        v = conv(self.v_proj(x), self.v_conv1d, o, cache=cache, name="v")
        return heads(self.d, q, k, v)


def log_uniform_(p: Tensor, low: float, high: float, gen: torch.Generator) -> None:
    """``p = log U(low, high)``, a draw clamped to the smallest positive float (log never -inf)."""
    u = torch.empty(p.numel(), device=p.device).uniform_(low, high, generator=gen)
    p.copy_(u.clamp(min=torch.finfo(torch.float32).tiny).log())


def inv_softplus_dt_(p: Tensor, gen: torch.Generator) -> None:
    """``p = softplus^-1(dt)``, ``dt = exp(U(ln 1e-3, ln 0.1))`` clamped >= 1e-4 (Mamba's dt_bias)."""
    lo, hi = math.log(1e-3), math.log(0.1)
    r = torch.rand(p.numel(), generator=gen, device=p.device)
    dt = torch.exp(r * (hi - lo) + lo).clamp(min=1e-4)
    p.copy_(dt + torch.log(-torch.expm1(-dt)))


def no_init_rule(mixer: nn.Module, name: str) -> RuntimeError:
    """The error for a parameter of ``mixer`` that its ``init_own`` has no rule for."""
    return RuntimeError(f"no init rule for {type(mixer).__name__} parameter {name}")
