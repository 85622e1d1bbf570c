"""The norms of the model, pure PyTorch (no megatron): what the training model and
:mod:`zebractl.hf` share.

``Norm``: a block's pre-norm, the final norm and MLA's LoRA norms (RMSNorm or LayerNorm);
``GatedNorm``: KDA's and GDN's gated output norm, one weight shared by the heads; ``GroupGatedNorm``:
Mamba2's, gated then normalised per group. Weights start at 1 and biases at 0, as
:mod:`zebractl.model.init` sets them (a Hugging Face model built without weights gets them too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zebractl.model import ops
from zebractl.model.ops import KernelOptions

Tensor = torch.Tensor


class Norm(nn.Module):
    """RMSNorm or LayerNorm with an explicit eps; megatron's build_module signature works too."""

    def __init__(
        self,
        hidden_size: int,
        eps: float,
        kind: str = "rmsnorm",
        opts: KernelOptions | None = None,
        config: object | None = None,
    ) -> None:
        super().__init__()
        self.eps, self.kind, self.opts = eps, kind, opts or KernelOptions(backend="torch")
        self.weight = nn.Parameter(torch.ones(hidden_size))
        if kind == "layernorm":
            self.bias = nn.Parameter(torch.zeros(hidden_size))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(
                x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps
            ).to(x.dtype)
        return ops.rms_norm(self.opts, x, self.weight, self.eps)

    def add(self, delta: Tensor | None, residual: Tensor) -> tuple[Tensor, Tensor]:
        """``(norm(residual + delta), residual + delta)`` (``delta`` None: no add); one fused
        kernel for RMSNorm with ``kernels.fused_rmsnorm`` on the fla backend."""
        if delta is None:
            return self(residual), residual
        if self.kind == "rmsnorm":
            return ops.add_rms_norm(self.opts, delta, residual, self.weight, self.eps)
        residual = residual + delta
        return self(residual), residual

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, kind={self.kind}"


def norm_factory(kind: str, opts: KernelOptions):
    """A class megatron's build_module can instantiate as (config=, hidden_size=, eps=)."""

    class _SpecNorm(Norm):
        def __init__(
            self, config: object = None, hidden_size: int = 0, eps: float = 1e-6, **_: object
        ) -> None:
            super().__init__(hidden_size, eps, kind, opts)

    _SpecNorm.__name__ = "Norm"
    return _SpecNorm


class GatedNorm(nn.Module):
    """``RMSNorm(o) * weight * act(gate)`` over one head's dim, weight shared by all heads."""

    def __init__(self, dim: int, eps: float, activation: str, opts: KernelOptions) -> None:
        super().__init__()
        self.eps, self.activation, self.opts = eps, activation, opts
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor | None) -> Tensor:
        if gate is None:
            return ops.torch_ops.rms_norm(x, self.weight, self.eps)
        return ops.gated_rms_norm(self.opts, x, gate, self.weight, self.eps, self.activation)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, activation={self.activation}"


def group_gated_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float, groups: int) -> Tensor:
    """:class:`GroupGatedNorm`'s arithmetic as a function of its weight."""
    return ops.torch_ops.group_rms_norm(x * F.silu(gate), weight, eps, groups)


class GroupGatedNorm(nn.Module):
    """``GroupRMSNorm(x * silu(gate)) * weight``: Mamba2's ``RMSNormGated(norm_before_gate=False)``,
    the RMS taken over each of ``groups`` equal slices of the last dim."""

    def __init__(self, dim: int, eps: float, groups: int) -> None:
        super().__init__()
        self.eps, self.groups = eps, groups
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        return group_gated_norm(x, gate, self.weight, self.eps, self.groups)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, groups={self.groups}"


NORMS = (Norm, GatedNorm, GroupGatedNorm)
"""Every norm module: :mod:`zebractl.model.init` sets their weights to 1 and biases to 0."""
