"""One-token decode steps of a Zebra model replayed as a CUDA graph (``--cuda-graph``, the default
on a CUDA GPU).

Why: at 300M parameters a decode step is some hundreds of small kernel launches and the Python
between them; kda_300M took 21-29 ms per token eagerly on an H100 and 1.63 ms replayed, flat from
1k to 32k tokens of context (``benchmarks/results/2026-12-06_h100_775f8db_decode/``).

How: :meth:`zebractl.hf.modeling.ZebraForCausalLM.decode_step` has fixed shapes whatever the
position (the position is a tensor; MLA writes its latent row in place and attends over its whole
preallocated buffer, the rows past the position masked out; the recurrent states and convolution
tails are updated in place). The first step after a prefill runs eagerly on a side stream (kernels
compile and autotune, libraries initialise); the next one is captured and replayed, and every later
one copies its token and position into the graph's inputs and replays it. The graph holds the
addresses of the cache's buffers: when one is replaced (a new generation, a chat turn's prefill, a
restore, a latent buffer grown) the step is captured again. A capture that fails says why once and
the generation goes on eagerly, from the same state (a capture runs nothing).
"""

from __future__ import annotations

from typing import Any

import torch

from zebractl.errors import first_line

Tensor = torch.Tensor

WARMUP = 1
"""Eager steps before the first capture."""


def signature(cache: Any) -> tuple:
    """The addresses of every tensor the cache holds (what a captured step reads and writes)."""
    return tuple(
        (i, k, v.data_ptr())
        for i, d in enumerate(cache.layers)
        for k, v in sorted(d.items())
        if isinstance(v, Tensor)
    )


class GraphedDecode:
    """``step(cache, token)`` -> the fp32 logits ``[V]`` after ``token``, through a CUDA graph of
    :meth:`decode_step` (see the module docstring); counts the token in the cache."""

    def __init__(self, model: Any) -> None:
        self.model = model
        device = next(model.parameters()).device
        self.side = torch.cuda.Stream(device)  # the eager steps' (torch's recipe before a capture)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None
        self.captured_for: tuple | None = None
        self.pool: Any = None
        self.eager_steps = 0
        self.captures = 0
        self.replays = 0
        self.failed: str | None = None
        """Why the capture failed (then every step runs eagerly), or None."""

    def step(self, cache: Any, token: int) -> Tensor:
        cache.reserve(cache.seen + 1)
        self.token.fill_(token)
        self.position.fill_(cache.seen)
        if self.failed is None and self.eager_steps >= WARMUP:
            if self.graph is None or self.captured_for != signature(cache):
                self._capture(cache)
            if self.graph is not None:
                self.graph.replay()
                self.replays += 1
                cache.advance()
                assert self.logits is not None
                return self.logits[0].clone()
        logits = self._eager(cache)
        cache.advance()
        return logits[0]

    def _eager(self, cache: Any) -> Tensor:
        """One step outside a graph, on the side stream."""
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            logits = self.model.decode_step(self.token, self.position, cache)
        torch.cuda.current_stream().wait_stream(self.side)
        self.eager_steps += 1
        return logits

    def _capture(self, cache: Any) -> None:
        """Capture :meth:`decode_step` against the cache's current buffers (nothing runs).

        The graph captured before stays alive until this capture ends: it is what keeps the
        private memory pool both share; freed first, it would take the pool with it and the
        capture would begin on a pool that no longer exists (an internal assert of torch's
        allocator, raised after the capture had claimed the CUDA generators: every later random
        op of the process then failed)."""
        previous, self.graph = self.graph, None
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits = self.model.decode_step(self.token, self.position, cache)
        except Exception as exc:  # noqa: BLE001 - any failure: say why, go on eagerly
            self.failed = f"{type(exc).__name__}: {first_line(exc, type(exc).__name__)}"
            self.logits, self.pool = None, None
            return
        finally:
            del previous
        self.pool = graph.pool()
        self.graph, self.captured_for = graph, signature(cache)
        self.captures += 1
