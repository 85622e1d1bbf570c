"""Pure-PyTorch implementations of every kernel the Zebra mixers use (the CPU path).

They compute the same math as FLA's Triton kernels and are written for clarity, not speed: the chunked
delta rule uses the WY/UT form (one triangular solve per chunk), all recurrences run in fp32, and
autograd provides the backward. Shapes follow FLA: ``[B, T, H, D]``; value heads ``HV`` may exceed key
heads ``H`` (grouped-value attention: value head ``hv`` reads key head ``hv // (HV // H)``).

Recurrence of the gated delta rule, per value head, with state ``S`` of shape ``[K, V]``::

    S   = diag(exp(g_t)) S                      # decay first (g_t per key channel, or one scalar)
    S  += beta_t k_t (v_t - k_t^T S)^T          # delta update reads the decayed state
    o_t = scale * q_t^T S                       # output reads the updated state

Within a chunk of C steps, with G the cumulative log decay and S0 the state at the chunk start::

    A_ij  = -beta_i sum_c k_ic k_jc exp(G_ic - G_jc)   (i > j),   L = I - A
    u     = L^{-1} (beta v),   w = L^{-1} (beta k exp(G)),   delta = u - w S0
    o_i   = (q_i exp(G_i)) S0 + sum_{j <= i} (q_i k_j exp(G_i - G_j)) delta_j
    S_C   = exp(G_C) S0 + sum_j (k_j exp(G_C - G_j)) delta_j^T

Only differences G_i - G_j with i >= j are exponentiated, so nothing overflows however strong the decay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in fp32 (FLA's definition, eps inside)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) + eps)).to(x.dtype)


def kda_gate(f: Tensor, a_log: Tensor, dt_bias: Tensor) -> Tensor:
    """KDA log-decay ``-exp(A_log[h]) * softplus(f + dt_bias)``; f ``[B,T,HV,K]``, fp32 out."""
    hv, k = f.shape[-2], f.shape[-1]
    x = f.float() + dt_bias.float().view(hv, k)
    return -a_log.float().exp().view(hv, 1) * F.softplus(x)


def gdn_gate(a: Tensor, a_log: Tensor, dt_bias: Tensor) -> Tensor:
    """GDN log-decay ``-exp(A_log[h]) * softplus(a + dt_bias[h])``; a ``[B,T,HV]``, fp32 out."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())


def _expand_heads(x: Tensor, hv: int) -> Tensor:
    return x if x.shape[2] == hv else x.repeat_interleave(hv // x.shape[2], dim=2)


def _state(q: Tensor, b: int, h: int, dk: int, dv: int, initial: Tensor | None) -> Tensor:
    """The fp32 recurrent state ``[B, H, K, V]``: zeros, or a copy of the initial state."""
    s = q.new_zeros(b, h, dk, dv, dtype=torch.float32)
    return s if initial is None else s + initial.float()


def recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Step-by-step gated delta rule (what the chunked form is tested against).

    q, k ``[B,T,H,K]``; v ``[B,T,HV,V]``; g ``[B,T,HV,K]`` (per-channel, KDA) or ``[B,T,HV]``
    (scalar, GDN); beta ``[B,T,HV]``; state ``[B,HV,K,V]``. Returns o ``[B,T,HV,V]`` in v's dtype.
    """
    b, t, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    scale = dk**-0.5 if scale is None else scale
    qf = _expand_heads(q, hv).float() * scale
    kf = _expand_heads(k, hv).float()
    vf, bf = v.float(), beta.float()
    gf = g.float() if g.dim() == 4 else g.float()[..., None].expand(b, t, hv, dk)
    s = _state(q, b, hv, dk, dv, initial_state)
    out = []
    for i in range(t):
        s = s * gf[:, i, :, :, None].exp()
        kv = torch.einsum("bhk,bhkv->bhv", kf[:, i], s)
        s = s + torch.einsum("bhk,bhv->bhkv", bf[:, i, :, None] * kf[:, i], vf[:, i] - kv)
        out.append(torch.einsum("bhk,bhkv->bhv", qf[:, i], s))
    o = torch.stack(out, dim=1).to(v.dtype)
    return o, (s if output_final_state else None)


def _chunks(x: Tensor, t_pad: int, c: int) -> Tensor:
    """[B,T,H,...] -> [B,H,N,C,...] with zero padding at the end."""
    if x.shape[1] != t_pad:
        pad = [0, 0] * (x.dim() - 2) + [0, t_pad - x.shape[1]]
        x = F.pad(x, pad)
    b, _, h = x.shape[:3]
    return x.reshape(b, t_pad // c, c, h, *x.shape[3:]).transpose(1, 3).transpose(2, 3)


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule (WY/UT form); same arguments and result as the recurrent form.

    Padding steps at the end carry beta = 0 and g = 0, so they change neither the state nor the outputs
    that are kept.
    """
    b, t, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    c = chunk_size
    scale = dk**-0.5 if scale is None else scale
    t_pad = -(-t // c) * c
    scalar = g.dim() == 3
    qc = _chunks(_expand_heads(q, hv).float() * scale, t_pad, c)  # [B,HV,N,C,K]
    kc = _chunks(_expand_heads(k, hv).float(), t_pad, c)
    vc = _chunks(v.float(), t_pad, c)  # [B,HV,N,C,V]
    bc = _chunks(beta.float(), t_pad, c)  # [B,HV,N,C]
    gc = _chunks(g.float(), t_pad, c).cumsum(3)  # [B,HV,N,C(,K)]
    gk = gc[..., None] if scalar else gc  # broadcastable against [..., C, K]

    idx = torch.arange(c, device=q.device)
    strict = idx[:, None] > idx[None, :]
    incl = idx[:, None] >= idx[None, :]
    eye = torch.eye(c, device=q.device, dtype=torch.float32)

    s = _state(q, b, hv, dk, dv, initial_state)
    outs = []
    for n in range(t_pad // c):
        qn, kn, vn, bn = qc[:, :, n], kc[:, :, n], vc[:, :, n], bc[:, :, n]
        gn = gc[:, :, n]  # [B,HV,C] or [B,HV,C,K]
        if scalar:
            diff = gn[..., :, None] - gn[..., None, :]  # [B,HV,C,C]
            decay_strict = diff.masked_fill(~strict, float("-inf")).exp()
            decay_incl = diff.masked_fill(~incl, float("-inf")).exp()
            a = -(bn[..., None] * (kn @ kn.transpose(-1, -2)) * decay_strict)
            qk = (qn @ kn.transpose(-1, -2)) * decay_incl
        else:
            diff = gn[..., :, None, :] - gn[..., None, :, :]  # [B,HV,C,C,K]
            decay_strict = diff.masked_fill(~strict[..., None], float("-inf")).exp()
            decay_incl = diff.masked_fill(~incl[..., None], float("-inf")).exp()
            a = -bn[..., None] * torch.einsum("bhic,bhjc,bhijc->bhij", kn, kn, decay_strict)
            qk = torch.einsum("bhic,bhjc,bhijc->bhij", qn, kn, decay_incl)
        lower = eye - a
        g_n = gk[:, :, n]  # [B,HV,C,1] or [B,HV,C,K]
        rhs = torch.cat([bn[..., None] * vn, bn[..., None] * kn * g_n.exp()], dim=-1)
        sol = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        u, w = sol[..., :dv], sol[..., dv:]
        delta = u - w @ s
        outs.append((qn * g_n.exp()) @ s + qk @ delta)
        g_last = g_n[..., -1:, :]  # [B,HV,1,K or 1]
        s = (
            s * g_last.transpose(-1, -2).exp()
            + (kn * (g_last - g_n).exp()).transpose(-1, -2) @ delta
        )
    o = torch.stack(outs, dim=2)  # [B,HV,N,C,V]
    o = o.reshape(b, hv, t_pad, dv).transpose(1, 2)[:, :t].to(v.dtype)
    return o, (s if output_final_state else None)


def recurrent_scalar_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Step-by-step scalar-decay linear attention: ``S = exp(g_t) S + k_t v_t^T; o_t = scale q_t^T S``.

    This is Mamba2's SSD with q = C, k = dt * B, v = x, g = dt * A. Shapes: q, k ``[B,T,H,K]``,
    v ``[B,T,H,V]``, g ``[B,T,H]``.
    """
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    s = _state(q, b, h, dk, dv, initial_state)
    qf, kf, vf, gf = q.float() * scale, k.float(), v.float(), g.float()
    out = []
    for i in range(t):
        s = s * gf[:, i, :, None, None].exp() + kf[:, i, :, :, None] * vf[:, i, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qf[:, i], s))
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)


def chunk_scalar_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Chunked form of :func:`recurrent_scalar_gla` (FLA's simple_gla algorithm)."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    c = chunk_size
    t_pad = -(-t // c) * c
    qc = _chunks(q.float() * scale, t_pad, c)
    kc, vc = _chunks(k.float(), t_pad, c), _chunks(v.float(), t_pad, c)
    gc = _chunks(g.float(), t_pad, c).cumsum(3)  # [B,H,N,C]
    idx = torch.arange(c, device=q.device)
    incl = idx[:, None] >= idx[None, :]
    s = _state(q, b, h, dk, dv, initial_state)
    outs = []
    for n in range(t_pad // c):
        qn, kn, vn, gn = qc[:, :, n], kc[:, :, n], vc[:, :, n], gc[:, :, n]
        decay = (gn[..., :, None] - gn[..., None, :]).masked_fill(~incl, float("-inf")).exp()
        outs.append((qn * gn[..., None].exp()) @ s + ((qn @ kn.transpose(-1, -2)) * decay) @ vn)
        g_last = gn[..., -1:]  # [B,H,1]
        s = (
            s * g_last[..., None].exp()
            + (kn * (g_last - gn)[..., None].exp()).transpose(-1, -2) @ vn
        )
    o = torch.stack(outs, dim=2).reshape(b, h, t_pad, dv).transpose(1, 2)[:, :t].to(v.dtype)
    return o, (s if output_final_state else None)


def causal_conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = "silu"
) -> Tensor:
    """Depthwise causal convolution over time: x ``[B,T,D]``, weight ``[D,W]`` -> ``[B,T,D]``."""
    width = weight.shape[-1]
    y = F.conv1d(
        x.transpose(1, 2), weight.unsqueeze(1), bias, padding=width - 1, groups=x.shape[-1]
    )[..., : x.shape[1]]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    return y.transpose(1, 2)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim, computed in fp32, cast back to x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float, activation: str) -> Tensor:
    """``RMSNorm(x) * weight * act(gate)`` (norm before gate), fp32 inside; act sigmoid|swish|silu."""
    y = rms_norm(x.float(), weight, eps)
    gf = gate.float()
    act = torch.sigmoid(gf) if activation == "sigmoid" else F.silu(gf)
    return (y * act).to(x.dtype)


def group_rms_norm(x: Tensor, weight: Tensor, eps: float, groups: int) -> Tensor:
    """RMSNorm over equal groups of the last dim (Mamba2's gated-norm grouping)."""
    shape = x.shape
    xf = x.float().reshape(*shape[:-1], groups, shape[-1] // groups)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (y.reshape(shape) * weight.float()).to(x.dtype)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up``."""
    return F.silu(gate) * up
