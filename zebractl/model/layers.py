"""Norms, the SwiGLU MLP and the three sublayer kinds (mixer, attention, MLP) of a Zebra block.

Every sublayer is pre-norm with a residual: ``x + dropout(inner(norm(x)))``. Activations are
batch-first ``[B, T, H]`` throughout (FLA's layout); only MLA, which is megatron's module, sees
megatron's ``[T, B, H]`` and is transposed around.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.module import MegatronModule
from torch import nn

from zebractl.model import ops
from zebractl.model.ops import KernelOptions

Tensor = torch.Tensor


def tp_group():
    """Megatron's tensor-parallel group (passed explicitly: megatron deprecates the implicit one)."""
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


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
        self.weight = nn.Parameter(torch.empty(hidden_size))
        if kind == "layernorm":
            self.bias = nn.Parameter(torch.empty(hidden_size))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(
                x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps
            ).to(x.dtype)
        return ops.rms_norm(self.opts, x, self.weight, self.eps)

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
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor, gate: Tensor | None) -> Tensor:
        if gate is None:
            return ops.torch_ops.rms_norm(x, self.weight, self.eps)
        return ops.gated_rms_norm(self.opts, x, gate, self.weight, self.eps, self.activation)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, activation={self.activation}"


class SwiGLUMLP(MegatronModule):
    """``linear_fc2(silu(gate) * up)`` with ``linear_fc1`` rows ``[gate; up]`` (megatron's layout)."""

    def __init__(self, config, opts: KernelOptions) -> None:
        super().__init__(config=config)
        self.opts = opts
        f = config.ffn_hidden_size
        self.linear_fc1 = ColumnParallelLinear(
            config.hidden_size,
            2 * f,
            config=config,
            init_method=config.init_method,
            bias=config.add_bias_linear,
            gather_output=False,
            skip_bias_add=False,
            tp_group=tp_group(),
        )
        self.linear_fc2 = RowParallelLinear(
            f,
            config.hidden_size,
            config=config,
            init_method=config.output_layer_init_method,
            bias=config.add_bias_linear,
            input_is_parallel=True,
            skip_bias_add=False,
            tp_group=tp_group(),
        )

    def forward(self, x: Tensor) -> Tensor:
        h, _ = self.linear_fc1(x)
        gate, up = h.chunk(2, dim=-1)
        out, _ = self.linear_fc2(ops.swiglu(self.opts, gate, up))
        return out


class _Residual(MegatronModule):
    def _residual(self, x: Tensor, out: Tensor) -> Tensor:
        p = self.config.hidden_dropout
        if p and self.training:
            out = F.dropout(out, p=p, training=True)
        return x + out


class MixerSublayer(_Residual):
    """``norm`` then a recurrent ``mixer`` (KDA, GDN or Mamba2), plus the residual."""

    def __init__(self, config, norm: nn.Module, mixer: nn.Module) -> None:
        super().__init__(config=config)
        self.norm, self.mixer = norm, mixer

    def forward(self, x: Tensor) -> Tensor:
        return self._residual(x, self.mixer(self.norm(x)))


class AttentionSublayer(_Residual):
    """``input_layernorm`` then megatron's MLA ``self_attention`` (sequence-first), plus residual."""

    def __init__(self, config, norm: nn.Module, attention: nn.Module) -> None:
        super().__init__(config=config)
        self.input_layernorm, self.self_attention = norm, attention

    def forward(self, x: Tensor) -> Tensor:
        h = self.input_layernorm(x).transpose(0, 1)
        out, bias = self.self_attention(h, attention_mask=None)
        if bias is not None:
            out = out + bias
        return self._residual(x, out.transpose(0, 1))


class MLPSublayer(_Residual):
    """``pre_mlp_layernorm`` then the SwiGLU ``mlp``, plus the residual."""

    def __init__(self, config, norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__(config=config)
        self.pre_mlp_layernorm, self.mlp = norm, mlp

    def forward(self, x: Tensor) -> Tensor:
        return self._residual(x, self.mlp(self.pre_mlp_layernorm(x)))
