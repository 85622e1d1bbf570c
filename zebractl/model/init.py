"""Initialization equal in distribution to FLA's ``post_init`` (the flame/HF path), seeded.

Rules, by module kind:

- every linear, convolution and embedding weight: N(0, init_std) — no depth scaling unless
  ``init_scaled_output`` (then output projections use init_std / sqrt(2 * num_blocks)); biases 0;
- norm weights 1 (biases 0 for LayerNorm);
- a recurrent mixer's own parameters (A_log, dt_bias, Mamba2's D): its ``init_own``, written down
  in its module (:mod:`zebractl.model.mixers`).

Every parameter must be claimed by exactly one rule; an unclaimed one is an error (a new module
without an init rule must not train from ``torch.empty`` garbage).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zebractl.model.mixers import MIXERS
from zebractl.model.norms import NORMS
from zebractl.schemas.preset import ModelConfig

OUTPUT_PROJECTIONS = (
    "mixer.out_proj.weight",
    "self_attention.linear_proj.weight",
    "mlp.linear_fc2.weight",
)


@torch.no_grad()
def initialize(model: nn.Module, m: ModelConfig, seed: int) -> None:
    """Initialise every parameter of ``model`` in place (no-op on the meta device)."""
    params = dict(model.named_parameters())
    if not params or next(iter(params.values())).is_meta:
        return
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)
    out_std = m.init_std / math.sqrt(2 * m.num_blocks) if m.init_scaled_output else m.init_std
    done: set[int] = set()
    mixers = tuple(MIXERS.values())

    def normal(name: str, p: torch.Tensor) -> None:
        std = out_std if name.endswith(OUTPUT_PROJECTIONS) else m.init_std
        p.normal_(0.0, std, generator=gen)

    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in done:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            if isinstance(module, NORMS):
                p.fill_(1.0 if pname == "weight" else 0.0)
            elif isinstance(module, mixers):
                module.init_own(pname, p, gen)
            elif pname == "bias":
                p.zero_()
            elif pname == "weight":
                normal(full, p)
            else:
                raise RuntimeError(f"no init rule for parameter {full}")
            done.add(id(p))
    missing = [n for n, p in params.items() if id(p) not in done]
    if missing:  # pragma: no cover - guarded by the rule table above
        raise RuntimeError(f"parameters left uninitialised: {missing}")
