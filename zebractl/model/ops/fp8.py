"""Opt-in FP8 for the SwiGLU MLP (``kernels.fp8_mlp``): torchao's float8 training matmul.

The MLP's two GEMMs (and their two backward GEMMs each) run as FP8 tensor-core products
(``torch._scaled_mm``) with dynamic scaling, through torchao's float8 autograd function: forward
operands in e4m3, the gradient e4m3 (``tensorwise``: one scale per tensor, torchao's fastest recipe)
or e4m3 with one scale per row (``rowwise``: more accurate, slower). Outputs and gradients come back in
the dtype of the input (bf16), the weight gradients in the weights' dtype, so the weights, their
fp32 main copies and the optimizer are unchanged. Under the torch_fused engine's bf16 autocast
(fp32 parameters) the MLP runs with autocast off on its input cast to bf16, the fp32 weights going
to FP8 directly, as torchao's ``Float8Linear`` does.

Eager float8 pays several full passes over each operand for its scales and casts; the MLP is
therefore compiled as one region (``torch.compile``, fixed shapes) so Inductor fuses the SwiGLU, the
amax reductions and the casts around the GEMMs. torchao is imported only when FP8 is on.

Supported where ``torch._scaled_mm`` is: CUDA GPUs of compute capability 8.9 or newer (Ada, Hopper,
Blackwell). :func:`check_supported` says why not anywhere else (the engine turns that into exit 2).
On CPU, ``emulate=True`` runs the same casts and scales with an emulated matmul (tests only).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch
import torch.nn.functional as F

from zebractl.model.ops import regions

Tensor = torch.Tensor

MIN_CAPABILITY = (8, 9)
"""``torch._scaled_mm`` (FP8 tensor cores) needs sm_89 or newer."""


def unsupported_reason(device: torch.device, precision: str) -> str | None:
    """Why ``kernels.fp8_mlp`` cannot run here (None when it can). Either engine: the Megatron
    engine's bf16 parameters, or torch_fused's fp32 parameters under bf16 autocast (the MLP then
    takes its input in bf16 and scales the fp32 weights to FP8 directly)."""
    if precision != "bf16":
        return f"kernels.fp8_mlp needs precision bf16 (the recipe says {precision})"
    if device.type != "cuda":
        return (
            "kernels.fp8_mlp needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+: "
            "Ada, Hopper, Blackwell); this machine has none. Set kernels.fp8_mlp=off"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return (
            f"kernels.fp8_mlp needs compute capability 8.9+ for FP8 tensor cores; "
            f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}. Set kernels.fp8_mlp=off"
        )
    try:
        _torchao()
    except ImportError as e:
        return (
            f"kernels.fp8_mlp uses torchao's float8 training ({e}); install it with "
            "`pip install 'zebractl[fp8]'` (torchao 0.18.0)"
        )
    return None


def _torchao():
    # torchao's optional C++ extensions (MX formats, sparse CUTLASS kernels) are not used here, and a
    # build for another torch logs load failures on import: skip them unless the user says otherwise.
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    from torchao.float8.config import Float8LinearConfig
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
    from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig

    return Float8LinearConfig, matmul_with_hp_or_float8_args, LinearMMConfig, ScaledMMConfig


@dataclasses.dataclass(frozen=True)
class FP8Recipe:
    """A torchao float8 recipe with the matmul settings of its three GEMMs, built once."""

    name: str
    config: Any
    mm_config: Any

    @classmethod
    @functools.cache
    def build(cls, name: str, emulate: bool = False) -> FP8Recipe:
        """One shared instance per recipe: the compiled MLP guards on it, so every MLP of a model
        (and every model of the process) reuses one compiled graph."""
        config_cls, _, mm_cls, scaled_cls = _torchao()
        c = config_cls.from_recipe_name(name)
        if emulate:
            c = dataclasses.replace(c, emulate=True)
        # output, grad_input, grad_weight: as torchao's Float8Linear configures them
        mm = mm_cls(
            *(
                scaled_cls(c.emulate, g.use_fast_accum, False, c.pad_inner_dim)
                for g in (c.gemm_config_output, c.gemm_config_grad_input, c.gemm_config_grad_weight)
            )
        )
        return cls(name, c, mm)


def mlp_forward(
    x: Tensor, w1: Tensor, b1: Tensor | None, w2: Tensor, b2: Tensor | None, recipe: FP8Recipe, fn
) -> Tensor:
    """Call ``fn`` (:func:`swiglu_mlp` or its compiled form) the way autocast would: under an
    enabled autocast, on the input in the autocast dtype with autocast off inside (the weights,
    fp32 for torch_fused, are scaled to FP8 as they are); otherwise as it is."""
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        return fn(x, w1, b1, w2, b2, recipe)
    dtype = torch.get_autocast_dtype(dev)
    with torch.autocast(dev, enabled=False):
        return fn(x.to(dtype), w1, b1, w2, b2, recipe)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, recipe: FP8Recipe) -> Tensor:
    """``x @ weight.T (+ bias)`` with FP8 operands; output and gradients in ``x``'s dtype."""
    _, mm, _, _ = _torchao()
    out = mm.apply(x, weight.t(), recipe.mm_config, recipe.config)
    return out if bias is None else out + bias.to(out.dtype)


def swiglu_mlp(
    x: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    w2: Tensor,
    b2: Tensor | None,
    recipe: FP8Recipe,
) -> Tensor:
    """``fc2(silu(gate) * up)`` with ``fc1`` rows ``[gate; up]`` (megatron's layout), both in FP8."""
    gate, up = linear(x, w1, b1, recipe).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, w2, b2, recipe)


@functools.cache
def compiled_swiglu_mlp() -> regions.Region:
    """:func:`swiglu_mlp` as one compiled region (compiled on first use; shared by all MLPs;
    :mod:`zebractl.model.ops.regions`)."""
    return regions.region(swiglu_mlp)
