"""One micro-batch's forward and backward captured as a CUDA graph and replayed (``kernels.cuda_graph``).

Why: at micro-batch 16 a 300M step launches thousands of kernels, many through Triton's Python
launcher, and the H200 waits ~31 ms of a 183 ms step for the host (the profile of 2026-12-01 at
1ad596d: benchmarks/results/2026-12-01_h200_issue12d/README.md). A replayed graph launches them all
at once.

How (torch's whole-network capture recipe): the first :data:`WARMUP` micro-steps run eagerly on a
side stream (Triton autotuning, TileLang compiles, cuBLAS handles and lazy initialisation happen
there, and they are real training steps); the next one is captured: static input buffers, the
forward under autocast with its weight-cast cache off (a cached cast would replay stale weights),
the scaled loss and the backward into gradient buffers that exist before the capture, so the
captured gradient accumulation adds in place. Every later micro-step copies its batch into the
static inputs and replays. The optimizer step stays eager (a handful of fused launches).

From the capture on, the gradients are static buffers: the engine zeroes them in place instead of
freeing them (:attr:`TorchEngine.grads_static`), and parameters that received no gradient in the
warm-up keep none. Shapes are fixed by the recipe (micro-batch x sequence); a batch of another
shape runs eagerly. If the capture fails (a kernel that synchronises with the host, for one), the
run says why and goes on eagerly: nothing was executed by the failed capture.

Limits (refused by :func:`zebractl.train.engine.check_engine`): CUDA, the torch_fused engine, one
GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WARMUP = 2
"""Eager micro-steps before the capture."""


class GraphedMicroStep:
    """``step(tokens, labels, loss_mask)`` -> the micro-batch's scaled loss (detached), after its
    backward has added the gradients; eager for the first :data:`WARMUP` calls, then a graph."""

    def __init__(
        self,
        engine,
        accum: int,
        autocast: bool,
        console: Callable[[str], None] = print,
    ) -> None:
        self.engine, self.accum, self.autocast, self.console = engine, accum, autocast, console
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.stream = torch.cuda.Stream()
        self.static: dict[str, torch.Tensor] = {}
        self.loss: torch.Tensor | None = None
        self._had_grad: set[torch.nn.Parameter] = set()

    def _forward_backward(self, tokens, labels, loss_mask, cache: bool) -> torch.Tensor:
        ctx = torch.autocast(
            "cuda", dtype=torch.bfloat16, enabled=self.autocast, cache_enabled=cache
        )
        with ctx:
            loss_sum, ntok = self.engine.forward(tokens, labels=labels, loss_mask=loss_mask)
            loss = loss_sum / ntok.clamp(min=1) / self.accum
            loss.backward()
        return loss.detach()

    def _eager_on_side_stream(self, tokens, labels, loss_mask) -> torch.Tensor:
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            loss = self._forward_backward(tokens, labels, loss_mask, cache=True)
        current.wait_stream(self.stream)
        return loss

    def _capture(self, tokens, labels, loss_mask) -> bool:
        """Capture one micro-step; True if it worked (nothing has run yet either way)."""
        params = [p for p in self.engine.params if p.requires_grad]
        # the gradient buffers the graph adds into: those the warm-up produced, zero where a step
        # just began (zero_grad freed them); parameters without a gradient keep none
        for p in params:
            if p in self._had_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self.static = {
            "tokens": tokens.clone(),
            "labels": labels.clone(),
            "loss_mask": loss_mask.clone(),
        }
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-up's cached blocks, before the graph takes its pool
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the data loader's and checkpoint writer's CUDA calls on other threads
            # do not invalidate this thread's capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.loss = self._forward_backward(
                    self.static["tokens"],
                    self.static["labels"],
                    self.static["loss_mask"],
                    cache=False,
                )
        except Exception as exc:  # noqa: BLE001 - any capture failure: train on eagerly
            self.failed = True
            self.graph, self.static, self.loss = None, {}, None
            torch.cuda.synchronize()
            self.console(
                f"warning: kernels.cuda_graph: the capture failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); training continues without a CUDA graph"
            )
            return False
        self.graph = graph
        self.engine.grads_static = True
        self.console(
            f"kernels.cuda_graph: forward+backward captured after {self.calls - 1} eager "
            "micro-steps"
        )
        return True

    def __call__(self, tokens, labels, loss_mask) -> torch.Tensor:
        self.calls += 1
        if self.failed or (self.static and tokens.shape != self.static["tokens"].shape):
            return self._forward_backward(tokens, labels, loss_mask, cache=True)
        if self.graph is None and self.calls <= WARMUP:
            loss = self._eager_on_side_stream(tokens, labels, loss_mask)
            self._had_grad = {p for p in self.engine.params if p.grad is not None}
            return loss
        if self.graph is None and not self._capture(tokens, labels, loss_mask):
            return self._forward_backward(tokens, labels, loss_mask, cache=True)
        with torch.no_grad():
            self.static["tokens"].copy_(tokens, non_blocking=True)
            self.static["labels"].copy_(labels, non_blocking=True)
            self.static["loss_mask"].copy_(loss_mask, non_blocking=True)
        self.graph.replay()
        assert self.loss is not None
        return self.loss.clone()


def maybe_graphed(cfg, engine, accum: int, console) -> GraphedMicroStep | None:
    """The graphed micro-step when the recipe asks for it (eligibility checked at setup)."""
    if not cfg.kernels.cuda_graph:
        return None
    return GraphedMicroStep(engine, accum, engine.autocast, console)
