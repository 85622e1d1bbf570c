"""``zebractl plan --json``: parameters, pattern, FLOPs, tokens, batch, memory, fit, time."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat

from zebractl.schemas.base import StrictModel
from zebractl.schemas.preset import Mixer, Sublayer
from zebractl.schemas.reports.base import Report

# ---- zebractl plan ---------------------------------------------------------------------------------


class SublayerParameters(StrictModel):
    """Parameters of one sublayer type."""

    count: int
    """How many sublayers of this type the model has."""
    each: int
    """Parameters of one such sublayer."""
    total: int
    """count * each."""


class PlanParameters(StrictModel):
    """Exact parameter counts (from the tensor layout, not a formula)."""

    total: int
    """All parameters of the model."""
    embedding: int
    """Input embedding: padded vocabulary * hidden size."""
    output_layer: int
    """Untied output layer (LM head); 0 when tied to the embedding."""
    final_norm: int
    """The final norm before the output layer."""
    non_embedding: int
    """total - embedding - output_layer."""
    by_sublayer: dict[Sublayer, SublayerParameters]
    """Per sublayer type (mixers and mlp): count, parameters each, total."""
    tensors: int
    """Number of parameter tensors."""
    built: int | None = None
    """Parameters of the model built on the meta device (``plan --build``); null without
    ``--build`` (planning does not build the model: ``total`` comes from zebractl.layout) or
    without the runtime installed."""


class PlanPattern(StrictModel):
    """The resolved layer pattern."""

    blocks: list[Mixer]
    """Mixer of each block, in order."""
    sublayers: list[Sublayer]
    """Every sublayer in order (each block's mixer, then its mlp where it has one)."""
    counts: dict[Sublayer, int]
    """How many sublayers of each type."""


class ForwardFlops(StrictModel):
    """Forward FLOPs per token by component (one multiply-add = 2 FLOPs)."""

    linear: int
    """Matmuls of every weight matrix except the LM head."""
    conv: int
    """Depthwise short convolutions."""
    recurrent: int
    """Chunked recurrent terms (KDA/GDN delta rule, Mamba2 SSD)."""
    attention: int
    """Causal softmax attention (MLA) at the plan's sequence length."""
    lm_head: int
    """The output layer (counted whether tied or not)."""


class PlanFlops(StrictModel):
    """FLOPs per token, per step and for the whole run."""

    per_token_forward: int
    """Forward FLOPs per token."""
    per_token_training: int
    """Forward + backward FLOPs per token (3x forward)."""
    per_step_training: int
    """Training FLOPs of one optimizer step (all GPUs)."""
    total_training: int
    """Training FLOPs of the whole run."""
    six_n_per_token: int
    """The 6N rule of thumb for comparison: 6 * (non-embedding + LM head parameters)."""
    forward_breakdown: ForwardFlops
    """per_token_forward by component."""
    seq_length: int
    """Sequence length the attention term is counted at."""


class PlanTokens(StrictModel):
    """Tokens of the run."""

    per_step: int
    """Global batch * sequence length."""
    iterations: int
    """Optimizer steps."""
    total: int
    """per_step * iterations."""


class PlanTimeToTrain(StrictModel):
    """Wall time of the run estimated from a measured throughput of the same preset
    (zebractl.planning.throughput); all null but ``note`` when none was measured."""

    hours: float | None
    """Estimated hours for all the run's tokens (null: no measurement of this preset)."""
    tokens_per_s: float | None
    """Estimated tokens/s of the whole run: measured MFU x the GPU's bf16 peak x GPUs / training
    FLOPs per token."""
    gpu: str | None
    """The GPU the measurement (and so the estimate) is for."""
    mfu: float | None
    """Model FLOP utilisation measured (plan FLOPs basis), 0-1."""
    measured: str | None
    """What was measured: run, tokens/s, MFU, micro-batch, sequence length."""
    source: str | None
    """Where the measurement is recorded."""
    note: str
    """The estimate's assumption, or why there is none."""


class PlanBatch(StrictModel):
    """Batch and parallel layout."""

    micro: int
    """Sequences per GPU per forward/backward."""
    data_parallel: int
    """Data-parallel replicas: num_gpus / (tp * pp * cp)."""
    grad_accumulation: int
    """Micro-batches accumulated per step: global / (micro * data_parallel)."""
    global_: int = Field(alias="global")
    """Sequences per optimizer step."""
    num_gpus: int
    """GPUs of the planned run."""
    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    cp: int
    """Context-parallel size."""


class PlanMemory(StrictModel):
    """Per-GPU memory estimate."""

    scheme: str
    """Which bytes per parameter are counted (weights, gradients, optimizer state)."""
    params_and_grads_gib: FiniteFloat
    """Weights and gradients, GiB (exact)."""
    optimizer_gib: FiniteFloat
    """Optimizer state, GiB (exact; sharded with the distributed optimizer)."""
    activations_gib: FiniteFloat
    """Activations kept by autograd for one micro-batch, GiB (an estimate)."""
    lm_head_gib: FiniteFloat
    """The LM-head loss's buffers at that micro-batch: input gradient, one logits chunk and the
    fp32 weight-gradient accumulator (fused loss), or the full fp32 logits, GiB."""
    total_gib: FiniteFloat
    """Sum of the four, GiB: the estimated peak."""
    recompute: str
    """The activation recomputation the activations are estimated with: none, selective, or
    full (N of B blocks)."""
    note: str
    """What the estimate leaves out."""


class PlanFit(StrictModel):
    """``plan --fit``: the largest micro-batch whose memory estimate fits the GPU."""

    capacity_gib: FiniteFloat
    """The GPU memory fitted into (--gpu-memory, or the GPU's own total)."""
    usable_gib: FiniteFloat
    """capacity less the headroom left for allocator fragmentation and the CUDA context."""
    headroom: FiniteFloat
    """The share left free."""
    micro: int
    """Largest micro-batch whose estimate fits (0: not even one sample)."""
    estimate_gib: FiniteFloat | None
    """Its estimated peak, GiB."""
    micro_dividing_global: int
    """Largest fitting micro-batch that divides the global batch per data-parallel rank (usable
    with the recipe's batch.global as it is; 0 if none)."""
    estimate_dividing_gib: FiniteFloat | None
    """Its estimated peak, GiB."""
    fixed_gib: FiniteFloat
    """What does not grow with the micro-batch (weights, gradients, optimizer state, LM-head
    weight-gradient accumulator), GiB."""
    per_sample_gib: FiniteFloat
    """Added per sample of the micro-batch, GiB."""
    by_recompute: dict[Literal["none", "selective", "full"], int]
    """The largest fitting micro-batch under each recompute.mode (full: every block)."""


class PlanSequence(StrictModel):
    """Training sequence length against the longest the model supports."""

    length: int
    """data.seq_length."""
    max: int
    """Longest sequence the model accepts."""
    limited_by: str
    """What sets the maximum (max_position_embeddings, or MLA YaRN scaling)."""


class PlanReport(Report):
    """``zebractl plan RECIPE --json``: parameters, pattern, FLOPs, tokens, batch, memory."""

    command: ClassVar[str] = "plan"

    recipe: str
    """The recipe as named on the command line (shipped name or path)."""
    preset: str
    """The preset the recipe's model starts from."""
    description: str
    """The recipe's one-line summary."""
    preset_description: str
    """The architecture's one-line summary."""
    sequence: PlanSequence
    """Sequence length and the model's limit."""
    parameters: PlanParameters
    """Exact parameter counts."""
    pattern: PlanPattern
    """Resolved layer pattern."""
    flops: PlanFlops
    """FLOPs per token, per step and in total."""
    tokens: PlanTokens
    """Tokens per step and in total."""
    batch: PlanBatch
    """Batch and parallel layout."""
    memory_per_gpu: PlanMemory
    """Per-GPU memory estimate."""
    fit: PlanFit | None = None
    """--fit: the largest micro-batch that fits (null without --fit)."""
    time_to_train: PlanTimeToTrain
    """Wall time estimated from a measured throughput of the same preset, with its source."""
