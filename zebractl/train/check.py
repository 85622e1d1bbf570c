"""`zebractl train RECIPE --check`: every pre-flight check of a run, without training.

The config (resolved and validated before this runs), the engine settings against this machine,
the GPU count, the data (shards, tokenizer, held-out part, vocabulary), the memory plan against
the GPU when there is one, and the free space where the checkpoints go against one checkpoint (the
newest one's size, else the plan's), and the weights ``init_from`` names against the recipe's
model (:mod:`zebractl.train.init_source`). What this machine cannot check (a CUDA-only engine or kernel on a
machine without CUDA, the GPU count and memory without a GPU) is listed as ``not checked``, never
as passed; only a ``failed`` row makes the check fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebractl.errors import ConfigError
from zebractl.schemas.reports import PreflightCheck, TrainCheckReport

if TYPE_CHECKING:
    from zebractl.train.launch import TrainRequest


def _row(name: str, status: str, detail: str) -> PreflightCheck:
    """One pre-flight check (status ``ok``, ``not checked`` or ``failed``)."""
    return PreflightCheck(name=name, status=status, detail=detail)


def _engine(cfg: Any, cuda: bool) -> PreflightCheck:
    import torch

    from zebractl.train.engine import check_engine

    world = cfg.parallelism.num_gpus
    if cuda:
        try:
            check_engine(cfg, torch.device("cuda", 0), world)
        except ConfigError as exc:
            return _row("engine", "failed", str(exc))
        return _row("engine", "ok", f"{cfg.optimizer.impl} on CUDA")
    k = cfg.kernels
    cuda_only = [
        what
        for what, on in (
            ("optimizer.impl megatron", cfg.optimizer.impl == "megatron"),
            ("kernels.cuda_graph", k.cuda_graph),
            (f"kernels.fp8_mlp {k.fp8_mlp}", k.fp8_mlp != "off"),
        )
        if on
    ]
    # the engine's other rules, checked here with the CUDA-only settings set aside (the megatron
    # engine's own options, valid with it, go with it)
    rest = cfg.model_copy(
        update={"kernels": k.model_copy(update={"cuda_graph": False, "fp8_mlp": "off"})}
    )
    if cfg.optimizer.impl == "megatron":
        rest = rest.model_copy(
            update={
                "optimizer": cfg.optimizer.model_copy(update={"impl": "torch_fused"}),
                "parallelism": cfg.parallelism.model_copy(update={"distributed_optimizer": False}),
            }
        )
    try:
        check_engine(rest, torch.device("cpu"), world)
    except ConfigError as exc:
        return _row("engine", "failed", str(exc))
    if cuda_only:
        return _row("engine", "not checked", f"{', '.join(cuda_only)}: CUDA only, no GPU here")
    return _row("engine", "ok", f"{cfg.optimizer.impl}, runs on this machine")


def _gpus(cfg: Any, cuda: bool) -> PreflightCheck:
    import torch

    want = cfg.parallelism.num_gpus
    if not cuda:
        return _row("gpus", "not checked", f"the recipe plans {want} GPU(s); no GPU here")
    have = torch.cuda.device_count()
    if have >= want:
        return _row("gpus", "ok", f"{want} planned, {have} here")
    return _row(
        "gpus",
        "ok",
        f"{want} planned, {have} here: a run here accumulates gradients to keep the global batch "
        "(or launch it where the GPUs are)",
    )


def _data(cfg: Any) -> PreflightCheck:
    from zebractl.data.spec import resolve_data

    try:
        spec = resolve_data(cfg)
    except ConfigError as exc:
        return _row("data", "failed", str(exc))
    if not spec.train:
        return _row("data", "failed", "data.paths holds no training shards")
    val = cfg.validation
    held_out = bool(spec.valid) if cfg.data.split is None else cfg.data.split[1] > 0
    if val is not None and not held_out:
        return _row(
            "data",
            "failed",
            f"validation is on (every {val.interval} iterations) but the data has no held-out "
            "part: set data.split (e.g. [99, 1, 0]) or validation: null",
        )
    if spec.vocab_size > cfg.model.vocab_size:
        return _row(
            "data",
            "failed",
            f"the data's tokenizer has {spec.vocab_size:,} tokens, the model's vocabulary "
            f"{cfg.model.vocab_size:,}",
        )
    tokens = sum(s.tokens for s in spec.train)
    return _row(
        "data",
        "ok",
        f"{len(spec.train)} shard(s), {tokens:,} tokens, tokenizer "
        f"{spec.tokenizer_source or 'as prepared'}"
        + (", held-out part present" if held_out else ""),
    )


def _memory(cfg: Any, cuda: bool) -> PreflightCheck:
    import torch

    from zebractl.planning.plan import GIB, memory_estimate, parameter_report
    from zebractl.schemas.recipe import derive

    e = memory_estimate(cfg, parameter_report(cfg.model)["total"], derive(cfg))
    need = e.total(cfg.batch.micro) / GIB
    if not cuda:
        return _row("memory", "not checked", f"estimate {need:.1f} GiB per GPU; no GPU here")
    have = torch.cuda.get_device_properties(0).total_memory / GIB
    status = "ok" if need <= have else "failed"
    return _row(
        "memory",
        status,
        f"estimate {need:.1f} GiB per GPU at micro-batch {cfg.batch.micro}, {have:.1f} GiB on "
        "the GPU" + ("" if status == "ok" else " (lower batch.micro; `zebractl plan --fit`)"),
    )


def _disk(cfg: Any, checkpoints: Path) -> PreflightCheck:
    from zebractl.planning.plan import checkpoint_bytes, parameter_report
    from zebractl.run import checkpoint as ckpt
    from zebractl.run import disk

    if not cfg.checkpoint.enabled:
        return _row("disk", "ok", "checkpoint.enabled is false: the run saves no checkpoint")

    done = ckpt.complete(checkpoints)
    need = ckpt.size(done[-1].folder) if done else 0
    source = "the newest checkpoint's size" if need else "planned"
    if not need:
        need = checkpoint_bytes(cfg, parameter_report(cfg.model)["total"])
    free = disk.free_bytes(checkpoints)
    if free is None:
        return _row("disk", "not checked", f"the free space at {checkpoints} cannot be read")
    keep = cfg.checkpoint.keep_last
    detail = (
        f"{disk.human(free)} free at {checkpoints}; one checkpoint about {disk.human(need)} "
        f"({source}); checkpoint.keep_last {keep or 'all'} keeps "
        + (f"about {disk.human(need * (keep + 1))} at a save" if keep else "them all")
    )
    if free < need:
        return _row("disk", "failed", detail + ": the first save would fail")
    return _row("disk", "ok", detail)


def _init(cfg: Any, run: Any, path: Path | None, given_by: str) -> list[PreflightCheck]:
    """The weights ``init_from`` names against the recipe's model (no row without one); a source
    not there yet (a base run still to train) is not checked."""
    from zebractl.config.models import described
    from zebractl.train.init_source import check_init, label

    if path is None:
        return []
    if not path.exists():
        return [_row("init", "not checked", f"{label(path, given_by)}: not there yet")]
    try:
        src = check_init(cfg, run, path, given_by)
    except ConfigError as exc:
        return [_row("init", "failed", str(exc))]
    if src is None:
        return [_row("init", "ok", f"{run.root} resumes the run it started from {path}")]
    what = f"holds {described(src.model, src.preset)}" if src.model is not None else "fits"
    return [_row("init", "ok", "; ".join([f"{path} {what}, the recipe's model", *src.notes]))]


def preflight(cfg: Any, checkpoints: Path) -> list[PreflightCheck]:
    """Every check of a resolved recipe whose checkpoints go to ``checkpoints`` (see the module
    docstring)."""
    import torch

    cuda = torch.cuda.is_available()
    return [
        _row("config", "ok", "resolved and validated"),
        _engine(cfg, cuda),
        _gpus(cfg, cuda),
        _data(cfg),
        _memory(cfg, cuda),
        _disk(cfg, checkpoints),
    ]


def check(req: TrainRequest) -> TrainCheckReport:
    """``train --check``: the same validation and resolution as a real train (``--nproc``,
    ``--reference``, the GPU count, the run directory), then :func:`preflight`."""
    from zebractl.train.launch import resolve_request

    resolved = resolve_request(req, world=None)
    cfg = resolved.resolved.run
    checks = preflight(cfg, resolved.run.checkpoints)
    if req.init_from is not None:
        checks += _init(cfg, resolved.run, req.init_from, "--init-from")
    elif cfg.init_from:
        given_by = resolved.resolved.provenance.get("init_from", "default")
        checks += _init(cfg, resolved.run, Path(cfg.init_from), given_by)
    return TrainCheckReport(
        recipe=req.recipe, ok=all(c.status != "failed" for c in checks), checks=checks
    )
