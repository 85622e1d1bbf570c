"""``zebractl compare --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import FiniteFloat, JsonValue

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report

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
    """Resolved keys changed since the previous training session (output paths included)."""


class CompareConfigChange(StrictModel):
    """A resolved-config value that changed within one run, at a resume."""

    side: Literal["a", "b"]
    """The run."""
    iteration: int | None
    """The iteration of the session that changed it: the steps from here on trained with ``after``
    (null: unknown)."""
    run_id: str | None
    """That training session."""
    key: str
    """Dotted key."""
    before: JsonValue
    """The value of the previous training session."""
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
    model: str | None
    """Its model: the preset (``with changes`` when its recipe changed it) and the layout in a few
    words, ``tiny_kda (2 blocks: kda, kda; hidden 64)`` (null: its record holds no valid model)."""
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


class CompareModelDifference(StrictModel):
    """A field where the runs' models differ (the models as built: the mixer of each block, the
    resolved head sizes; a mixer's settings only where both models have blocks of it)."""

    key: str
    """A model key (``hidden_size``, ``kda.num_v_heads``; ``embedding rows``: the padded
    vocabulary), ``blocks`` (the block count and mixers) or ``block N mixer`` / ``blocks N-M
    mixer``."""
    a: JsonValue
    """Run A's value (null: unset)."""
    b: JsonValue
    """Run B's value."""
    kind: Literal["layout", "weights", "vocabulary", "positions", "training"]
    """layout and weights: the weights do not fit or compute another function; vocabulary: the
    token count in the same padded rows; positions: computed, not learned; training:
    initialisation and dropout."""


class CompareVerdict(StrictModel):
    """What the comparison concludes, or why it concludes nothing."""

    result: Literal["PASS", "FAIL", "NOTHING TO CHECK"] | None
    """PASS: every check within its tolerance; FAIL: one outside; NOTHING TO CHECK: no check had a
    value; null: no parity verdict applies (``reason`` says why: runs of different models, a
    fine-tune and its initial run)."""
    reason: str
    """The bounds checked (``value <= tolerance`` each), or why there is no verdict."""


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

    kind: Literal["parity", "finetune", "models_differ"]
    """parity: two runs of one model on the same data and batch (loss, throughput, eval deltas,
    checks); finetune: one run's init_from is the other (:attr:`finetune`): the loss-parity fields
    are empty or null and no check applies; models_differ: runs of different models
    (:attr:`model_differences`): the same curves and numbers as a plain comparison, no check and
    no verdict."""
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
    model_differences: list[CompareModelDifference]
    """Where the runs' models differ, the layout first (empty: one model)."""
    config_changes: list[CompareConfigChange]
    """Every resolved value that changed within a run, at a resume (``config.history.jsonl``;
    output paths excluded): the run did not train under one config throughout."""
    forced: bool
    """Compared despite a must-match difference (--force; never for a fine-tune pair, whose data
    differ by design)."""
    finetune: CompareFinetune | None
    """The before/after report (kind finetune), else null."""
    checks: list[CompareCheck]
    """The tolerances (with --assert they decide the exit code); empty for a fine-tune pair and
    for runs of different models."""
    passed: bool | None
    """Every check ok; null where no parity verdict applies (a fine-tune pair, runs of different
    models)."""
    verdict: CompareVerdict
    """The verdict, or why there is none."""
    files: list[str]
    """The report files written (Markdown, JSON, PNG plots)."""
