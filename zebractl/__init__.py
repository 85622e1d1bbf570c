"""zebractl: declarative pretraining of Zebra hybrid recurrent-attention language models."""

import warnings as _warnings

__version__ = "0.1.0"

# megatron-core announces at import that Transformer Engine and apex are absent; zebractl never uses
# either, so the notice would only confuse users. Silence exactly those messages (no import here).
_warnings.filterwarnings(
    "ignore", message="Transformer Engine and Apex are not installed", category=UserWarning
)
_warnings.filterwarnings(
    "ignore", message=".*custom_layers.transformer_engine.*", category=DeprecationWarning
)
# FLA announces on a machine without a GPU that it runs its kernels' PyTorch fallbacks: that is
# what zebractl chose (its own torch ops on CPU), not news to the user.
_warnings.filterwarnings(
    "ignore", message="Triton is not supported on current platform", category=UserWarning
)
