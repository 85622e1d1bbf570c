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


class KernelsConfig(StrictModel):
    """Kernel backend and every FLA fusion toggle, as explicit booleans."""

    backend: Literal["auto", "fla", "torch"] = "auto"
    """auto: FLA Triton kernels on CUDA, pure PyTorch elsewhere; fla/torch force one."""
    fused_rmsnorm: bool = True
    """FLA fused RMSNorm (with residual add) for pre-norms and the final norm."""
    rmsnorm_backward: Literal["fla", "tiled"] = "tiled"
    """Backward kernel of the fused RMSNorm: fla = FLA 0.6.0's, which for rows wider than 512
    gives each program one row at a time (19.7 ms of a 301 ms kda_300M step at micro-batch 32 on
    an H100, three times its forward); tiled = zebractl's (a tile of rows per program, FLA's
    arithmetic with one rounding per output, GPU-tested against fp64). tiled with swiglu_kernel
    packed: 1.06x the step of FLA's two kernels on an H100 (benchmarks/README.md, 2026-12-06)."""
    fused_gated_norm: bool = True
    """FLA FusedRMSNormGated for the KDA/GDN gated output norm."""
    fused_swiglu: bool = True
    """A Triton SwiGLU in the MLP (which one: swiglu_kernel)."""
    swiglu_kernel: Literal["fla", "packed"] = "packed"
    """The fused SwiGLU's kernel: fla = FLA's on the gate and up halves of the MLP's first
    projection (its backward returns two gradients, which autograd then concatenates: one more
    pass over the [tokens x 2 ffn] gradient); packed = zebractl's on the packed [gate | up]
    projection (FLA's arithmetic, bitwise equal to it on the GPU; the gradient written in one
    piece)."""
    fused_short_conv: bool = True
    """FLA Triton causal_conv1d for the short convolutions."""
    fused_linear_cross_entropy: bool = True
    """Chunked LM head + loss that never materialises the [tokens x vocab] logits: bf16
    tensor-core products with the weight gradient accumulated in fp32 (zebractl's; FLA's Triton
    cross-entropy kernels on the fla backend). false: full logits in fp32 (memory-hungry)."""
    cross_entropy: Literal["fla", "one_pass"] = "fla"
    """The fused LM-head loss's softmax kernel on the fla backend: fla = FLA's two kernels (a
    forward reading each chunk of logits for the log-sum-exp, a backward reading them again and
    writing the gradient over them: 18.5 ms of kda_300M's 288 ms step at micro-batch 32 on an H100,
    benchmarks/README.md, 2026-12-06); one_pass = zebractl's, one kernel per chunk whose programs
    each sweep a row twice, the second meant to find it in the L2 cache (fp32 arithmetic, the
    log-sum-exp never rounded as one number, the gradient rounded once; 1.047x FLA's pair on one
    chunk on an H100, the second sweep mostly missing L2). In kda_300M's training step at
    micro-batch 32 it measured 0.997x the default (H100, 2026-12-06, edcc58e): opt-in. The torch
    backend: no effect."""
    fused_ce_chunks: int = Field(32, gt=0, le=4096)
    """Token chunks of the fused LM-head loss (more chunks: less memory, more GEMM launches)."""
    kda_gate_in_kernel: bool = True
    """Compute the KDA decay gate inside chunk_kda (recomputed in backward)."""
    gdn_gate_in_kernel: bool = True
    """Compute the GDN decay gate inside chunk_gated_delta_rule."""
    qk_l2norm_in_kernel: bool = True
    """L2-normalise q and k inside the delta-rule kernels."""
    fp8_mlp: Literal["off", "tensorwise", "rowwise"] = "off"
    """Opt-in FP8 GEMMs for the SwiGLU MLPs (torchao float8 training, dynamic scaling, the MLP
    compiled with torch.compile): tensorwise = one scale per tensor (fastest), rowwise = one per row
    (more accurate). Megatron engine, bf16, CUDA compute capability 8.9+ (Ada/Hopper) only."""
    ssd_precision: Literal["fp32", "mixed"] = "mixed"
    """Mamba2's SSD scan on FLA's chunked simple-GLA kernels: mixed = the operands in the compute
    dtype, FLA's forward as it is and its backward with the states' gradients in fp32 and one bf16
    copy of them for the q/k gradients (zebractl.model.ops.mixed_ssd, GPU-tested against fp64);
    fp32 = the operands cast to fp32 (FLA's chunk_simple_gla with fp32 backward states; every operand
    and gradient passes through a cast). Other mixers, the torch backend and fp32 runs: no effect.
    With compile auto, zebra_mamba_300M_hybrid trained 1.38x faster than with fp32 and none (H100,
    micro-batch 16, 200 iterations; the loss curves within the parity tolerance: last-half mean
    |Δ%| 0.32; benchmarks/README.md, 2026-12-06)."""
    compile: Literal["auto", "none", "glue"] = "auto"
    """glue: torch.compile (Inductor, fixed shapes, whole graph) of the pure-PyTorch code between the
    kernels, each region fused into a few generated kernels: in the Mamba2 mixer, the decay and
    input-gate preparation (softplus, group expansion, dt scaling) and the skip, gate and grouped
    RMSNorm after the scan. Compiled on the first step (counted in the cold start); training only
    (evaluation and generation run eagerly). auto: glue with FLA's kernels (CUDA), none elsewhere
    (the CPU's pure-PyTorch path is not worth a compile). none: eager PyTorch."""
    cuda_graph: bool = False
    """Capture one micro-batch's forward and backward as a CUDA graph after two eager micro-steps
    and replay it (the optimizer step stays eager): removes the host's launch overhead, a sixth of
    a 300M step at micro-batch 16 on an H200. The autocast weight-cast cache is off in the graph;
    gradients become static buffers. A failed capture warns and trains on eagerly. CUDA, the
    torch_fused engine and one GPU only (refused otherwise)."""
    precompile: bool = True
    """Compile the recurrent mixers' and the loss's GPU kernels in a background thread while the
    run reads its data and builds its model (one forward + backward on throwaway weights, the
    run's random state untouched): a shorter first step on a cold kernel cache. Only on CUDA with
    FLA kernels; false: the first step compiles them."""
    precompile_tilelang: Literal["thread", "process"] = "thread"
    """With precompile on, where KDA's TileLang backward kernel (FLA's, tens of seconds of nvcc on
    a cold cache) is compiled: thread (beside the Triton kernels, once setup has imported FLA) or
    process (a Python process of its own started at launch, before the run imports torch,
    megatron-core and FLA: its imports and nvcc overlap the run's; TileLang's disk cache hands the
    kernel over). Nothing changes on a warm cache or in what is trained. process measured no
    better than thread on an H200 (426c5e6) nor with precompile_processes on an H100 (e87a0dd;
    benchmarks/README.md, cold start)."""
    precompile_processes: int = Field(0, ge=0, le=64)
    """With precompile on: N > 0 = N Python processes started at launch compile the step's Triton
    kernels (each every N-th kernel call of the background step, without launching;
    zebractl.train.compile_procs) while the run imports and sets up; the background compilation
    waits for them, then finds the kernels in the kernel cache. Each holds a CUDA context and the
    step's activations on the run's GPU until it exits, before the first step. Under torchrun N
    is the node's: each of its ranks starts its share (at least one). 0 = the run's background
    thread compiles them. Best with ``precompile_tilelang: process`` (TileLang's kernel is not
    theirs). Opt-in: on an H100 (2026-12-06, e87a0dd) 4 processes started at launch were done
    83.1 and 76.5 s after it, later than one thread started at setup (77.2 and 68.6 s in the runs
    beside them; each process imported torch, megatron-core and FLA first, beside the run's own
    imports; megatron-core no longer since), kda_300M's cold start 91.1 s against 79.2 s with
    FLA imported whole, 85.1 s against 70.9 s with the lean import."""
    precompile_tilelang_overlap: bool = False
    """With precompile on and KDA's TileLang backward built beside it (either place above): true =
    the background step runs KDA's backward at once, with stand-ins for that kernel's outputs
    (zebractl.train.tilelang_build.stand_in), so the backward's Triton kernels compile while nvcc
    builds the TileLang one; false = it waits for the TileLang kernel, then compiles them. The
    background step's outputs are thrown away either way: nothing trained changes. Opt-in: on an
    H200 (2026-12-06, 426c5e6) kda_300M's background compilation took 35.9 and 37.5 s with it
    against 30.0-31.9 s without (both compile on threads of one process: the Triton front end and
    TileLang's lowering contend for the interpreter), its cold start 51.0 and 58.1 s against 47.3
    and 50.1 s."""
    lazy_framework_compile: bool = False
    """megatron-core and FLA wrap functions in torch.compile as they are imported (megatron's
    jit_fuser, FLA's @torch.compile), which imports TorchDynamo and TorchInductor at each run's
    start-up, for functions zebractl mostly never calls. true: the training run imports them
    with those wrappers made on each function's first call instead (the same compiled function,
    made later; zebractl.runtime.lazy_compile; 4.1 s instead of 5.2 s for both imports on a 2-core
    CPU). false: made at import, as the libraries do. Opt-in: on an H200 (2026-12-06, 426c5e6) it
    cut the imports before setup by ~1 s (megatron-core 5.0/3.3 s against 8.2/7.2 s, FLA 10.7/6.9
    against 8.1/5.4 s) and setup's first line came ~3 s sooner, but TorchInductor's import and
    compiles then fell into the background compilation, which took ~5 s longer: no shorter cold
    start (57.1 s against 54.6 s, both with the overlap above)."""
    lean_fla_import: bool = True
    """true: a run on FLA's kernels (and its compile processes and TileLang build) imports the
    FLA modules its step uses without running the package files of ``fla``, ``fla.ops`` and
    ``fla.modules``, which import every FLA layer, model and operator and transformers
    (zebractl.runtime.fla_import; 2.2-2.6 s instead of 4.7-5.0 s on a 2-core CPU, 91 of FLA's
    modules instead of 476). A package is made whole the first time code asks it for a name it
    lacks. The kernels are the same. false: FLA imported as a whole. On an H100 (2026-12-06,
    e87a0dd) FLA's import before setup took 1.96 s against 12.65 s, kda_300M's setup began 5.5 and
    8.6 s sooner and its cold start was 70.9 and 79.8 s against 79.2 and 86.1 s
    (benchmarks/README.md); the GPU tests and the parity smoke passed with it."""
    precompile_workers: int = Field(0, ge=0, le=256)
    """With precompile on: 0 = the background step launches its kernels, each compiling on its
    first launch, one after the other; N = it compiles them without launching, N Triton compiles
    at once in threads
    (zebractl.train.compile_only; autotuned kernels without a tuned configuration are left to the
    first step). Opt-in: on an H100 (2026-12-06, edcc58e) 16 workers did not shorten kda_300M's
    background compilation (26.8 s against 26.2 s; KDA's TileLang kernel, which it leaves alone,
    took 21 s to compile on that machine) and the first step then compiled what they had left out
    (cold start 44.4 s against 41.6 s). Falls back to 0 where the installed Triton lacks what it relies on (Triton
    3.6's internals)."""


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
