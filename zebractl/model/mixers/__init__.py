"""The recurrent mixers, one module each: Kimi Delta Attention (:mod:`.kda`), Gated DeltaNet
(:mod:`.gdn`) and Mamba2 (:mod:`.mamba2`), in the fused Primus layout; :mod:`.common` holds what
they share.

Tensor names and shapes are those of :mod:`zebractl.layout`. Mixers are tensor-parallel size 1 (KDA's
f_a/g_a bottleneck cannot be split; the schema and the builder refuse tp > 1 for recurrent mixers), so
their projections are plain ``nn.Linear``. Inputs and outputs are batch-first ``[B, T, H]``.

``forward(x, cu_seqlens)``: with ``cu_seqlens`` (``x`` one flattened sequence ``[1, N, H]``) each
document is mixed on its own, its convolution and state starting from zero
(:mod:`zebractl.model.segments`). The Hugging Face model (:mod:`zebractl.hf.modeling`) uses
:data:`HF_MIXERS`: Mamba2's module itself, and for KDA and GDN the ``*Unfused`` modules with FLA's
tensor names (separate q/k/v), which share their mixer's op call and output norm;
``forward(x, cache=...)`` continues a generation cache.

A new mixer is written in four files: its config block in ``zebractl/schemas/preset.py`` (the
class, the ``ModelConfig`` field, its name in the ``RecurrentMixer`` / ``Mixer`` / ``Sublayer``
literals, its checks in ``model_problems``); its torch-free module ``zebractl/layout/<name>.py``
(tensors and in_proj rows, FLOPs, activations for ``zebractl plan``, conversion entries: a
``MixerSpec``); its torch module ``zebractl/model/mixers/<name>.py`` (the module, its op call, its
``init_own``); and its kernel op in ``zebractl/model/ops/__init__.py`` (FLA on CUDA, the
pure-PyTorch implementation elsewhere), unless an existing op computes it. Two registries name it:
one line in ``zebractl/layout/__init__.py``'s ``MIXER_SPECS`` and one in each of :data:`MIXERS`
and :data:`HF_MIXERS` here. Nothing else branches on the mixer kinds except FLA-specific code
(``train/reference.py``, ``runtime/fla_cpu.py``, ``hf/mapping.fla_config``, ``convert/primus.py``'s
Primus tables) and the fitted memory constant in ``zebractl/planning/plan.py`` (a mixer without
one is counted analytically).
"""

from __future__ import annotations

from zebractl.model.mixers.gdn import GDNMixer, GDNUnfused
from zebractl.model.mixers.kda import KDAMixer, KDAUnfused
from zebractl.model.mixers.mamba2 import Mamba2Mixer

MIXERS = {"kda": KDAMixer, "gdn": GDNMixer, "mamba2": Mamba2Mixer}
"""Mixer kind -> the training model's module (the fused Primus layout)."""
HF_MIXERS = {"kda": KDAUnfused, "gdn": GDNUnfused, "mamba2": Mamba2Mixer}
"""Mixer kind -> the Hugging Face model's module (FLA's tensor names), ``forward(x, cache=...)``."""

__all__ = ["HF_MIXERS", "MIXERS", "GDNMixer", "GDNUnfused", "KDAMixer", "KDAUnfused", "Mamba2Mixer"]
