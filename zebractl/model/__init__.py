"""The Zebra model runtime (torch, megatron-core, FLA). Import cost is paid only by commands that
build a model."""

import warnings

# megatron-core announces at import that TE/apex are absent; zebractl never uses either, so the notice
# only confuses users. Silence exactly those messages.
warnings.filterwarnings(
    "ignore", message="Transformer Engine and Apex are not installed", category=UserWarning
)
warnings.filterwarnings(
    "ignore", message=".*custom_layers.transformer_engine.*", category=DeprecationWarning
)
