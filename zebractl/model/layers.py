"""The SwiGLU MLP and the three sublayer kinds (mixer, attention, MLP) of a Zebra block (their
norms: :mod:`zebractl.model.norms`).

Every sublayer is pre-norm with a residual: ``x + dropout(inner(norm(x)))``. Activations are
batch-first ``[B, T, H]`` throughout (FLA's layout); only MLA, which is megatron's module, sees
megatron's ``[T, B, H]`` and is transposed around.

Building needs no process group (tensor parallelism is 1): megatron's layers take their groups as
arguments (:func:`process_groups`), and at forward time megatron turns any group into None when
``torch.distributed`` is not initialised, then asserts a group for its tensor-parallel collectives
even on one rank. So ColumnParallelLinear is built with ``disable_grad_reduce`` (its only collective
at tp 1) and RowParallelLinear / VocabParallelEmbedding are the :class:`RowLinear` /
:class:`VocabEmbedding` subclasses, which skip the identity collectives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.core.transformer.module import MegatronModule
from torch import nn

from zebractl.model import ops
from zebractl.model.ops import KernelOptions
from zebractl.model.segments import Segments

Tensor = torch.Tensor


class OneRank:
    """Stands in for a one-process group where megatron only asks for a group's size and rank.

    Needed for the context-parallel group: megatron's RoPE application falls back to the global
    parallel state when given None, and that state exists only after ``initialize_model_parallel``.
    """

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "OneRank()"


def process_groups():
    """The process groups the megatron modules are built with (passed explicitly, never looked up).

    The caller's groups when it has set up megatron's parallel state (training: DDP and checkpoints
    need them); otherwise, for a model built without ``torch.distributed`` (planning, tests, export),
    no tensor/pipeline group (megatron reads None as one rank) and a :class:`OneRank` context group.
    """
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    if parallel_state.model_parallel_is_initialized():
        return ProcessGroupCollection.use_mpu_process_groups(
            required_pgs=["tp", "pp", "cp", "embd"]
        )
    return ProcessGroupCollection(tp=None, pp=None, cp=OneRank(), embd=None)


def tp_group():
    """The tensor-parallel group of :func:`process_groups` (None without parallel state)."""
    return process_groups().tp


class RowLinear(RowParallelLinear):
    """megatron's RowParallelLinear at tensor-parallel size 1, usable without a process group.

    Same parameters, checkpoint layout and matmul (megatron's own autograd function); the output
    all-reduce over the tensor-parallel group, the identity on one rank, is skipped because megatron
    asserts a real group for it.
    """

    def forward(self, input_: Tensor) -> tuple[Tensor, Tensor | None]:
        out = self._forward_impl(
            input=input_,
            weight=self.weight,
            bias=None,
            gradient_accumulation_fusion=self.gradient_accumulation_fusion,
            allreduce_dgrad=False,
            sequence_parallel=False,
            tp_group=self.tp_group,  # unused without the two above; None only without a group
            grad_output_buffer=None,
        )
        if self.skip_bias_add:
            return out, self.bias
        return (out + self.bias if self.bias is not None else out), None


class VocabEmbedding(VocabParallelEmbedding):
    """megatron's VocabParallelEmbedding at tensor-parallel size 1, usable without a process group.

    The vocabulary masking and the all-reduce of the tensor-parallel version are identities on one
    rank, and megatron asserts a real group for them; the lookup is megatron's.
    """

    def forward(self, input_: Tensor) -> Tensor:
        if self.deterministic_mode:
            return self.weight[input_]
        return F.embedding(input_, self.weight)


class SwiGLUMLP(MegatronModule):
    """``linear_fc2(silu(gate) * up)`` with ``linear_fc1`` rows ``[gate; up]`` (megatron's layout).

    With ``kernels.fp8_mlp`` the same parameters are applied by :func:`zebractl.model.ops.fp8.swiglu_mlp`
    (FP8 GEMMs through torchao, compiled); checkpoints and conversion do not change.
    """

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
            disable_grad_reduce=True,  # tp = 1: no input-gradient all-reduce, no process group
            tp_group=tp_group(),
        )
        self.linear_fc2 = RowLinear(
            f,
            config.hidden_size,
            config=config,
            init_method=config.output_layer_init_method,
            bias=config.add_bias_linear,
            input_is_parallel=True,
            skip_bias_add=False,
            tp_group=tp_group(),
        )
        self._fp8 = None
        if opts.kernels.fp8_mlp != "off":
            from zebractl.model.ops import fp8

            self._fp8 = (fp8.FP8Recipe.build(opts.kernels.fp8_mlp), fp8.compiled_swiglu_mlp())

    def forward(self, x: Tensor) -> Tensor:
        if (
            self._fp8 is not None
        ):  # kernels.fp8_mlp: the same weights, FP8 GEMMs, one compiled region
            from zebractl.model.ops.fp8 import mlp_forward

            recipe, mlp = self._fp8
            fc1, fc2 = self.linear_fc1, self.linear_fc2
            return mlp_forward(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, recipe, mlp)
        h, _ = self.linear_fc1(x)
        out, _ = self.linear_fc2(ops.swiglu_packed(self.opts, h))
        return out


MLPS = {"swiglu": SwiGLUMLP}
"""model.ffn_activation -> the MLP sublayer's module."""


class _Residual(MegatronModule):
    """A pre-norm sublayer: ``x + dropout(inner(norm(x)))``.

    :class:`~zebractl.model.model.ZebraStack` runs the sublayers as :meth:`step`, which takes the
    previous sublayer's output apart from the residual stream so that the add and the norm are one
    fused kernel (``kernels.fused_rmsnorm``: FLA's RMSNorm with residual, as FLA's models do);
    ``forward(x)`` is the same sublayer on a plain stream.
    """

    norm_name = "norm"

    def _inner(self, h: Tensor, segments: Segments | None) -> Tensor:
        raise NotImplementedError

    def step(
        self, delta: Tensor | None, residual: Tensor, segments: Segments | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(delta', residual + delta)``: the new residual stream is ``residual + delta`` (the
        previous sublayer's output; None for the first) and ``delta'`` this sublayer's output.
        ``segments``: the documents packed into each row, kept apart (None: a row is one
        sequence; :mod:`zebractl.model.segments`)."""
        h, residual = getattr(self, self.norm_name).add(delta, residual)
        out = self._inner(h, segments)
        p = self.config.hidden_dropout
        if p and self.training:
            out = F.dropout(out, p=p, training=True)
        return out, residual

    def forward(self, x: Tensor) -> Tensor:
        out, residual = self.step(None, x)
        return residual + out


class MixerSublayer(_Residual):
    """``norm`` then a recurrent ``mixer`` (KDA, GDN or Mamba2), plus the residual."""

    def __init__(self, config, norm: nn.Module, mixer: nn.Module) -> None:
        super().__init__(config=config)
        self.norm, self.mixer = norm, mixer

    def _inner(self, h: Tensor, segments: Segments | None) -> Tensor:
        if segments is None:
            return self.mixer(h)
        out = self.mixer(segments.flatten(h), segments.cu_seqlens)
        return out.view(h.shape[0], h.shape[1], -1)


class AttentionSublayer(_Residual):
    """``input_layernorm`` then megatron's MLA ``self_attention`` (sequence-first), plus residual."""

    norm_name = "input_layernorm"

    def __init__(self, config, norm: nn.Module, attention: nn.Module) -> None:
        super().__init__(config=config)
        self.input_layernorm, self.self_attention = norm, attention

    def _inner(self, h: Tensor, segments: Segments | None) -> Tensor:
        # megatron's MLA hands attention_mask to the core attention untouched (SDPACoreAttention)
        out, bias = self.self_attention(h.transpose(0, 1), attention_mask=segments)
        if bias is not None:
            out = out + bias
        return out.transpose(0, 1)


class MLPSublayer(_Residual):
    """``pre_mlp_layernorm`` then the SwiGLU ``mlp``, plus the residual."""

    norm_name = "pre_mlp_layernorm"

    def __init__(self, config, norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__(config=config)
        self.pre_mlp_layernorm, self.mlp = norm, mlp

    def _inner(self, h: Tensor, segments: Segments | None) -> Tensor:
        return self.mlp(h)
