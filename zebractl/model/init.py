"""Initialization equal in distribution to FLA's ``post_init`` (the flame/HF path), seeded.

Rules, by module kind:

- every linear, convolution and embedding weight: N(0, init_std) — no depth scaling unless
  ``init_scaled_output`` (then output projections use init_std / sqrt(2 * num_blocks)); biases 0;
- norm weights 1 (biases 0 for LayerNorm);
- KDA: A_log = log U(1, 16) per value head (0 with safe_gate); dt_bias = softplus^-1(dt),
  dt = exp(U(ln 1e-3, ln 0.1)) clamped >= 1e-4, per (value head, key channel);
- GDN: A_log = log U(0, 16) (FLA's GatedDeltaNet; the 0 end is nudged to the smallest positive float so
  log never gives -inf); dt_bias as KDA, per value head;
- Mamba2: A_log = log U(1, 16), D = 1, dt_bias as above, per head.

Every parameter must be claimed by exactly one rule; an unclaimed one is an error (a new module
without an init rule must not train from ``torch.empty`` garbage).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zebractl.model.mixers import GDNMixer, KDAMixer, Mamba2Mixer
from zebractl.model.norms import GatedNorm, Norm
from zebractl.schemas.preset import ModelConfig

OUTPUT_PROJECTIONS = (
    "mixer.out_proj.weight",
    "self_attention.linear_proj.weight",
    "mlp.linear_fc2.weight",
)


def _inv_softplus_dt(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    lo, hi = math.log(1e-3), math.log(0.1)
    dt = torch.exp(torch.rand(n, generator=gen, device=device) * (hi - lo) + lo).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


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

    def normal(name: str, p: torch.Tensor) -> None:
        std = out_std if name.endswith(OUTPUT_PROJECTIONS) else m.init_std
        p.normal_(0.0, std, generator=gen)

    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in done:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            if isinstance(module, Norm | GatedNorm) or mod_name.endswith("mixer.norm"):
                p.fill_(1.0 if pname == "weight" else 0.0)
            elif isinstance(module, KDAMixer | GDNMixer | Mamba2Mixer):
                _mixer_param(module, pname, p, gen)
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


def _mixer_param(mixer: nn.Module, name: str, p: torch.Tensor, gen: torch.Generator) -> None:
    n = p.numel()
    if name == "dt_bias":
        p.copy_(_inv_softplus_dt(n, gen, p.device))
    elif name == "A_log":
        if isinstance(mixer, KDAMixer) and mixer.cfg.safe_gate:
            p.zero_()
        elif isinstance(mixer, GDNMixer):
            u = torch.empty(n, device=p.device).uniform_(0, 16, generator=gen)
            p.copy_(u.clamp(min=torch.finfo(torch.float32).tiny).log())
        else:
            p.copy_(torch.empty(n, device=p.device).uniform_(1, 16, generator=gen).log())
    elif name == "D":
        p.fill_(1.0)
    else:  # pragma: no cover - mixers own no other direct parameters
        raise RuntimeError(f"no init rule for mixer parameter {name}")
