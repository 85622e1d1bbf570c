"""Run schema: a recipe (``recipes/*.yaml``) = a preset reference + data, batch, optimizer, schedule, ...

The resolved form (:class:`RunConfig`) holds the fully merged ``model``; derived values (data-parallel
size, gradient accumulation, iterations from a token budget) are computed by :func:`derive` after all
layers merge, and cross-field rules are in :func:`run_problems`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from zebractl.schemas import bounds as B
from zebractl.schemas.base import StrictModel
from zebractl.schemas.kernels import KernelsConfig
from zebractl.schemas.preset import (
    MODEL_RELATED,
    ModelConfig,
    Problem,
    max_sequence_length,
    model_problems,
)


class DatasetEntry(StrictModel):
    """One prepared dataset (Megatron .bin/.idx prefix or a `zebractl prepare` output directory)."""

    path: str
    """Path prefix of the .bin/.idx pair, or a prepared dataset directory."""
    weight: float = Field(1.0, gt=0, le=B.WEIGHT)
    """Blend weight relative to the other datasets."""


class DataConfig(StrictModel):
    """Training data."""

    paths: list[DatasetEntry] = Field(min_length=1)
    """Prepared datasets and their blend weights."""
    split: list[Annotated[float, Field(ge=0, le=B.WEIGHT)]] | None = Field(
        None, min_length=3, max_length=3
    )
    """Train / validation / test proportions carved out of each dataset's train shards (megatron's
    split). Unset: the held-out data is the validation split `zebractl prepare --valid-fraction`
    wrote, if any. Setting both is an error."""
    seq_length: int = Field(gt=0, le=B.SEQ)
    """Tokens per training sample."""
    tokenizer: str | None = None
    """The tokenizer the data must have been prepared with (a local directory/file, or a Hub id):
    checked against each dataset's manifest by name and fingerprint. Unset: the datasets' own."""
    num_workers: int = Field(2, ge=0, le=B.WORKERS)
    """Data-loader worker processes per rank (0 loads in the training process)."""
    format: Literal["text", "chat"] = "text"
    """text: every token is trained on. chat: only the tokens the datasets' loss masks mark (the
    assistant turns of `zebractl prepare --format chat`), the loss their mean over the whole
    global batch (the same at any micro-batch and accumulation split); every dataset must have
    masks."""
    packing: Literal["concat", "isolated"] | None = None
    """How the documents packed into a row (each closed by the tokenizer's end-of-document token)
    see each other. concat: a row is one sequence; attention, convolutions and recurrent states
    run across a document boundary (FLA's and the seed's pretraining). isolated: each token sees
    its own document only; the recurrent mixers restart at each document (FLA's variable-length
    kernels), MLA attends within it, and the token after an end-of-document is not a label.
    Unset: isolated for chat data, concat for text."""

    @property
    def isolated(self) -> bool:
        """Whether documents are kept apart (``packing``, or its default for the format)."""
        return (self.packing or ("isolated" if self.format == "chat" else "concat")) == "isolated"


class BatchConfig(StrictModel):
    """Batch sizes in samples; gradient accumulation is derived."""

    micro: int = Field(gt=0, le=B.MICRO)
    """Samples per GPU per forward/backward (micro-batch)."""
    global_: int = Field(gt=0, le=B.GLOBAL, alias="global")
    """Samples per optimizer step over all data-parallel ranks."""


class OptimizerConfig(StrictModel):
    """AdamW."""

    type: Literal["adamw"] = "adamw"
    """Optimizer."""
    impl: Literal["megatron", "torch_fused"] = "megatron"
    """Megatron's optimizer (fp32 main params) or torch.optim.AdamW(fused=True) as FLA trains."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """Adam beta1."""
    beta2: float = Field(0.999, ge=0, lt=1)
    """Adam beta2."""
    eps: float = Field(1e-8, gt=0, le=1)
    """Adam epsilon."""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """Decoupled weight decay."""
    clip_grad: float = Field(1.0, ge=0, le=1e6)
    """Global gradient-norm clip; 0 disables clipping."""
    no_decay: list[str] = Field(default_factory=lambda: ["*.bias", "*norm.weight"])
    """Glob patterns of parameter names that skip weight decay."""


class ScheduleConfig(StrictModel):
    """Learning-rate schedule and run length (iterations or a token budget)."""

    lr: float = Field(gt=0, le=B.LR)
    """Peak learning rate."""
    min_lr: float = Field(0.0, ge=0, le=B.LR)
    """Final learning rate of the decay."""
    warmup_iterations: int = Field(0, ge=0, le=B.STEPS)
    """Linear warmup from 0 to lr."""
    decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup."""
    iterations: int | None = Field(None, gt=0, le=B.STEPS)
    """Optimizer steps; set this or train_tokens."""
    train_tokens: int | None = Field(None, gt=0, le=B.TOKENS)
    """Token budget; iterations = ceil(train_tokens / tokens per step)."""


class ParallelismConfig(StrictModel):
    """How the run is laid out on GPUs; data parallel = num_gpus / (tp * pp * cp)."""

    num_gpus: int = Field(1, gt=0, le=B.GPUS)
    """GPUs the run is planned for (all nodes)."""
    tp: int = Field(1, gt=0, le=B.PARALLEL)
    """Tensor-parallel size."""
    pp: int = Field(1, gt=0, le=B.PARALLEL)
    """Pipeline-parallel size."""
    cp: int = Field(1, gt=0, le=B.PARALLEL)
    """Context-parallel size."""
    distributed_optimizer: bool = False
    """Shard the fp32 main parameters and Adam state across data-parallel ranks (ZeRO-1; needs
    optimizer.impl megatron). Checkpoints hold megatron's per-bucket shards (dp_reshardable).
    Resuming restores Adam's step count, which megatron-core 0.16.1 resets to 0 on load; the resume
    is bitwise (the H200 test of the megatron engine, GPU check of 2026-12-02)."""


class CheckpointConfig(StrictModel):
    """Checkpointing."""

    enabled: bool = True
    """false: write no checkpoint at all, at an interval, at the end or on a stop signal (benchmark
    and smoke runs, whose saves can take longer than their training: 127 s for a 3B on an H200). A
    crash or a stop then loses the run; `zebractl train` says so when it starts. Resuming from
    checkpoints already in the directory is unchanged."""
    dir: str | None = None
    """Checkpoint directory; unset means OUTPUT_DIR/checkpoints."""
    interval: int = Field(1000, gt=0, le=B.STEPS)
    """Save every N iterations (and at the end)."""
    keep_last: int = Field(3, ge=0, le=10**6)
    """Keep the newest N checkpoints; 0 keeps all."""
    resume: Literal["auto", "never", "require"] = "auto"
    """auto: resume from the newest valid checkpoint if any; require: fail without one."""
    async_save: bool | Literal["auto"] = "auto"
    """auto: save in the background on a GPU where this node's available host memory holds twice
    the staged state of its ranks, otherwise block (`zebractl train` says which at the start);
    true: always in the background; false: training waits for each save. In the background,
    training pauses only while the state is copied to host memory and a writer process starts (0.2 s
    per save of a 300M model on an H200, against 8-17 s blocking); a checkpoint counts only once
    every rank's files are written and hashed (a crash meanwhile leaves an incomplete iter_N.tmp,
    which resume never takes); the next save, a stop and the end of the run wait for the one in
    flight. Resuming from background saves is bitwise exact (CPU tests, and the GPU check's engine
    tests on one H200). The staging memory is allocated once while training starts and held for the
    run: about 14 bytes per parameter on the Megatron engine, 12 on torch_fused, per rank's share."""

    @field_validator("async_save", mode="before")
    @classmethod
    def _async_save(cls, v: object) -> object:
        if v is True or v is False or v == "auto":
            return v
        raise ValueError(f"must be true, false or auto, not {v!r}")


class WandbConfig(StrictModel):
    """Weights & Biases tracking of the run (`pip install 'zebractl[wandb]'`): the resolved config
    with provenance as the W&B config, every train/val row, and later the results of eval and
    compare into the run directory. Files land under OUTPUT_DIR/wandb/; the run's W&B id is kept
    in OUTPUT_DIR/wandb.json, so a resume continues the same W&B run."""

    project: str = Field(min_length=1, max_length=128)
    """W&B project."""
    entity: str | None = Field(None, min_length=1, max_length=128)
    """W&B team or user (unset: the logged-in user's default entity)."""
    name: str | None = Field(None, min_length=1, max_length=128)
    """Display name of the run (unset: the run directory's name)."""
    group: str | None = Field(None, min_length=1, max_length=128)
    """Group of runs shown together (e.g. a run and its reference)."""
    tags: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64
    )
    """Tags of the run."""
    notes: str | None = None
    """A longer description of the run."""
    mode: Literal["online", "offline", "disabled"] = "online"
    """online: stream to the W&B server (needs `wandb login`); offline: write OUTPUT_DIR/wandb/
    only, uploaded later with `wandb sync OUTPUT_DIR/wandb/offline-run-*`; disabled: no tracking
    (wandb is not even imported)."""


class LoggingConfig(StrictModel):
    """Metrics output."""

    interval: int = Field(10, gt=0, le=B.STEPS)
    """Log every N iterations (and iteration 1 alone, and the last: the rows a parity report
    compares)."""
    jsonl: bool = True
    """Write OUTPUT_DIR/metrics.jsonl."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb: WandbConfig | None = None
    """Weights & Biases tracking (unset: none)."""


class ValidationConfig(StrictModel):
    """Loss on held-out data during training (`data.split` or prepare's validation split)."""

    interval: int = Field(1000, gt=0, le=B.STEPS)
    """Evaluate every N iterations (and once at the end of the run)."""
    iterations: int = Field(10, gt=0, le=10**6)
    """Global batches per evaluation; the same held-out samples every time, so values compare."""


class NonFiniteConfig(StrictModel):
    """What a NaN or Inf loss or gradient does to the run."""

    action: Literal["stop", "skip"] = "stop"
    """stop: end the run at the next logging interval, naming the iteration. skip: check every step
    (one host sync per step), drop that step's update and count it."""
    max_skipped: int = Field(10, ge=0, le=B.STEPS)
    """skip: stop once more than this many updates were skipped in the run; 0 never stops."""


class RecomputeConfig(StrictModel):
    """Activation recomputation: less memory for activations, paid for with forward work in the
    backward pass. The losses do not change (bitwise on CPU in fp32)."""

    mode: Literal["none", "selective", "full"] = "none"
    """none: autograd keeps every activation. selective: each sublayer keeps its input and the
    outputs of its matrix multiplications, and recomputes the rest in the backward pass (norms,
    activations, the recurrent mixers' and MLA's core kernels): no GEMM runs twice. full: each
    checkpointed block keeps only its input and runs its whole forward again in the backward pass
    (the most memory saved, about one more forward of compute)."""
    blocks: int | None = Field(None, gt=0, le=B.BLOCKS)
    """full only: checkpoint the first N blocks and keep the rest's activations (Megatron's
    recompute_num_layers); null: every block."""


class RunConfig(StrictModel):
    """A resolved recipe: the merged model plus everything needed to run it."""

    description: str = ""
    """One-line summary shown by `zebractl recipes`."""
    preset: str
    """The architecture preset (a shipped name or a path) the model section starts from."""
    model: ModelConfig
    """The architecture (preset values merged with this recipe's overrides)."""
    data: DataConfig
    """Training data."""
    batch: BatchConfig
    """Batch sizes."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer."""
    schedule: ScheduleConfig
    """Learning-rate schedule and run length."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Compute precision (mixed-precision ones keep fp32 main params and grads)."""
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    """Parallel layout."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpointing."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Metrics output."""
    kernels: KernelsConfig = Field(default_factory=KernelsConfig)
    """Kernel backend and fusions."""
    recompute: RecomputeConfig = Field(default_factory=RecomputeConfig)
    """Activation recomputation (memory for compute)."""
    validation: ValidationConfig | None = Field(default_factory=ValidationConfig)
    """Held-out evaluation; null turns it off."""
    nonfinite: NonFiniteConfig = Field(default_factory=NonFiniteConfig)
    """NaN/Inf guard."""
    seed: int = Field(1234, ge=0, le=B.SEED)
    """Random seed for init, data order and dropout."""
    init_from: str | None = None
    """Weights to start from (post-training): a run directory (its newest intact checkpoint), a
    checkpoint folder, or a Hugging Face export; relative to the working directory. Only the
    weights are read: a fresh optimizer, schedule and data order. Ignored once this run has a
    checkpoint of its own (it resumes from that); `train --init-from` overrides it."""
    output_dir: str | None = None
    """Run directory; unset means runs/<recipe name>."""


class Derived(StrictModel):
    """Values computed from a resolved recipe (never set by a user)."""

    data_parallel: int
    """num_gpus / (tp * pp * cp)."""
    grad_accumulation: int
    """global / (micro * data_parallel)."""
    tokens_per_step: int
    """global * seq_length."""
    iterations: int
    """Optimizer steps of the run."""
    total_tokens: int
    """iterations * tokens_per_step."""
    sublayers: list[str]
    """Explicit sublayer list (mixer, mlp, ...)."""


def derive(cfg: RunConfig) -> Derived:
    """Compute derived values; call only on a config without problems."""
    p = cfg.parallelism
    dp = p.num_gpus // (p.tp * p.pp * p.cp)
    tokens = cfg.batch.global_ * cfg.data.seq_length
    if cfg.schedule.iterations is not None:
        iters = cfg.schedule.iterations
    else:
        assert cfg.schedule.train_tokens is not None
        iters = -(-cfg.schedule.train_tokens // tokens)
    return Derived(
        data_parallel=dp,
        grad_accumulation=cfg.batch.global_ // (cfg.batch.micro * dp),
        tokens_per_step=tokens,
        iterations=iters,
        total_tokens=iters * tokens,
        sublayers=list(cfg.model.sublayers),
    )


_PARALLEL = ("parallelism.num_gpus", "parallelism.tp", "parallelism.pp", "parallelism.cp")
RUN_RELATED: dict[str, tuple[str, ...]] = {
    "parallelism.num_gpus": _PARALLEL[1:],
    "batch.global": ("batch.micro", *_PARALLEL),
    "parallelism.pp": ("model.num_blocks",),
    "parallelism.tp": ("model.kda", "model.gdn", "model.mla", "model.kda.num_heads",
                       "model.gdn.num_heads", "model.mla.num_heads"),
    "schedule.min_lr": ("schedule.lr",),
    "schedule.iterations": ("schedule.train_tokens",),
    "schedule.warmup_iterations": ("schedule.iterations", "schedule.train_tokens",
                                   "batch.global", "data.seq_length"),
    "data.seq_length": ("model.max_position_embeddings", "model.mla", "parallelism.cp"),
    "recompute.blocks": ("recompute.mode", "model.num_blocks"),
}  # fmt: skip
""":data:`~zebractl.schemas.preset.MODEL_RELATED` for :func:`run_problems`' keys."""


def related_keys(key: str) -> tuple[str, ...]:
    """The keys a cross-field problem reported at ``key`` depends on: a recipe's (``batch.global``,
    ``model.layout``) or a preset's (``layout``)."""
    if key in RUN_RELATED:
        return RUN_RELATED[key]
    if key.startswith("model."):
        return tuple("model." + k for k in MODEL_RELATED.get(key.removeprefix("model."), ()))
    return MODEL_RELATED.get(key, ())


def run_problems(cfg: RunConfig) -> list[Problem]:
    """Every cross-field inconsistency of a resolved recipe, keys relative to the config root."""
    out: list[Problem] = [(f"model.{k}", msg) for k, msg in model_problems(cfg.model)]
    m, p, b, s = cfg.model, cfg.parallelism, cfg.batch, cfg.schedule
    model_parallel = p.tp * p.pp * p.cp
    dp = 0
    if p.num_gpus % model_parallel:
        out.append(
            (
                "parallelism.num_gpus",
                f"num_gpus {p.num_gpus} is not divisible by tp*pp*cp "
                f"= {p.tp}*{p.pp}*{p.cp} = {model_parallel}",
            )
        )
    else:
        dp = p.num_gpus // model_parallel
    if dp and b.global_ % (b.micro * dp):
        out.append(
            (
                "batch.global",
                f"global batch {b.global_} is not a multiple of micro batch "
                f"{b.micro} x data-parallel size {dp} = {b.micro * dp}",
            )
        )
    if (2 * m.num_blocks) % p.pp:
        out.append(
            (
                "parallelism.pp",
                f"{2 * m.num_blocks} sublayers ({m.num_blocks} blocks) do not "
                f"split evenly into {p.pp} pipeline stages",
            )
        )
    if p.tp > 1:
        for name in ("kda", "gdn", "mla"):
            block = getattr(m, name)
            if block is not None and block.num_heads % p.tp:
                out.append(
                    (
                        "parallelism.tp",
                        f"model.{name}.num_heads {block.num_heads} is not divisible by tp {p.tp}",
                    )
                )
        if m.kda is not None:
            out.append(
                (
                    "parallelism.tp",
                    "KDA's fused f_a/g_a bottleneck cannot be split: tp "
                    "must be 1 for models with KDA blocks",
                )
            )
    if s.min_lr > s.lr:
        out.append(("schedule.min_lr", f"min_lr {s.min_lr} is larger than lr {s.lr}"))
    if (s.iterations is None) == (s.train_tokens is None):
        out.append(
            (
                "schedule.iterations",
                "set exactly one of schedule.iterations and schedule.train_tokens",
            )
        )
    else:
        iters = s.iterations or -(-(s.train_tokens or 0) // (b.global_ * cfg.data.seq_length))
        if s.warmup_iterations > iters:
            out.append(
                (
                    "schedule.warmup_iterations",
                    f"warmup {s.warmup_iterations} is longer than the run ({iters} iterations)",
                )
            )
    limit, why = max_sequence_length(m)
    if cfg.data.seq_length > limit:
        out.append(
            (
                "data.seq_length",
                f"seq_length {cfg.data.seq_length} exceeds the model's "
                f"{why} ({limit}); raise model.max_position_embeddings or configure MLA "
                "YaRN scaling",
            )
        )
    split = cfg.data.split
    if split is not None and (split[0] <= 0 or any(x < 0 for x in split)):
        out.append(
            ("data.split", "split proportions must be non-negative with a positive train part")
        )
    rc = cfg.recompute
    if rc.blocks is not None and rc.mode != "full":
        out.append(("recompute.blocks", f"applies to recompute.mode full, not {rc.mode!r}"))
    elif rc.blocks is not None and rc.blocks > m.num_blocks:
        out.append(
            ("recompute.blocks", f"{rc.blocks} is more than the model's {m.num_blocks} blocks")
        )
    if p.cp > 1 and cfg.data.seq_length % (2 * p.cp):
        out.append(("data.seq_length", f"seq_length must be divisible by 2*cp = {2 * p.cp}"))
    return out
