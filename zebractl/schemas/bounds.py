"""Upper bounds of every numeric config field: the largest value the runtime can actually hold.

They are generous (several times the largest shipped model) and exist so that a typo or a hostile
value (``num_blocks: 1000000000``, a 400-digit integer, ``lr: .inf``) is a validation error naming the
key, not a crash or a hang later. Every float is also finite (``allow_inf_nan=False`` on the base
class). The bounds appear in the exported JSON Schemas as ``maximum``.
"""

from __future__ import annotations

DIM = 1 << 16
"""Widths: hidden size, head dimensions, LoRA ranks, Mamba2 state (65,536)."""
FFN = 1 << 18
"""SwiGLU intermediate size (262,144)."""
HEADS = 1 << 10
"""Attention, key/value and SSM heads or groups (1,024)."""
BLOCKS = 1 << 10
"""Blocks of a model (1,024 blocks = 2,048 sublayers)."""
VOCAB = 1 << 22
"""Vocabulary entries (4,194,304)."""
POSITIONS = 1 << 24
"""Positions a model is configured for (16,777,216)."""
KERNEL = 64
"""Short-convolution kernel size."""
SEQ = 1 << 20
"""Tokens per training sample (1,048,576)."""
MICRO = 1 << 16
"""Samples per micro-batch."""
GLOBAL = 1 << 24
"""Samples per optimizer step."""
STEPS = 10**9
"""Iterations, intervals, step counts."""
TOKENS = 10**16
"""A token budget (10 quadrillion)."""
GPUS = 1 << 17
"""GPUs of a run (131,072)."""
PARALLEL = 1 << 10
"""Tensor-, pipeline- or context-parallel size."""
WORKERS = 256
"""Data-loader worker processes per rank."""
SEED = 2**32 - 1
"""Largest seed (numpy's seeds are 32-bit)."""
WEIGHT = 1e9
"""Blend weights and split proportions (relative numbers)."""
LR = 10.0
"""Learning rates."""
SCALE = 1e12
"""Large finite scales (RoPE base)."""
