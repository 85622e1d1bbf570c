"""zebractl's Hugging Face classes: ``ZebraConfig`` / ``ZebraForCausalLM`` (``model_type: zebra``).

Importing this package registers them with transformers' auto classes, so that after
``import zebractl.hf`` a folder written by ``zebractl convert`` (hybrids, pure Mamba2, or any model
with ``--format zebra``) loads with ``AutoModelForCausalLM.from_pretrained(folder)``, the same
contract as ``import fla`` for FLA's classes. Nothing here is imported by the CLI.
"""

from __future__ import annotations

import os

# transformers imports torchao when it is installed (zebractl[fp8]); its optional C++ extensions are
# not used here and a build for another torch logs load failures on import
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

from transformers import AutoConfig, AutoModelForCausalLM

from zebractl.hf.configuration import ZebraConfig
from zebractl.hf.modeling import ZebraForCausalLM, ZebraModel

AutoConfig.register(ZebraConfig.model_type, ZebraConfig, exist_ok=True)
AutoModelForCausalLM.register(ZebraConfig, ZebraForCausalLM, exist_ok=True)

__all__ = ["ZebraConfig", "ZebraForCausalLM", "ZebraModel"]
