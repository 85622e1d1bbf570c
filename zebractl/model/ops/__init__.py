"""Kernel dispatch: one interface, two implementations (FLA Triton kernels on CUDA, pure PyTorch).

The mixers call these functions only, so the model code is identical on both backends; the backend is
chosen once, when the model is built (``kernels.backend``: ``auto`` = FLA on CUDA, torch elsewhere).
Raw projections go in (un-normalised q/k, gate and beta logits): each backend applies the q/k L2 norm,
the decay gate and the beta sigmoid where it is cheapest (FLA: inside the kernel when the matching
``kernels.*_in_kernel`` toggle is on).

Generation steps a carried state a token (or a few) at a time: there the fla backend runs FLA's fused
recurrent kernels instead of its chunk kernels (:func:`recurrent_step` says when), on the same
arguments and with the same meaning (the decay gate in log space, the beta sigmoid, the q/k L2 norm,
the scale: ``K**-0.5``, SSD's 1; the fp32 state ``[B, H, K, V]``); training and every forward
without a cache stay on the chunk kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from zebractl.model.ops import torch_ops as T
from zebractl.model.segments import per_document
from zebractl.schemas.recipe import KernelsConfig

Tensor = torch.Tensor
Backend = Literal["fla", "torch"]


@dataclass(frozen=True)
class KernelOptions:
    """How the math is executed (never what it is): the resolved backend and the recipe's toggles.

    The toggles are not repeated here: ``kernels`` is the recipe's ``KernelsConfig`` itself, and the
    ops read ``opts.kernels.<toggle>``, so a toggle is declared once, in the schema. ``backend`` is
    resolved for the device (``kernels.backend`` may still say ``auto``).
    """

    backend: Backend
    kernels: KernelsConfig = field(default_factory=KernelsConfig)

    def fla(self, toggle: bool) -> bool:
        """Whether to use the FLA kernel for a component whose toggle (``kernels.*``) is this."""
        return self.backend == "fla" and toggle


def resolve_backend(requested: str, device: torch.device | str | None = None) -> Backend:
    """auto -> fla on CUDA (when FLA is importable), torch otherwise; fla without CUDA is an error."""
    dev = torch.device(device) if device is not None else None
    cuda = dev.type == "cuda" if dev is not None else torch.cuda.is_available()
    if requested == "torch":
        return "torch"
    if requested == "fla":
        if not cuda:
            raise RuntimeError(
                "kernels.backend is 'fla' but FLA's Triton kernels need a CUDA "
                "device; use kernels.backend=torch (or auto) on CPU"
            )
        return "fla"
    if cuda:
        try:
            import fla.ops.utils  # noqa: F401 - FLA and Triton import
        except ImportError:  # pragma: no cover - depends on the machine
            return "torch"
        return "fla"
    return "torch"


def kernel_options(kernels: KernelsConfig | None, device: torch.device | str) -> KernelOptions:
    """KernelOptions over a recipe's kernels section (defaults when None), the backend resolved for
    ``device``. (Here, not in zebractl.model.model: the background compilation's step needs it
    without importing megatron-core.)"""
    k = KernelsConfig() if kernels is None else kernels
    return KernelOptions(backend=resolve_backend(k.backend, device), kernels=k)


RECURRENT_MAX_TOKENS = 64
"""The most tokens a call with a cache runs through FLA's fused recurrent kernels (FLA's own layers
switch at the same length in inference: ``q_len <= 64``)."""


def recurrent_step(
    opts: KernelOptions, x: Tensor, cu_seqlens: Tensor | None, output_final_state: bool
) -> bool:
    """Whether a recurrent op on ``x`` ``[B, T, ...]`` runs FLA's fused recurrent kernel instead of
    its chunk kernels: on the fla backend, for a generation step (the state kept:
    ``output_final_state``, no ``cu_seqlens``) of at most :data:`RECURRENT_MAX_TOKENS` tokens while
    no gradient is recorded (those kernels have no backward). The torch backend never does."""
    return (
        opts.backend == "fla"
        and output_final_state
        and cu_seqlens is None
        and x.shape[1] <= RECURRENT_MAX_TOKENS
        and not torch.is_grad_enabled()
    )


def _check_varlen(
    cu_seqlens: Tensor | None, x: Tensor, initial_state: Tensor | None, final: bool
) -> None:
    if cu_seqlens is not None and (x.shape[0] != 1 or initial_state is not None or final):
        raise ValueError(
            "cu_seqlens: the documents of one flattened sequence (batch 1), from a zero state"
        )


def _beta(beta_raw: Tensor, allow_neg_eigval: bool) -> Tensor:
    b = torch.sigmoid(beta_raw.float())
    return b * 2 if allow_neg_eigval else b


def _torch_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta_raw: Tensor,
    allow_neg_eigval: bool,
    initial_state: Tensor | None,
    output_final_state: bool,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """KDA's and GDN's torch path once the decay ``g`` is computed (l2-normed q/k, sigmoid beta);
    with ``cu_seqlens``, each document on its own from a zero state."""
    if cu_seqlens is not None:
        return per_document(
            lambda *xs: _torch_delta_rule(*xs, allow_neg_eigval, None, False),
            cu_seqlens,
            q, k, v, g, beta_raw,
        )  # fmt: skip
    o, s = T.chunk_delta_rule(
        T.l2norm(q),
        T.l2norm(k),
        v,
        g,
        _beta(beta_raw, allow_neg_eigval),
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    return (o, s) if output_final_state else o


def kda(
    opts: KernelOptions,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    f: Tensor,
    beta_raw: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    *,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Kimi Delta Attention on raw projections: q, k ``[B,T,H,K]``, v ``[B,T,HV,V]``,
    f (decay logits) ``[B,T,HV,K]``, beta_raw ``[B,T,HV]`` -> ``[B,T,HV,V]``.

    ``initial_state`` ``[B,HV,K,V]`` (fp32) continues a sequence; with ``output_final_state``
    the result is ``(output, final state)`` (generation's cache). ``cu_seqlens`` (B = 1): the
    documents' offsets, each run from a zero state (:mod:`zebractl.model.segments`)."""
    _check_varlen(cu_seqlens, q, initial_state, output_final_state)
    if opts.backend == "fla":
        import fla.ops.kda as fla_kda

        kwargs: dict = {}
        if opts.kernels.kda_gate_in_kernel:
            kwargs |= {"A_log": a_log, "dt_bias": dt_bias, "use_gate_in_kernel": True}
            g = f
        else:
            g = _kda_gate(f, a_log, dt_bias, lower_bound)
        if not opts.kernels.qk_l2norm_in_kernel:
            from fla.modules.norm.l2norm import l2norm

            q, k = l2norm(q), l2norm(k)
        if recurrent_step(opts, q, cu_seqlens, output_final_state):
            # safe_gate is the chunk kernels' speed path for bounded gates: nothing to pass here
            kernel = fla_kda.fused_recurrent_kda
        else:
            kernel = fla_kda.chunk_kda
            kwargs |= {"safe_gate": safe_gate, "cu_seqlens": cu_seqlens}
        o, s = kernel(
            q,
            k,
            v,
            g,
            beta_raw,
            use_qk_l2norm_in_kernel=opts.kernels.qk_l2norm_in_kernel,
            use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=allow_neg_eigval,
            lower_bound=lower_bound,
            initial_state=initial_state,
            output_final_state=output_final_state,
            **kwargs,
        )
        return (o, s) if output_final_state else o
    g = _kda_gate(f, a_log, dt_bias, lower_bound)
    return _torch_delta_rule(
        q, k, v, g, beta_raw, allow_neg_eigval, initial_state, output_final_state, cu_seqlens
    )


def _kda_gate(f: Tensor, a_log: Tensor, dt_bias: Tensor, lower_bound: float | None) -> Tensor:
    if lower_bound is None:
        return T.kda_gate(f, a_log, dt_bias)
    hv, k = f.shape[-2], f.shape[-1]
    x = a_log.float().exp().view(hv, 1) * (f.float() + dt_bias.float().view(hv, k))
    return lower_bound * torch.sigmoid(x)


def gdn(
    opts: KernelOptions,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    beta_raw: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    *,
    allow_neg_eigval: bool = False,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated DeltaNet on raw projections: a (decay logits) ``[B,T,HV]`` -> ``[B,T,HV,V]``
    (``initial_state`` / ``output_final_state`` / ``cu_seqlens`` as :func:`kda`)."""
    _check_varlen(cu_seqlens, q, initial_state, output_final_state)
    if opts.backend == "fla":
        import fla.ops.gated_delta_rule as fla_gdn

        kwargs: dict = {}
        if opts.kernels.gdn_gate_in_kernel:
            kwargs |= {"A_log": a_log, "dt_bias": dt_bias, "use_gate_in_kernel": True}
            g = a
        else:
            g = T.gdn_gate(a, a_log, dt_bias)
        if not opts.kernels.qk_l2norm_in_kernel:
            from fla.modules.norm.l2norm import l2norm

            q, k = l2norm(q), l2norm(k)
        if recurrent_step(opts, q, cu_seqlens, output_final_state):
            kernel = fla_gdn.fused_recurrent_gated_delta_rule
        else:
            kernel = fla_gdn.chunk_gated_delta_rule
            kwargs["cu_seqlens"] = cu_seqlens
        o, s = kernel(
            q,
            k,
            v,
            g,
            beta=beta_raw,  # by name: the fused recurrent kernel takes gk and gv after g
            use_qk_l2norm_in_kernel=opts.kernels.qk_l2norm_in_kernel,
            use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=allow_neg_eigval,
            initial_state=initial_state,
            output_final_state=output_final_state,
            **kwargs,
        )
        return (o, s) if output_final_state else o
    g = T.gdn_gate(a, a_log, dt_bias)
    return _torch_delta_rule(
        q, k, v, g, beta_raw, allow_neg_eigval, initial_state, output_final_state, cu_seqlens
    )


def ssd(
    opts: KernelOptions,
    c: Tensor,
    b: Tensor,
    x: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba2's SSD as scalar-decay linear attention: ``o = sum_j (c_i.b_j) exp(G_i-G_j) x_j``.

    c, b ``[B,T,H,N]`` (already expanded from groups and, for b, multiplied by dt), x ``[B,T,H,P]``,
    g = dt * A ``[B,T,H]``. Uses FLA's chunk_simple_gla on CUDA, its operands in fp32, or with
    ``kernels.ssd_precision: mixed`` and 16-bit x, FLA's chunk kernels on the operands as they are
    (:mod:`zebractl.model.ops.mixed_ssd`). ``cu_seqlens`` as :func:`kda`. A generation step
    (:func:`recurrent_step`) runs FLA's fused_recurrent_simple_gla on fp32 operands (the mixed
    setting's operands rounded to x's dtype first), its state fp32 whichever the setting.
    """
    _check_varlen(cu_seqlens, c, initial_state, output_final_state)
    mixed = opts.kernels.ssd_precision == "mixed" and x.dtype.itemsize == 2
    step = recurrent_step(opts, x, cu_seqlens, output_final_state)
    if opts.backend == "fla" and mixed and not step:
        from zebractl.model.ops.mixed_ssd import ssd_mixed

        o, s = ssd_mixed(
            c.to(x.dtype), b.to(x.dtype), x, g, initial_state, output_final_state, cu_seqlens
        )
        return (o, s) if output_final_state else o
    if opts.backend == "fla":
        import fla.ops.simple_gla as fla_gla

        if step:  # a generation step: the mixed setting's operands rounded as its chunk path's
            kernel, extra = fla_gla.fused_recurrent_simple_gla, {}
            c, b = (c.to(x.dtype), b.to(x.dtype)) if mixed else (c, b)
        else:
            kernel, extra = fla_gla.chunk_simple_gla, {"cu_seqlens": cu_seqlens}
        # fp32 operands: FLA keeps simple_gla's backward states in fp32, and on Hopper with Triton
        # < 3.7.1 the gated backward must run on the TileLang backend, which needs q and h in one dtype.
        o, s = kernel(
            c.float(),
            b.float(),
            x.float(),
            g=g.float(),
            scale=1.0,
            initial_state=initial_state,
            output_final_state=output_final_state,
            **extra,
        )
        return (o.to(x.dtype), s) if output_final_state else o.to(x.dtype)
    if cu_seqlens is not None:
        return per_document(
            lambda *xs: T.chunk_scalar_gla(*xs, scale=1.0)[0], cu_seqlens, c, b, x, g
        )
    o, s = T.chunk_scalar_gla(
        c, b, x, g, scale=1.0, initial_state=initial_state, output_final_state=output_final_state
    )
    return (o, s) if output_final_state else o


def short_conv(
    opts: KernelOptions,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Causal depthwise conv + SiLU over ``[B,T,D]`` with weight ``[D,1,W]`` (``cu_seqlens``:
    each document of a ``[1,N,D]`` sequence padded on its own, as :func:`kda`)."""
    w = weight.squeeze(1)
    if opts.fla(opts.kernels.fused_short_conv):
        from fla.modules.causal_conv1d.ops import causal_conv1d

        y, _ = causal_conv1d(x, w, bias, activation="silu", backend="triton", cu_seqlens=cu_seqlens)
        return y
    if cu_seqlens is not None:
        return per_document(
            lambda xs: T.causal_conv1d(xs, w, bias, activation="silu"), cu_seqlens, x
        )
    return T.causal_conv1d(x, w, bias, activation="silu")


def _fused_rms_norm(
    opts: KernelOptions,
    x: Tensor,
    weight: Tensor,
    eps: float,
    residual: Tensor | None = None,
    prenorm: bool = False,
):
    """FLA's fused RMSNorm, or zebractl's tiled backward after FLA's forward or zebractl's
    (kernels.rmsnorm_backward, kernels.rmsnorm_forward)."""
    if opts.kernels.rmsnorm_backward == "tiled":
        from zebractl.model.ops.rmsnorm import rms_norm as tiled

        fwd = opts.kernels.rmsnorm_forward
        return tiled(x, weight, eps, residual=residual, prenorm=prenorm, forward=fwd)
    from fla.modules.norm.layernorm import rms_norm as fla_rms_norm

    return fla_rms_norm(x, weight, None, residual=residual, eps=eps, prenorm=prenorm)


def rms_norm(opts: KernelOptions, x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm (FLA's fused kernel when enabled)."""
    if opts.fla(opts.kernels.fused_rmsnorm):
        return _fused_rms_norm(opts, x, weight, eps)
    return T.rms_norm(x, weight, eps)


def add_rms_norm(
    opts: KernelOptions, delta: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """``(RMSNorm(residual + delta), residual + delta)``: the residual add and the pre-norm of the
    next sublayer in one kernel (FLA's RMSNorm with ``residual``/``prenorm``) when enabled."""
    if opts.fla(opts.kernels.fused_rmsnorm):
        y, r = _fused_rms_norm(opts, delta, weight, eps, residual=residual, prenorm=True)
        return y, r
    r = residual + delta
    return T.rms_norm(r, weight, eps), r


def gated_rms_norm(
    opts: KernelOptions, x: Tensor, gate: Tensor, weight: Tensor, eps: float, activation: str
) -> Tensor:
    """``RMSNorm(x) * w * act(gate)`` (FLA FusedRMSNormGated when enabled)."""
    if opts.fla(opts.kernels.fused_gated_norm):
        from fla.modules.norm.fused_norm_gate import rms_norm_gated

        return rms_norm_gated(x, gate, weight, None, activation=activation, eps=eps)
    return T.gated_rms_norm(x, gate, weight, eps, activation)


def swiglu(opts: KernelOptions, gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` (FLA's Triton SwiGLU when enabled)."""
    if opts.fla(opts.kernels.fused_swiglu):
        from fla.modules.activations.ops import swiglu as fla_swiglu

        return fla_swiglu(gate, up)
    return T.swiglu(gate, up)


def swiglu_packed(opts: KernelOptions, h: Tensor) -> Tensor:
    """``silu(gate) * up`` of the MLP's packed projection ``h = [gate | up]`` (``[..., 2F]``):
    zebractl's packed kernel with ``kernels.swiglu_kernel: packed`` (its gradient written in one
    piece), else :func:`swiglu` on the two halves."""
    if opts.fla(opts.kernels.fused_swiglu) and opts.kernels.swiglu_kernel == "packed":
        from zebractl.model.ops.glu import packed_swiglu

        return packed_swiglu(h)
    gate, up = h.chunk(2, dim=-1)
    return swiglu(opts, gate, up)


def lm_loss(
    opts: KernelOptions, hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int = -100
) -> Tensor:
    """Sum of token cross-entropies of ``hidden @ weight.T`` against labels (ignored: -100), fp32.

    With ``kernels.fused_linear_cross_entropy`` the ``[tokens x vocab]`` logits are never
    materialised (:mod:`zebractl.model.ops.lm_head`: chunked, bf16 tensor-core products with fp32
    accumulation of the weight gradient; on the fla backend the softmax part on FLA's Triton
    cross-entropy kernels or zebractl's one-pass kernel, ``kernels.cross_entropy``).
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    if opts.kernels.fused_linear_cross_entropy:
        from zebractl.model.ops.lm_head import linear_cross_entropy

        kernel = opts.kernels.cross_entropy  # read on every backend (the torch one has no choice)
        return linear_cross_entropy(
            h,
            weight,
            y,
            num_chunks=opts.kernels.fused_ce_chunks,
            ignore_index=ignore_index,
            ce_kernel=kernel if opts.backend == "fla" else "torch",
        )
    logits = F.linear(h, weight).float()
    return F.cross_entropy(logits, y, ignore_index=ignore_index, reduction="sum")
