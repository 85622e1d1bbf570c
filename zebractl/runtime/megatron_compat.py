"""The few places megatron-core 0.16.1 needs help to run without Transformer Engine or CUDA.

The patches are module attributes, set only inside :func:`patched` and restored when it exits, so
building a model leaves the process as it found it. Each is covered by a test (an upstream bump that
moves one fails loudly):

- ``multi_latent_attention.HAVE_TE``: megatron replaces a missing TE with a MagicMock, so this flag is
  True without TE and ``isinstance(x, TELinear)`` in MLA's constructor raises. We set it to the truth.
- ``torch.cuda.current_device`` on a machine without CUDA: megatron's RoPE/YaRN constructors (used by
  MLA) place their tables on ``torch.cuda.current_device()`` unconditionally. Without CUDA we answer
  ``"cpu"``, which is where everything lives on such a machine.
- ``torch.cuda.synchronize`` on a machine without CUDA: the torch_dist checkpoint writer calls it;
  a no-op without CUDA.

Nothing is patched when CUDA (for the last two) or TE (for the first) is there. The model needs the
patches only while MLA is constructed (:func:`zebractl.model.attention.build_mla` enters them itself;
its forward needs none); a CPU checkpoint save needs them around ``dist_checkpointing.save``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch

_lock = threading.RLock()


@functools.cache
def have_transformer_engine() -> bool:
    """Whether a real Transformer Engine is importable."""
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _cpu_device() -> str:
    return "cpu"


def _no_sync(*_: object, **__: object) -> None:
    return None


def _patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, value) of every patch this machine needs."""
    import megatron.core.transformer.multi_latent_attention as mla

    out: list[tuple[object, str, object]] = []
    if not have_transformer_engine():
        out.append((mla, "HAVE_TE", False))
    if not torch.cuda.is_available():
        out += [(torch.cuda, "current_device", _cpu_device), (torch.cuda, "synchronize", _no_sync)]
    return out


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Apply the patches for the duration of the block; the previous values come back on exit.

    Re-entrant (nested blocks restore in order). The attributes are process-wide while the block
    runs, so blocks of different threads are serialised.
    """
    with _lock:
        patches = _patches()
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        try:
            for owner, name, value in patches:
                setattr(owner, name, value)
            yield
        finally:
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)
