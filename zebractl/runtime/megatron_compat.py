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

:func:`optimizer_step` is for the Megatron optimizer's step without TE or Apex: megatron then falls
back to ``local_multi_tensor_l2_norm`` (one ``torch.norm`` per tensor, a host sync for each when it
builds a tensor of their values) and ``local_multi_tensor_scale`` (a multiply and a copy per tensor)
for its gradient norm, clipping and main->model parameter copies. The patch swaps in torch's
multi-tensor ``_foreach`` kernels, with the same results (norms in fp32, scales applied in the
tensors' dtype), and no host sync except the one megatron itself makes for the clip decision.
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


def _foreach_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for ``amp_C.multi_tensor_l2norm``: the global L2 norm of ``tensor_lists[0]``,
    a one-element fp32 tensor on their device (no host sync)."""
    tensors = tensor_lists[0]
    if not tensors:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.zeros(1, dtype=torch.float32, device=device), None
    norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t for t in tensors])
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def _foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for ``amp_C.multi_tensor_scale``: ``dst = src * scale`` over two tensor lists."""
    src, dst = tensor_lists[0], tensor_lists[1]
    if not src:
        return
    if all(a is b for a, b in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def _optimizer_patches() -> list[tuple[object, str, object]]:
    if have_transformer_engine() or _have_apex():
        return []
    import megatron.core.optimizer.clip_grads as clip
    import megatron.core.optimizer.optimizer as opt

    return [
        (opt, "multi_tensor_scale_impl", _foreach_scale),
        (clip, "l2_norm_impl", _foreach_l2norm),
        (clip, "multi_tensor_scale_impl", _foreach_scale),
    ]


@functools.cache
def _have_apex() -> bool:
    try:
        import amp_C  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def optimizer_step() -> Iterator[None]:
    """The Megatron optimizer's step with torch's multi-tensor kernels (see the module docstring);
    restored on exit."""
    with _applied(_optimizer_patches()):
        yield


@contextlib.contextmanager
def _applied(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    with _lock:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        try:
            for owner, name, value in patches:
                setattr(owner, name, value)
            yield
        finally:
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Apply the patches for the duration of the block; the previous values come back on exit.

    Re-entrant (nested blocks restore in order). The attributes are process-wide while the block
    runs, so blocks of different threads are serialised.
    """
    with _lock, _applied(_patches()):
        yield
