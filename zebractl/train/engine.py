"""The two ways a run holds its parameters and steps its optimizer (``optimizer.impl``).

- ``megatron``: megatron-core's DistributedDataParallel (contiguous fp32 gradient buffers, bucketed
  all-reduce or reduce-scatter) and Megatron optimizer: bf16 model parameters (under
  ``precision: bf16``) with fp32 main parameters and gradients, AdamW, clipping inside the optimizer.
  The optimizer state (fp32 mains and Adam moments, the same on every rank) is checkpointed as
  common state, so it resumes on another data-parallel size. megatron 0.16.1's sharded forms fail on
  our mixed bf16/fp32 parameters (the recurrent decay parameters stay fp32): the plain optimizer's
  per-parameter map covers only its bf16 parameters, and the distributed optimizer's
  ``dp_reshardable``/``fully_reshardable`` saves assert and ``fully_sharded_model_space`` needs
  ``flattened_range``, which torch_dist no longer saves; so :func:`check_engine` refuses
  ``parallelism.distributed_optimizer`` until that is solved.
- ``torch_fused``: how FLA trains (the parity recipes): fp32 parameters under bf16 autocast, torch DDP,
  ``torch.optim.AdamW(fused=True)``. Every rank holds the whole optimizer state, which is checkpointed
  as common state.

Both expose the same small surface to the loop: ``forward`` module, ``zero_grad``, ``no_sync``,
``finish_grads``, ``grads_finite``, ``step``, ``reload_model_params``; ``optimizer.state_dict()`` is
the same on every rank in both, so the loop checkpoints it as common state.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math

import torch

from zebractl.config.errors import ConfigError
from zebractl.schemas.recipe import RunConfig


def _no_decay(cfg: RunConfig, name: str) -> bool:
    # megatron DDP prefixes names with "module."; the recipe's globs address the bare model
    name = name.removeprefix("module.")
    return any(fnmatch.fnmatch(name, pat) for pat in cfg.optimizer.no_decay)


class TorchEngine:
    """fp32 parameters, bf16 autocast, torch DDP, torch AdamW (fused on CUDA)."""

    impl = "torch_fused"
    distributed = False

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, device: torch.device, world: int):
        self.cfg, self.model, self.device = cfg, model, device
        self.autocast = device.type == "cuda" and cfg.precision == "bf16"
        self.forward: torch.nn.Module = model
        if world > 1:
            self.forward = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (no_decay if _no_decay(cfg, name) else decay).append(p)
        o = cfg.optimizer
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}],
            lr=0.0,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=device.type == "cuda",
        )
        self.params = decay + no_decay

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def no_sync(self) -> contextlib.AbstractContextManager:
        fwd = self.forward
        return fwd.no_sync() if hasattr(fwd, "no_sync") else contextlib.nullcontext()

    def finish_grads(self) -> None:
        """Gradients are reduced by torch DDP's hooks during the last backward."""

    def grads_finite(self) -> torch.Tensor:
        grads = [p.grad for p in self.params if p.grad is not None]
        return torch.stack([torch.isfinite(g).all() for g in grads]).all()

    def step(self) -> float | torch.Tensor:
        """Clip and update; returns the gradient norm before clipping."""
        clip = self.cfg.optimizer.clip_grad
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else math.inf)
        self.optimizer.step()
        return norm

    def reload_model_params(self) -> None:
        """The optimizer updates the model's own parameters: nothing to refresh."""


class MegatronEngine:
    """megatron-core DDP + Megatron optimizer (bf16 params, fp32 main params and grads)."""

    impl = "megatron"

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, device: torch.device, world: int):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer.optimizer_config import ParamKey, ParamWithNamePredicate

        self.cfg, self.model, self.device = cfg, model, device
        self.autocast = False  # the parameters carry the compute dtype
        distributed = self.distributed = cfg.parallelism.distributed_optimizer
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=world > 1,
            use_distributed_optimizer=distributed,
            bucket_size=None,
        )
        self.forward = DistributedDataParallel(model.config, ddp_config, model)
        o = cfg.optimizer
        bf16 = cfg.precision == "bf16"
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=cfg.schedule.lr,
            min_lr=cfg.schedule.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.beta1,
            adam_beta2=o.beta2,
            adam_eps=o.eps,
            clip_grad=o.clip_grad,
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            use_distributed_optimizer=distributed,
        )
        no_decay = ParamKey(
            with_name_predicate=ParamWithNamePredicate(
                name="recipe_no_decay", fn=lambda _p, name: _no_decay(cfg, name)
            )
        )
        self.optimizer = get_megatron_optimizer(
            opt_config, [self.forward], config_overrides={no_decay: {"wd_mult": 0.0}}
        )

    def zero_grad(self) -> None:
        self.forward.zero_grad_buffer()
        self.optimizer.zero_grad()

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.forward.no_sync()

    def finish_grads(self) -> None:
        self.forward.finish_grad_sync()

    def grads_finite(self) -> torch.Tensor:
        bufs = [b.grad_data for b in self.forward.buffers + self.forward.expert_parallel_buffers]
        return torch.stack([torch.isfinite(g).all() for g in bufs]).all()

    def step(self) -> float | torch.Tensor:
        """Copy grads to the fp32 mains, clip, update, copy back; returns the gradient norm."""
        ok, norm, _ = self.optimizer.step()
        if not ok:  # only a loss scaler (fp16) reports an overflow; bf16/fp32 never do
            raise RuntimeError("the Megatron optimizer skipped its update")
        if norm is None or self.cfg.optimizer.clip_grad == 0:
            norm = self.optimizer.get_grad_norm()
        return norm

    def reload_model_params(self) -> None:
        """Refresh the fp32 main parameters from weights loaded into the model."""
        self.optimizer.reload_model_params()


def check_engine(cfg: RunConfig, device: torch.device) -> None:
    """Refuse engine settings that cannot run here (before any data or model is built)."""
    if cfg.precision == "fp16":
        raise ConfigError(
            "precision fp16 needs loss scaling, which `zebractl train` does not do; use bf16"
        )
    if cfg.optimizer.impl == "torch_fused":
        if cfg.parallelism.distributed_optimizer:
            raise ConfigError(
                "parallelism.distributed_optimizer needs optimizer.impl 'megatron' (torch "
                "AdamW keeps the whole state on every rank)"
            )
        return
    if device.type != "cuda":
        raise ConfigError(
            "optimizer.impl 'megatron' (megatron-core's optimizer) runs on CUDA only; on this "
            "machine use --set optimizer.impl=torch_fused"
        )
    if cfg.parallelism.distributed_optimizer:
        raise ConfigError(
            "parallelism.distributed_optimizer is not available yet: megatron-core 0.16.1 trains "
            "it but cannot checkpoint its shards when the model mixes bf16 and fp32 parameters "
            "(ours keeps the recurrent decay parameters fp32), so a run would die at its first "
            "save; use parallelism.distributed_optimizer=false"
        )


def build_engine(
    cfg: RunConfig, device: torch.device, world: int, seed: int
) -> TorchEngine | MegatronEngine:
    """The model (built for the engine's parameter dtype) wrapped by the recipe's engine."""
    from zebractl.model.model import build_model

    check_engine(cfg, device)
    if cfg.optimizer.impl == "torch_fused":
        model = build_model(cfg.model, kernels=cfg.kernels, device=device, seed=seed)
        return TorchEngine(cfg, model, device, world)
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    model = build_model(
        cfg.model, kernels=cfg.kernels, device=device, seed=seed, params_dtype=dtype
    )
    return MegatronEngine(cfg, model, device, world)
