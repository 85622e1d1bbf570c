"""One optimizer step, and the loss over held-out data: the micro-batch loop over an engine.

:class:`Stepper` holds what a step needs (the engine, the scheduler, the accumulation count, the
CUDA-graphed micro-step where there is one) and nothing of the run's bookkeeping: the Trainer counts
iterations and samples, feeds it the micro-batches and decides when to log, validate and save.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from zebractl.schemas.recipe import RunConfig

Tensor = torch.Tensor


@dataclass
class Stepper:
    """The micro-batch loop of one rank (see the module docstring)."""

    cfg: RunConfig
    engine: Any  # zebractl.train.engine's engine: model, optimizer, forward, step
    sched: Any  # megatron's OptimizerParamScheduler
    device: torch.device
    accum: int  # micro-batches per optimizer step on this rank
    world: int
    eod: int | None  # documents kept apart: the end-of-document token
    graphed: Any = None  # kernels.cuda_graph: the graphed micro-step
    skip_nonfinite: bool = False  # nonfinite.action skip: check before each update

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast where the engine computes under it."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.engine.autocast)

    def on_device(self, mb: dict[str, Any]) -> dict[str, Any]:
        """A loader's micro-batch on the device; ``extra`` holds the model's other arguments
        (``segments`` when documents are kept apart)."""
        from zebractl.train.data import keep_documents_apart

        out: dict[str, Any] = {k: v.to(self.device, non_blocking=True) for k, v in mb.items()}
        out["extra"] = {}
        if self.eod is not None:
            out["extra"]["segments"] = keep_documents_apart(out, self.eod)
        return out

    def forward(self, mb: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """The summed loss of a micro-batch's trained tokens and their count."""
        return self.engine.forward(
            mb["tokens"], labels=mb["labels"], loss_mask=mb["loss_mask"], **mb["extra"]
        )

    def step(self, batches: list[dict[str, Any]]) -> tuple[Tensor | None, Any]:
        """One optimizer step over this rank's micro-batches of a global batch; returns (loss,
        grad norm), the loss None if the update was skipped for a non-finite value."""
        engine = self.engine
        engine.model.train()
        engine.zero_grad()
        loss_acc = torch.zeros((), device=self.device)
        scale = self._chat_scale(batches) if self.cfg.data.format == "chat" else None
        for n_mb, mb in enumerate(batches, 1):
            if self.graphed is not None:  # one GPU: nothing to reduce across ranks
                loss_acc += self.graphed(mb["tokens"], mb["labels"], mb["loss_mask"])
                continue
            # reduce gradients across ranks once, on the last micro-batch of the step
            ctx = contextlib.nullcontext() if n_mb == self.accum else engine.no_sync()
            with ctx, self.autocast():
                loss_sum, ntok = self.forward(mb)
                if scale is None:  # every token trained on: the micro-batch means, averaged
                    loss = loss_sum / ntok.clamp(min=1) / self.accum
                else:  # the mean over the global batch's marked tokens (ranks average gradients)
                    loss = loss_sum * scale
                loss.backward()
            loss_acc += loss.detach()
        engine.finish_grads()
        if self.skip_nonfinite and not self._all_finite(loss_acc):
            return None, None  # one host sync per step, the price of deciding before the update
        grad_norm = engine.step()
        self.sched.step(increment=self.cfg.batch.global_)
        return loss_acc, grad_norm

    def _chat_scale(self, batches: list[dict[str, Tensor]]) -> Tensor:
        """``world / marked tokens of the global batch`` (data.format chat): each micro-batch's
        summed loss times it gives, after the ranks average their gradients, the mean over every
        marked token of the step, whatever the micro-batch and accumulation split."""
        import torch.distributed as tdist

        marked = sum(mb["loss_mask"].sum() for mb in batches).float()
        if self.world > 1:
            tdist.all_reduce(marked)
        return self.world / marked.clamp(min=1)

    def _all_finite(self, loss: Tensor) -> bool:
        """Whether the step's loss and every gradient are finite on every rank."""
        import torch.distributed as tdist

        bad = (~(torch.isfinite(loss) & self.engine.grads_finite())).to(torch.float32).reshape(1)
        if self.world > 1:
            tdist.all_reduce(bad)
        return bad.item() == 0

    @torch.no_grad()
    def held_out(self, dataset: Any, samples: int, rank: int) -> tuple[float, float]:
        """The summed loss and the token count over the first ``samples`` samples of
        ``dataset`` (the same every time), over all ranks."""
        import torch.distributed as tdist

        from zebractl.train.data import ConsumedSamplesSampler, loader

        c, model = self.cfg, self.engine.model
        sampler = ConsumedSamplesSampler(
            samples, 0, c.batch.micro, c.batch.global_, rank, self.world
        )
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        model.eval()
        try:
            cuda = self.device.type == "cuda"
            for mb in loader(dataset, sampler, c.data.num_workers, cuda):
                mb = self.on_device(mb)
                with self.autocast():
                    loss_sum, ntok = self.forward(mb)
                total += torch.stack([loss_sum.double(), ntok.double()])
        finally:
            model.train()
        if self.world > 1:
            tdist.all_reduce(total)
        loss_sum, tokens = total.tolist()
        return loss_sum, tokens
