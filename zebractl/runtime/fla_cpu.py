"""Run FLA's own model classes on CPU, through FLA's naive pure-PyTorch implementations.

FLA's layers call Triton kernels that need a GPU. :func:`on_cpu` swaps them, for the duration of a
``with`` block, for FLA's own naive references: ``naive_recurrent_kda`` /
``naive_recurrent_gated_delta_rule`` with FLA's naive gates (both chunk and fused-recurrent modes),
``F.conv1d`` for ``ShortConvolution``, an fp32 gated RMSNorm and a torch SwiGLU. That is how
``zebractl verify`` checks an FLA export on a machine without a GPU. No state is carried between
calls (no cache): generation runs with ``use_cache=False``; a call that passes a recurrent or
convolution state is refused rather than silently ignored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F


def _l2(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + 1e-6)


def _no_state(kw: dict) -> None:
    if kw.get("initial_state") is not None or kw.get("cu_seqlens") is not None:
        raise NotImplementedError(
            "FLA's CPU reference path runs whole sequences only (no cache, no packed sequences)"
        )


def _beta(beta: torch.Tensor, allow_neg_eigval: bool) -> torch.Tensor:
    b = beta.float().sigmoid()
    return b * 2 if allow_neg_eigval else b


def _kda(q, k, v, g, beta, A_log=None, dt_bias=None, **kw):  # noqa: N803 - FLA's names
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda

    _no_state(kw)
    if kw.get("lower_bound") is not None or kw.get("safe_gate"):
        raise NotImplementedError("FLA's CPU reference path has no lower_bound / safe_gate gate")
    gate = naive_kda_gate(g, A_log, dt_bias)
    beta = _beta(beta, kw.get("allow_neg_eigval", False))
    o, _ = naive_recurrent_kda(_l2(q), _l2(k), v.float(), gate, beta)
    return o.to(v.dtype), None


def _gdn(q, k, v, g, beta, A_log=None, dt_bias=None, **kw):  # noqa: N803 - FLA's names
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    _no_state(kw)
    rep = v.shape[2] // q.shape[2]
    qe, ke = (_l2(x).repeat_interleave(rep, dim=2) for x in (q, k))
    gate = naive_gdn_gate(g, A_log, dt_bias)
    beta = _beta(beta, kw.get("allow_neg_eigval", False))
    o, _ = naive_recurrent_gated_delta_rule(qe, ke, v.float(), beta, gate)
    return o.to(v.dtype), None


def _conv_forward(self, x, *args, cache=None, **kw):
    if cache is not None or kw.get("cu_seqlens") is not None:
        raise NotImplementedError("FLA's CPU reference path has no convolution cache")
    w = self.weight
    y = F.conv1d(x.transpose(1, 2), w, self.bias, padding=w.shape[-1] - 1, groups=x.shape[-1])
    y = y[..., : x.shape[1]]
    act = F.silu(y) if self.activation in ("silu", "swish") else y
    return act.transpose(1, 2), None


def _gated_norm_forward(self, x, g, *args, **kw):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
    act = torch.sigmoid(g.float()) if self.activation == "sigmoid" else F.silu(g.float())
    return (y * act).to(x.dtype)


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """FLA's KDA / GDN model classes computed by FLA's naive pure-PyTorch implementations (restored after)."""
    import fla.layers.gated_deltanet as gdn_layer
    import fla.layers.kda as kda_layer
    import fla.modules.mlp as mlp_mod
    from fla.modules import FusedRMSNormGated, ShortConvolution

    patches = [
        (kda_layer, "chunk_kda", _kda),
        (kda_layer, "fused_recurrent_kda", _kda),
        (gdn_layer, "chunk_gated_delta_rule", _gdn),
        (gdn_layer, "fused_recurrent_gated_delta_rule", _gdn),
        (gdn_layer.GatedDeltaNet, "_use_fused_qkv_conv", lambda self, **kw: False),
        (ShortConvolution, "forward", _conv_forward),
        (FusedRMSNormGated, "forward", _gated_norm_forward),
        (mlp_mod, "swiglu", lambda a, b: F.silu(a) * b),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        yield
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)
