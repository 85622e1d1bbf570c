"""The FLA reference side of a parity run: FLA's own model class trained by zebractl's Trainer.

``zebractl train RECIPE --reference fla`` builds the recipe's model as zebractl would (the same
seeded initialisation), carries its weights into FLA 0.6.0's ``KDAForCausalLM`` /
``GatedDeltaNetForCausalLM`` through the conversion table (:mod:`zebractl.hf.mapping`, the
vocabulary's padding rows kept, so both compute the same softmax), and trains that module in the
same Trainer: the same samples in the same order, the same optimizer (torch AdamW, the recipe's
no-decay globs applied to the zebractl name of each FLA parameter), schedule, clipping and
precision (fp32 weights, bf16 autocast on CUDA). The loss is the mean cross-entropy of FLA's logits
over the unmasked tokens, in fp32.

On CUDA FLA's fused RMSNorm and SwiGLU are on (how FLA trains); on CPU FLA's Triton kernels cannot
run, so the forward runs through FLA's own naive pure-PyTorch implementations
(:func:`zebractl.runtime.fla_cpu.on_cpu`) with the fused modules off.

Checkpoints hold FLA's parameter names (megatron's sharded format, as every zebractl checkpoint):
they resume a reference run; they are not a zebractl model (convert the run it mirrors instead).
Only layouts FLA has a class for (pure KDA, pure GDN) and the torch_fused engine can be a
reference; anything else is refused with the reason.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from zebractl.errors import ConfigError

REFERENCES = ("fla",)


def check(cfg: Any, reference: str) -> str:
    """The FLA family of the recipe's model (kda / gdn), or a ConfigError saying why not."""
    from zebractl.hf import mapping

    if reference not in REFERENCES:
        raise ConfigError(f"--reference {reference}: expected one of {', '.join(REFERENCES)}")
    try:
        fam = mapping.family(cfg.model)
    except mapping.MappingError as exc:
        raise ConfigError(
            f"--reference fla: FLA has no class for this model ({exc}); a reference run needs a "
            "pure KDA or pure GDN model"
        ) from None
    if cfg.optimizer.impl != "torch_fused":
        raise ConfigError(
            "--reference fla trains as FLA trains (fp32 weights, autocast, torch AdamW): set "
            "optimizer.impl=torch_fused"
        )
    if cfg.kernels.cuda_graph:
        raise ConfigError(
            "--reference fla: no CUDA graph of FLA's classes (kernels.cuda_graph=false)"
        )
    if cfg.kernels.fp8_mlp != "off":
        raise ConfigError("--reference fla: FLA's classes have no FP8 MLP (kernels.fp8_mlp=off)")
    if cfg.data.isolated:
        raise ConfigError(
            "--reference fla trains FLA's classes on whole rows: set data.packing: concat "
            "(documents kept apart are zebractl's own)"
        )
    return fam


class FLAReference(torch.nn.Module):
    """FLA's HF model with zebractl's training interface: ``forward(tokens, labels, loss_mask)`` ->
    (sum of token losses, token count)."""

    def __init__(self, hf: torch.nn.Module, our_names: dict[str, str], cpu: bool) -> None:
        super().__init__()
        self.hf = hf
        self.our_names = our_names  # FLA parameter name -> the zebractl name it came from
        self.cpu = cpu

    def forward(
        self, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx: Any = contextlib.nullcontext()
        if self.cpu:
            from zebractl.runtime.fla_cpu import on_cpu

            ctx = on_cpu()
        with ctx:
            logits = self.hf(input_ids=tokens, use_cache=False).logits
        losses = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), labels.flatten(), reduction="none"
        )
        mask = loss_mask.flatten().float()
        return (losses * mask).sum(), mask.sum()

    def named_parameters_for_decay(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(zebractl name, parameter) of every trainable parameter."""
        return [
            (self.our_names.get(n, n), p) for n, p in self.hf.named_parameters() if p.requires_grad
        ]

    def sharded_state_dict(self, prefix: str = "", metadata: Any = None, **_: Any) -> dict:
        """FLA's parameters as megatron ShardedTensors (replicated over data-parallel ranks)."""
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        sd = dict(self.hf.state_dict(keep_vars=True))
        return make_sharded_tensors_for_checkpoint(sd, prefix + "hf.")


def build(cfg: Any, device: torch.device, seed: int) -> FLAReference:
    """FLA's model of the recipe, initialised with zebractl's seeded weights (see the module
    docstring)."""
    import fla.models as fm

    from zebractl.hf import mapping
    from zebractl.hf.load import FLA_CLASSES
    from zebractl.model.model import build_model

    fam = check(cfg, "fla")
    m = cfg.model
    # built exactly as the torch_fused engine builds ours (the initialisation draws from a
    # generator on the device, so the device must be the same for the same weights)
    ours = build_model(m, kernels=cfg.kernels, device=device, seed=seed)
    state = {
        k: v.detach().float() for k, v in ours.state_dict().items() if isinstance(v, torch.Tensor)
    }
    theirs = mapping.to_hf(state, m, "fla", keep_padding=True)
    names = mapping.origins(m, "fla")
    del ours
    gpu = device.type == "cuda"
    kw = mapping.fla_config(m, keep_padding=True)
    kw |= {"fuse_norm": gpu, "fuse_swiglu": gpu}
    config_cls, model_cls = FLA_CLASSES[fam]
    config = getattr(fm, config_cls)(**kw)
    hf = getattr(fm, model_cls)(config)
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and m.tie_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"FLA reference: missing {missing}, unexpected {unexpected}")
    return FLAReference(hf.float().to(device), names, cpu=not gpu).train()
