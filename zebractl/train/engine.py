"""The two ways a run holds its parameters and steps its optimizer (``optimizer.impl``).

- ``megatron``: megatron-core's DistributedDataParallel (contiguous fp32 gradient buffers, bucketed
  all-reduce or reduce-scatter) and Megatron optimizer: bf16 model parameters (under
  ``precision: bf16``) with fp32 main parameters and gradients, AdamW, clipping inside the optimizer.
  Without Transformer Engine or Apex, megatron falls back to per-tensor Python loops with a host
  sync per tensor for its gradient norm, clipping and main->model copies, and to torch's unfused
  AdamW; :func:`zebractl.runtime.megatron_compat.optimizer_step` swaps in torch's multi-tensor
  (``_foreach``) kernels for the step and the AdamW is switched to torch's fused CUDA kernel.
  ``parallelism.distributed_optimizer`` shards the fp32 state over the data-parallel ranks (ZeRO-1),
  saved in megatron's ``dp_reshardable`` format; megatron 0.16.1 mis-indexes that format's state when
  one parameter group mixes bf16 and fp32 parameters (ours keeps the recurrent decay parameters
  fp32), so the fp32 parameters get parameter groups of their own.
- ``torch_fused``: how FLA trains (the parity recipes): fp32 parameters under bf16 autocast, torch DDP,
  ``torch.optim.AdamW(fused=True)``.

Both expose the same small surface to the trainer: ``forward`` module, ``zero_grad``, ``no_sync``,
``finish_grads``, ``grads_finite``, ``step``, ``reload_model_params``, and
``sharded_optimizer_state`` / ``load_optimizer_state``: the optimizer state as megatron sharded
tensors (laid out like the model's parameters: Adam moments and, for the Megatron engine, the fp32
main parameters; for the distributed optimizer, megatron's per-bucket shards), so every rank writes
its share of a checkpoint and it loads on any data-parallel size; the step count and
hyper-parameters are small common state.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math

import torch

from zebractl.errors import ConfigError
from zebractl.schemas.recipe import RunConfig

TORCH_OPTIMIZERS = {"adamw": torch.optim.AdamW}
"""optimizer.type -> the torch optimizer of the torch_fused engine."""
MEGATRON_OPTIMIZERS = {"adamw": "adam"}
"""optimizer.type -> megatron's name (its "adam" decouples weight decay: AdamW)."""


def _no_decay(cfg: RunConfig, name: str) -> bool:
    # megatron DDP prefixes names with "module."; the recipe's globs address the bare model
    name = name.removeprefix("module.")
    return any(fnmatch.fnmatch(name, pat) for pat in cfg.optimizer.no_decay)


class TorchEngine:
    """fp32 parameters, bf16 autocast, torch DDP, torch AdamW (fused on CUDA)."""

    impl = "torch_fused"
    distributed = False
    grads_static = False
    """True once a CUDA graph adds into the gradients: zero them in place, never free them."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, device: torch.device, world: int):
        self.cfg, self.model, self.device = cfg, model, device
        self.autocast = device.type == "cuda" and cfg.precision == "bf16"
        self.forward: torch.nn.Module = model
        if world > 1:
            self.forward = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        decay, no_decay = [], []
        # a reference model (zebractl.train.reference) names its parameters as zebractl does
        named = getattr(model, "named_parameters_for_decay", model.named_parameters)()
        for name, p in named:
            if p.requires_grad:
                (no_decay if _no_decay(cfg, name) else decay).append(p)
        o = cfg.optimizer
        self.optimizer = TORCH_OPTIMIZERS[o.type](
            [{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}],
            lr=0.0,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=device.type == "cuda",
        )
        self.params = decay + no_decay

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=not self.grads_static)

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

    def sharded_optimizer_state(self, model_sd: dict, is_loading: bool = False) -> dict:
        """The AdamW state as sharded tensors keyed like ``model_sd``'s parameters."""
        return {"adamw": sharded_adam_state(self.optimizer, {}, model_sd)}

    def load_optimizer_state(self, loaded: dict) -> None:
        """Put a loaded :meth:`sharded_optimizer_state` back."""
        load_adam_state(self.optimizer, loaded["adamw"], {})


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
            optimizer=MEGATRON_OPTIMIZERS[o.type],
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
        overrides: dict = {no_decay: {"wd_mult": 0.0}}
        if distributed:
            fp32 = ParamKey(
                with_name_predicate=ParamWithNamePredicate(
                    name="fp32_params", fn=lambda p, _name: p.dtype == torch.float32
                )
            )
            overrides[fp32] = {FP32_GROUP: True}
        self.optimizer = get_megatron_optimizer(
            opt_config, [self.forward], config_overrides=overrides
        )
        if device.type == "cuda":
            _use_fused_adamw(self._parts())

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
        from zebractl.runtime import megatron_compat

        with megatron_compat.optimizer_step():
            ok, norm, _ = self.optimizer.step()
            if not ok:  # only a loss scaler (fp16) reports an overflow; bf16/fp32 never do
                raise RuntimeError("the Megatron optimizer skipped its update")
            if norm is None or self.cfg.optimizer.clip_grad == 0:
                norm = self.optimizer.get_grad_norm()
        return norm

    def reload_model_params(self) -> None:
        """Refresh the fp32 main parameters from weights loaded into the model."""
        self.optimizer.reload_model_params()

    def _parts(self) -> list:
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    @staticmethod
    def _main_to_model(part) -> dict[int, torch.nn.Parameter]:
        """fp32 main parameter (by id) -> the bf16 model parameter it shadows."""
        return {
            id(main): model
            for models, mains in zip(
                part.float16_groups, part.fp32_from_float16_groups, strict=True
            )
            for model, main in zip(models, mains, strict=True)
        }

    def sharded_optimizer_state(self, model_sd: dict, is_loading: bool = False) -> dict:
        """Adam moments and fp32 main parameters of every part, as sharded tensors."""
        if self.distributed:
            from zebractl.run.checkpoint import sharded_metadata

            # megatron's state_dict() reads every parameter's step count, which a fresh optimizer
            # (the template a resume loads into) does not have yet
            for part in self._parts():
                _ensure_adam_state(part.optimizer)
            metadata = sharded_metadata() | {"distrib_optim_sharding_type": DIST_OPT_FORMAT}
            return {
                "distributed": self.optimizer.sharded_state_dict(
                    model_sd, is_loading=is_loading, metadata=metadata
                )
            }
        return {
            f"part{i}": sharded_adam_state(part.optimizer, self._main_to_model(part), model_sd)
            for i, part in enumerate(self._parts())
        }

    def load_optimizer_state(self, loaded: dict) -> None:
        """Put a loaded :meth:`sharded_optimizer_state` back (moments and fp32 mains)."""
        if self.distributed:
            # no_grad: megatron 0.16.1's dp_reshardable loader (unlike its other loaders) copies into
            # the main params without it, and an fp32 parameter is its own main param (a leaf that
            # requires grad), so the copy raises "a view of a leaf Variable ... in-place"
            with torch.no_grad():
                self.optimizer.load_state_dict(loaded["distributed"])
            for part in self._parts():
                restore_step_counts(part.optimizer)
            if self.device.type == "cuda":
                _use_fused_adamw(self._parts())  # a loaded param group carries its saved flags
            return
        for i, part in enumerate(self._parts()):
            load_adam_state(part.optimizer, loaded[f"part{i}"], self._main_to_model(part))
        if self.device.type == "cuda":
            _use_fused_adamw(self._parts())


FP32_GROUP = "zebractl_fp32_group"
"""Parameter-group key that keeps fp32 parameters apart from bf16 ones (distributed optimizer)."""
DIST_OPT_FORMAT = "dp_reshardable"
"""megatron's sharding of the distributed optimizer's state in checkpoints: each rank writes its own
bucket shards (no gather); resumable on any data-parallel size."""


def _use_fused_adamw(parts: list) -> None:
    """Switch megatron's torch AdamW (what it uses without TE/Apex) to torch's fused CUDA kernel:
    one launch for every parameter's update instead of a multi-tensor loop of several."""
    for part in parts:
        opt = getattr(part, "optimizer", None)
        if not isinstance(opt, torch.optim.AdamW):
            continue  # TE's or Apex's FusedAdam is fused already
        opt.defaults["fused"], opt.defaults["foreach"] = True, None
        for group in opt.param_groups:
            group["fused"], group["foreach"] = True, None
            for p in group["params"]:  # the fused kernel reads the step counts on the device
                st = opt.state.get(p)
                if st and "step" in st and st["step"].device != p.device:
                    st["step"] = st["step"].to(p.device, torch.float32)


def restore_step_counts(opt: torch.optim.Optimizer) -> None:
    """Give every parameter of a torch Adam(W) loaded by megatron's distributed optimizer the step
    count its checkpoint saved (``param_group["step"]``), each as its own tensor.

    megatron-core 0.16.1 (torch optimizers, no TE/Apex) saves the step only in the param groups.
    Its ``dp_reshardable`` load first restores each parameter's ``state["step"]`` from there, then
    copies the loaded bucket state over every state tensor, and the bucket state's ``step`` is a
    non-persistent entry: the template optimizer's own step tensor, 0 in the fresh optimizer a
    resume loads into. The first update after a resume then ran as Adam's step 1 (bias
    corrections of a fresh start) and the resumed losses left the uninterrupted run's from the
    second iteration on (H200 test, 2026-12-01: iteration 6 equal, 7: 10.381 vs 10.188).
    """
    for group in opt.param_groups:
        step = group.get("step")
        if step is None:  # no step saved in the group: nothing megatron loaded
            continue
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            state = opt.state.get(p)
            if state and "step" in state:  # (TE/Apex FusedAdam keep no per-parameter step)
                state["step"] = torch.tensor(
                    float(step), dtype=torch.float32, device=p.device if on_device else "cpu"
                )


def _ensure_adam_state(opt: torch.optim.Optimizer) -> None:
    """Create AdamW's per-parameter state where it does not exist yet, as torch would at its first
    step (zero moments, step 0): a checkpoint then has the same tensors whatever the step."""
    for group in opt.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            state = opt.state[p]
            if state:
                continue
            state["step"] = torch.zeros(
                (), dtype=torch.float32, device=p.device if on_device else "cpu"
            )
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def sharded_adam_state(
    opt: torch.optim.Optimizer, main_to_model: dict[int, torch.nn.Parameter], model_sd: dict
) -> dict:
    """A torch Adam(W)'s state as megatron sharded tensors shaped and sharded like the model
    parameter each one belongs to (``main_to_model`` maps an fp32 main parameter to its model
    parameter; others are model parameters themselves), so megatron's checkpointing splits the
    writing among ranks and reshards it on load. The step count, the same for every parameter,
    and the hyper-parameters are common state."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        make_sharded_optimizer_tensor,
        optim_state_to_sharding_state,
    )

    _ensure_adam_state(opt)
    flat = [p for g in opt.param_groups for p in g["params"]]
    as_model = [main_to_model.get(id(p), p) for p in flat]
    id_map = get_param_id_to_sharded_param_map(model_sd, as_model)
    if len(id_map) != len(flat):
        raise RuntimeError(
            f"{len(flat) - len(id_map)} optimizer parameters have no model parameter to shard by"
        )
    state = opt.state_dict()
    steps = {float(st["step"]) for st in state["state"].values()}
    if len(steps) > 1:
        raise RuntimeError(f"parameters are at different optimizer steps: {sorted(steps)}")
    optim_state_to_sharding_state(state, id_map, exclude_keys=("step",))
    mains = {
        str(i): make_sharded_optimizer_tensor(id_map[i], p, prefix="optimizer.fp32_param")
        for i, p in enumerate(flat)
        if id(p) in main_to_model
    }
    return {"adam": state, "step": steps.pop() if steps else 0.0, "fp32_param": mains}


def load_adam_state(
    opt: torch.optim.Optimizer, loaded: dict, main_to_model: dict[int, torch.nn.Parameter]
) -> None:
    """Put a loaded :func:`sharded_adam_state` back into ``opt``."""
    state = loaded["adam"]
    for st in state["state"].values():
        st["step"] = torch.tensor(loaded["step"], dtype=torch.float32)
    opt.load_state_dict(state)
    flat = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(flat):
        if id(p) in main_to_model:
            p.data.copy_(loaded["fp32_param"][str(i)])


def check_engine(cfg: RunConfig, device: torch.device, world: int = 1) -> None:
    """Refuse engine settings that cannot run here (before any data or model is built)."""
    if cfg.kernels.cuda_graph:
        why = (
            "a CUDA GPU"
            if device.type != "cuda"
            else "optimizer.impl torch_fused"
            if cfg.optimizer.impl != "torch_fused"
            else "one GPU (parallelism.num_gpus 1)"
            if world > 1
            else None
        )
        if why:
            raise ConfigError(f"kernels.cuda_graph needs {why}; set kernels.cuda_graph=false")
    if cfg.kernels.cuda_graph and cfg.data.format == "chat":
        raise ConfigError(
            "kernels.cuda_graph with data.format chat: the graphed step averages each "
            "micro-batch on its own, not over the global batch's marked tokens; set "
            "kernels.cuda_graph=false"
        )
    if cfg.kernels.cuda_graph and cfg.data.isolated:
        raise ConfigError(
            "kernels.cuda_graph with data.packing isolated: the documents' boundaries differ "
            "from one micro-batch to the next and a graph replays one; set "
            "kernels.cuda_graph=false or data.packing: concat"
        )
    rc = cfg.recompute.mode
    if rc != "none" and (cfg.kernels.cuda_graph or cfg.kernels.fp8_mlp != "off"):
        what = "kernels.cuda_graph" if cfg.kernels.cuda_graph else "kernels.fp8_mlp"
        raise ConfigError(
            f"recompute.mode {rc} with {what} has not been tested on a GPU yet, so it is refused: "
            f"set recompute.mode=none or turn {what} off"
        )
    if cfg.precision == "fp16":
        raise ConfigError(
            "precision fp16 needs loss scaling, which `zebractl train` does not do; use bf16"
        )
    if cfg.kernels.fp8_mlp != "off":
        from zebractl.model.ops.fp8 import unsupported_reason

        why = unsupported_reason(device, cfg.precision)
        if why:
            raise ConfigError(why)
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


def build_engine(
    cfg: RunConfig, device: torch.device, world: int, seed: int, reference: str | None = None
) -> TorchEngine | MegatronEngine:
    """The model (built for the engine's parameter dtype) wrapped by the recipe's engine;
    ``reference="fla"``: FLA's class of the model, from the same initial weights."""
    from zebractl.model.model import build_model

    check_engine(cfg, device, world)
    if reference is not None:
        from zebractl.train import reference as ref

        return TorchEngine(cfg, ref.build(cfg, device, seed), device, world)
    if cfg.optimizer.impl == "torch_fused":
        model = build_model(
            cfg.model, kernels=cfg.kernels, device=device, seed=seed, recompute=cfg.recompute
        )
        return TorchEngine(cfg, model, device, world)
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    model = build_model(
        cfg.model,
        kernels=cfg.kernels,
        device=device,
        seed=seed,
        params_dtype=dtype,
        recompute=cfg.recompute,
    )
    return MegatronEngine(cfg, model, device, world)
