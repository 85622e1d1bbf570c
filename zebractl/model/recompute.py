"""Activation recomputation of the decoder (``recompute.mode``): memory for compute.

Both modes use PyTorch's non-reentrant activation checkpointing, which reruns a region's forward
in the backward pass, with the random state restored (dropout draws the same mask):

- ``full``: a checkpointed block (its mixer or MLA sublayer and its MLP sublayer) keeps only its
  inputs, the previous block's output and the residual stream; its whole forward runs again in the
  backward pass. ``recompute.blocks`` limits it to the first N blocks.
- ``selective``: every sublayer is checkpointed with a policy (PyTorch's selective activation
  checkpointing) that keeps the output of every matrix multiplication and recomputes the rest: the
  norms, the activations, and the ops and kernels between the projections (the recurrent mixers'
  chunked kernels, MLA's core attention). No GEMM runs twice; a kernel PyTorch cannot see into (an
  FLA Triton kernel behind an autograd function) is recomputed whole.

The recomputed forward is the same computation on the same inputs, so on CPU in fp32 the losses and
gradients are bitwise those of ``none`` (tests/model/test_recompute.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

_aten = torch.ops.aten
GEMMS = frozenset(
    {
        _aten.mm,
        _aten.addmm,
        _aten.bmm,
        _aten.baddbmm,
        _aten._scaled_mm,
        _aten._int_mm,
    }
)
"""The matrix multiplications whose outputs ``selective`` keeps (``linear`` and ``matmul`` reach
the dispatcher as these)."""


def _keep_gemms(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if getattr(op, "overloadpacket", op) in GEMMS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _contexts() -> Any:
    return create_selective_checkpoint_contexts(_keep_gemms)


def selective(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, keeping only its inputs and its GEMMs' outputs for the backward pass."""
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts)


def full(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, keeping only its inputs for the backward pass."""
    return checkpoint(fn, *args, use_reentrant=False)


def runner(mode: str) -> Callable[..., Any] | None:
    """The checkpointing call of a mode (None for ``none``)."""
    return {"none": None, "selective": selective, "full": full}[mode]


def active(module: torch.nn.Module) -> bool:
    """Whether a forward of ``module`` now records for a backward pass (training, grad on): only
    then is recomputation worth anything (and PyTorch warns about it otherwise)."""
    return module.training and torch.is_grad_enabled()
