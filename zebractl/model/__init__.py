"""The Zebra model runtime (torch, megatron-core, FLA). Import cost is paid only by commands that
build a model."""
