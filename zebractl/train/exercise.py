"""One training step of a run's kernels on throwaway weights: what the background compilation
(:mod:`zebractl.train.precompile`, in a thread of the run) and the compile processes
(:mod:`zebractl.train.compile_procs`) run so that the step's GPU kernels compile before the first
step needs them. See :func:`exercise`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zebractl.schemas.recipe import RunConfig


def exercise(
    cfg: RunConfig, device: Any, before_backward: Callable[[str], None] | None = None
) -> None:
    """One training forward + backward and one evaluation forward of each distinct recurrent mixer
    of ``cfg.model``, a pre-norm with its residual add and the LM-head loss, at the run's shapes and
    dtypes, on throwaway weights (zebractl.train.precompile says why). Leaves the random state and
    every module of the run alone; works on any device (the tests run it on CPU).
    ``before_backward(kind)`` is called before each mixer's backward."""
    import torch

    # not zebractl.model.model: it imports megatron-core, which this step does not need (a
    # compile process started at launch would pay seconds for it)
    from zebractl.model import ops
    from zebractl.model.mixers import MIXERS
    from zebractl.model.mixers.common import KEEP_FP32
    from zebractl.model.norms import Norm
    from zebractl.model.ops import kernel_options

    if device.type == "cuda":
        torch.cuda.set_device(device)  # a new thread starts on device 0
    m, opts = cfg.model, kernel_options(cfg.kernels, device)
    bf16 = cfg.precision == "bf16"
    megatron = cfg.optimizer.impl == "megatron" and bf16
    dtype = torch.bfloat16 if megatron else torch.float32  # the engine's parameter dtype
    autocast = bf16 and not megatron and device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    b, t, h = cfg.batch.micro, cfg.data.seq_length, m.hidden_size

    def throwaway(make) -> torch.nn.Module:
        with torch.device("meta"):
            module = make()
        module = module.to_empty(device=device)
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.normal_(0.0, 0.02, generator=gen)
                if p.is_floating_point() and name.rsplit(".", 1)[-1] not in KEEP_FP32:
                    p.data = p.data.to(dtype)
        return module

    def activations(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, device=device, generator=gen).to(dtype)
        return x.requires_grad_(True)

    kinds = [k for k in dict.fromkeys(m.sublayers) if k in MIXERS]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        # the norms and the loss first: meanwhile the TileLang helper compiles KDA's backward
        norm = throwaway(lambda: Norm(h, m.norm.eps, m.norm.type, opts))
        x, residual = activations(b, t, h), activations(b, t, h)
        y, r = norm.add(x, residual)  # every pre-norm but the first
        (y.float().sum() + r.float().sum() + norm(x).float().sum()).backward()
        weight = activations(m.padded_vocab_size, h)
        labels = torch.randint(0, m.vocab_size, (b, t), device=device, generator=gen)
        hidden = activations(b, t, h)
        ops.lm_loss(opts, hidden, weight, labels).backward()
        with torch.no_grad():
            ops.lm_loss(opts, hidden, weight, labels)
        del norm, x, residual, y, r, weight, labels, hidden
        for kind in kinds:
            mixer = throwaway(lambda kind=kind: MIXERS[kind](m, opts))
            x = activations(b, t, h)
            out = mixer(x).sum()
            if before_backward is not None:
                before_backward(kind)  # e.g. wait for a kernel another thread is compiling
            out.backward()
            with torch.no_grad():
                mixer(x)
            del mixer, x, out
    if device.type == "cuda":
        torch.cuda.synchronize(device)
