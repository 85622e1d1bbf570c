"""The few places megatron-core 0.16.1 needs help to run without Transformer Engine or CUDA.

Each patch is a module attribute, applied once, idempotent, and covered by a test (so an upstream bump
that moves it fails loudly):

- ``multi_latent_attention.HAVE_TE``: megatron replaces a missing TE with a MagicMock, so this flag is
  True without TE and ``isinstance(x, TELinear)`` raises. We set it to the truth.
- ``torch.cuda.current_device`` on a machine without CUDA: RoPE tables (used by MLA) are placed on
  ``torch.cuda.current_device()`` unconditionally. Without CUDA we answer ``"cpu"``, which is where
  everything lives on such a machine; and the checkpoint writer calls ``torch.cuda.synchronize()``,
  a no-op without CUDA. Never touched when CUDA is available.
"""

from __future__ import annotations

import torch

_applied = False


def have_transformer_engine() -> bool:
    """Whether a real Transformer Engine is importable."""
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def apply() -> None:
    """Apply the patches (no-op after the first call)."""
    global _applied
    if _applied:
        return
    import megatron.core.transformer.multi_latent_attention as mla

    if not have_transformer_engine():
        mla.HAVE_TE = False
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    _applied = True
