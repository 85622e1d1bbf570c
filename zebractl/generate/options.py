"""The sampler's settings (no torch here: the CLI checks them before anything heavy loads)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (:func:`zebractl.generate.engine.pick`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
