"""What a recipe will do before it runs: parameters, pattern, FLOPs, tokens, memory, batch layout.

Parameter counts are exact (from :mod:`zebractl.layout`). The memory figure is an estimate: model and
optimizer state are exact byte counts; activations count the tensors autograd keeps per token with the
fused kernels on (for KDA and GDN plus what FLA's kernels keep, fitted to peak memory measured on an
H200, :data:`FLA_SAVED_PER_VALUE_DIM`), and the LM-head loss adds its input gradient, fp32 weight
gradient and one chunk of logits. :func:`fit` finds the largest micro-batch whose estimate fits a
GPU's memory (`zebractl plan --fit`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from zebractl.layout import MIXER_SPECS, SUBLAYER_SHAPES, model_shapes, numel
from zebractl.planning.flops import flops_per_token
from zebractl.planning.throughput import time_to_train
from zebractl.schemas.preset import ModelConfig, max_sequence_length
from zebractl.schemas.recipe import Derived, RunConfig, derive
from zebractl.schemas.reports import PlanReport

GIB = 1024**3

FLA_SAVED_PER_VALUE_DIM = {"kda": 9.81, "gdn": 8.32, "mamba2": 13.37}
"""Activation elements per token that a KDA / GDN / Mamba2 sublayer keeps beyond
:func:`_activation_elems_per_token`'s analytic count, per unit of the mixer's value_dim (Mamba2:
d_inner): what FLA's chunked kernels save for backward (fp32 gate cumsums, intra-chunk matrices)
and, for Mamba2, its B and C broadcast from groups to heads in bf16 and fp32 for the SSD kernel.
KDA / GDN: fitted to the peak memory of kda_300M and gdn_300M on one H200 at micro-batches 16, 64
and 96 (benchmarks/results/2026-12-01_h200_issue12, seq 2048; the torch_fused engine, before the
fused residual add: see :data:`RESIDUAL_KEPT_PER_HIDDEN`). Mamba2: the deficit of the analytic
count in zebra_mamba_1B_hybrid (seq 2048, micro 24: 13.48) and zebra_mamba_3B_hybrid (seq 8192,
micro 2: 13.27) on one H200, the megatron engine (GPU check 2026-12-02-454ff45.memory*.json).
MLA is counted analytically (the KDA and GDN 1B hybrids' peaks measured within 8% with it), as
is a recurrent mixer not measured here (no entry). Mamba2's entry is its scan in fp32 with eager
glue (``kernels.ssd_precision: fp32`` or ``kernels.compile: none``); the defaults keep less:
:data:`MAMBA2_FAST_SAVED_PER_VALUE_DIM`."""
MAMBA2_FAST_SAVED_PER_VALUE_DIM = 3.53
"""Mamba2's fitted extra with its defaults (``kernels.ssd_precision: mixed``, the scan's operands
in bf16, and ``kernels.compile`` on: the glue compiled, its intermediates not kept): the 11.3 GiB
by which zebra_mamba_300M_hybrid's peak fell with both at micro-batch 16 (41.51 -> 30.19 GiB, seq
2048, benchmarks/step_bench.py on one H100, 2026-12-06, d67324c:
benchmarks/results/2026-12-06_h100_d67324c_parity_hybrid/bench_hybrid.json), over its 9 Mamba2
sublayers' d_inner of 2048."""
RESIDUAL_KEPT_PER_HIDDEN = 1.32
"""Elements per token and unit of hidden size that each sublayer keeps for its pre-norm and
residual (the analytic count is 2: the norm's input and output). With the residual add fused into
the next RMSNorm (FLA's kernel) the measured peaks are lower: fitted to kda_300M / gdn_300M on one
H200 at micro 16 and 64 (benchmarks/results/2026-12-01_h200_issue12b, the first run of each
process; slope 1.113 / 1.096 GiB per sample against the analytic 1.177 / 1.160)."""
FIT_HEADROOM = 0.08
"""Share of a GPU's memory `plan --fit` leaves free: the caching allocator's fragmentation
(reserved / allocated was 1.03-1.05 in the measurements above) and the CUDA context."""


def parameter_report(m: ModelConfig) -> dict[str, Any]:
    """Exact parameter counts: total, embedding, output layer, final norm, per sublayer type."""
    shapes = model_shapes(m)
    counts = Counter(m.sublayers)
    by_type = {
        kind: {
            "count": n,
            "each": numel(SUBLAYER_SHAPES[kind](m)),
            "total": n * numel(SUBLAYER_SHAPES[kind](m)),
        }
        for kind, n in counts.items()
    }
    embedding = m.padded_vocab_size * m.hidden_size
    total = numel(shapes)
    return {
        "total": total,
        "embedding": embedding,
        "output_layer": 0 if m.tie_embeddings else embedding,
        "final_norm": numel(
            {k: v for k, v in shapes.items() if k.startswith("decoder.final_norm")}
        ),
        "non_embedding": total - embedding - (0 if m.tie_embeddings else embedding),
        "by_sublayer": by_type,
        "tensors": len(shapes),
    }


def _saved_per_value_dim(cfg: RunConfig) -> dict[str, float]:
    """:data:`FLA_SAVED_PER_VALUE_DIM` for this run's kernel settings: Mamba2's scan keeps less
    with its defaults (mixed precision and the glue compiled) on FLA's kernels."""
    k = cfg.kernels
    fast = (
        k.backend != "torch"
        and cfg.precision != "fp32"
        and k.ssd_precision == "mixed"
        and k.compile != "none"
    )
    return (
        {**FLA_SAVED_PER_VALUE_DIM, "mamba2": MAMBA2_FAST_SAVED_PER_VALUE_DIM}
        if fast
        else FLA_SAVED_PER_VALUE_DIM
    )


def _activation_elems_per_token(m: ModelConfig, kind: str, saved: dict[str, float]) -> int:
    """Elements autograd keeps per token for one sublayer (fused kernels; an estimate); ``saved``:
    :func:`_saved_per_value_dim`."""
    h = m.hidden_size
    r = round(RESIDUAL_KEPT_PER_HIDDEN * h)  # the pre-norm's input and output, fused add
    if kind == "mlp":
        return r + 3 * m.ffn_hidden_size  # normed input, fc1 out (2F), act out (F)
    if kind in MIXER_SPECS:  # the mixer's analytic count, and what its kernels keep (fitted)
        analytic, width = MIXER_SPECS[kind].activations(m)
        return r + analytic + round(saved.get(kind, 0.0) * width)
    assert m.mla is not None
    a = m.mla
    q = a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
    lora = 2 * (a.q_lora_rank or 0) + 2 * a.kv_lora_rank + a.qk_pos_emb_head_dim
    return r + lora + 2 * q + a.num_heads * (a.qk_head_dim + 2 * a.v_head_dim)


def _gemm_outputs_per_token(m: ModelConfig, kind: str) -> int:
    """Elements per token the matrix multiplications of one sublayer output: the rows of its 2-D
    weights (what ``recompute.mode selective`` keeps of it)."""
    return sum(shape[0] for shape in SUBLAYER_SHAPES[kind](m).values() if len(shape) == 2)


def kept_elems_per_token(cfg: RunConfig) -> int:
    """Activation elements per token the decoder keeps at the start of the backward pass, with
    the one sublayer (selective) or block (full) being recomputed at a time on top: the peak under
    ``cfg.recompute``. A checkpointed region keeps its inputs (the previous output and the residual
    stream, 2 x hidden) and, selective, its GEMMs' outputs; the final norm keeps 2 x hidden."""
    m, rc = cfg.model, cfg.recompute
    h, subs = m.hidden_size, list(m.sublayers)
    saved = _saved_per_value_dim(cfg)
    each = [_activation_elems_per_token(m, k, saved) for k in subs]
    final = 2 * h
    if rc.mode == "none":
        return sum(each) + final
    if rc.mode == "selective":
        kept = [2 * h + _gemm_outputs_per_token(m, k) for k in subs]
        return sum(kept) + max(e - k for e, k in zip(each, kept, strict=True)) + final
    n = rc.blocks or m.num_blocks
    blocks = [each[2 * b] + each[2 * b + 1] for b in range(m.num_blocks)]
    return sum(blocks[n:]) + n * 2 * h + max(blocks[:n]) + final


def recompute_label(cfg: RunConfig) -> str:
    """``none``, ``selective`` or ``full (N of B blocks)``."""
    rc = cfg.recompute
    if rc.mode != "full":
        return rc.mode
    return f"full ({rc.blocks or cfg.model.num_blocks} of {cfg.model.num_blocks} blocks)"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU: fixed state, and activations (incl. the LM head's) per micro-batch sample."""

    scheme: str
    weights_and_grads: float
    optimizer: float
    activations_per_sample: float
    lm_head_fixed: float  # the fp32 weight-gradient accumulator (fused loss)
    lm_head_per_sample: float  # input gradient and the logits chunk per sample

    def activations(self, micro: int) -> float:
        """Activation bytes of a micro-batch (the LM head's excluded)."""
        return micro * self.activations_per_sample

    def lm_head(self, micro: int) -> float:
        """The LM-head loss's own bytes at a micro-batch."""
        return self.lm_head_fixed + micro * self.lm_head_per_sample

    def total(self, micro: int) -> float:
        """Peak bytes at a micro-batch (all activations alive when backward starts)."""
        return (
            self.weights_and_grads + self.optimizer + self.activations(micro) + self.lm_head(micro)
        )


def _bytes_per_param(cfg: RunConfig) -> tuple[int, int, int, str]:
    """(weights, gradients, optimizer state) bytes per parameter, and the scheme in words."""
    if cfg.optimizer.impl == "torch_fused" or cfg.precision not in ("bf16", "fp16"):
        return 4, 4, 8, "fp32 params + fp32 grads + Adam m, v (fp32)"
    return 2, 4, 12, "bf16 params + fp32 grads + fp32 main params, Adam m, v"


def memory_estimate(cfg: RunConfig, total_params: int, d: Derived) -> MemoryEstimate:
    """The per-GPU memory model of a resolved recipe (see the module docstring)."""
    p, m = cfg.parallelism, cfg.model
    params_per_gpu = total_params / (p.tp * p.pp)
    mixed = cfg.precision in ("bf16", "fp16")
    weights_b, grads_b, state_b, scheme = _bytes_per_param(cfg)
    state_shard = d.data_parallel if p.distributed_optimizer else 1
    act_dtype = 2 if mixed else 4
    tokens = cfg.data.seq_length / (p.tp * p.cp)  # per sample
    per_token = kept_elems_per_token(cfg)  # the final norm's in/out included
    v, h = m.padded_vocab_size, m.hidden_size
    if cfg.kernels.fused_linear_cross_entropy:
        # dx (the input gradient, kept from forward to backward), one chunk of logits (the chunk
        # is 1/fused_ce_chunks of the micro-batch's tokens), the fp32 dW accumulator
        lm_fixed = 4.0 * v * h
        lm_per_sample = tokens * (h * act_dtype + v * act_dtype / cfg.kernels.fused_ce_chunks)
    else:
        lm_fixed, lm_per_sample = 0.0, tokens * v * (act_dtype + 4)  # logits + fp32 softmax
    # documents kept apart: MLA's block-diagonal bias, one [T, T] per sample shared by its layers,
    # unless flash's variable-length kernel serves (bf16/fp16 without attention dropout)
    biased = cfg.data.isolated and "mla" in m.sublayers
    bias = (
        tokens * tokens * act_dtype if biased and not (mixed and m.dropout.attention == 0) else 0.0
    )
    # With 1F1B the first pipeline stage holds pp micro-batches of 1/pp of the layers: about the
    # activations of the whole model for one micro-batch, whatever pp is.
    return MemoryEstimate(
        scheme=scheme,
        weights_and_grads=params_per_gpu * (weights_b + grads_b),
        optimizer=params_per_gpu * state_b / state_shard,
        activations_per_sample=tokens * per_token * act_dtype + bias,
        lm_head_fixed=lm_fixed,
        lm_head_per_sample=lm_per_sample,
    )


def checkpoint_bytes(cfg: RunConfig, total_params: int) -> float:
    """About the bytes of one checkpoint of a run (every rank's share together): the weights in
    their training dtype and the optimizer state (Adam's fp32 m and v, plus the fp32 main copy of
    bf16 weights under the megatron engine), as :func:`memory_estimate` counts them per GPU."""
    weights_b, _, state_b, _ = _bytes_per_param(cfg)
    return float(total_params * (weights_b + state_b))


def _gib(x: float) -> float:
    return round(x / GIB, 2)


def memory_report(cfg: RunConfig, total_params: int, d: Derived) -> dict[str, Any]:
    """Per-GPU memory estimate in bytes and GiB at the recipe's micro-batch."""
    e = memory_estimate(cfg, total_params, d)
    micro = cfg.batch.micro
    return {
        "scheme": e.scheme,
        "params_and_grads_gib": _gib(e.weights_and_grads),
        "optimizer_gib": _gib(e.optimizer),
        "activations_gib": _gib(e.activations(micro)),
        "lm_head_gib": _gib(e.lm_head(micro)),
        "total_gib": _gib(e.total(micro)),
        "recompute": recompute_label(cfg),
        "note": "estimate: exact state bytes + activations kept by autograd (KDA/GDN/Mamba2 "
        "calibrated on an H200, selective recomputation measured once, full modelled) + the "
        "LM-head loss's buffers; excludes allocator slack and the CUDA context",
    }


def fit(cfg: RunConfig, total_params: int, capacity_gib: float) -> dict[str, Any]:
    """The largest micro-batch whose estimated peak fits ``capacity_gib`` less
    :data:`FIT_HEADROOM`, and the largest that also divides the global batch per data-parallel
    rank (what the recipe can use as it is)."""

    d = derive(cfg)
    e = memory_estimate(cfg, total_params, d)
    usable = capacity_gib * GIB * (1 - FIT_HEADROOM)
    per = e.activations_per_sample + e.lm_head_per_sample
    fixed = e.total(0)
    best = _largest_micro(e, usable)
    per_rank = cfg.batch.global_ // max(1, d.data_parallel)
    dividing = max((mb for mb in range(1, best + 1) if per_rank % mb == 0), default=0)
    return {
        "capacity_gib": round(capacity_gib, 2),
        "usable_gib": _gib(usable),
        "headroom": FIT_HEADROOM,
        "micro": best,
        "estimate_gib": _gib(e.total(best)) if best else None,
        "micro_dividing_global": dividing,
        "estimate_dividing_gib": _gib(e.total(dividing)) if dividing else None,
        "fixed_gib": _gib(fixed),
        "per_sample_gib": round(per / GIB, 4),
        "by_recompute": _fit_by_recompute(cfg, total_params, usable),
    }


def _fit_by_recompute(cfg: RunConfig, total_params: int, usable: float) -> dict[str, int]:
    """The largest fitting micro-batch under each recompute mode (full: every block), so that a
    recipe that does not fit as it is shows what would."""
    d = derive(cfg)
    out = {}
    for mode in ("none", "selective", "full"):
        rc = cfg.recompute.model_copy(update={"mode": mode, "blocks": None})
        e = memory_estimate(cfg.model_copy(update={"recompute": rc}), total_params, d)
        out[mode] = _largest_micro(e, usable)
    return out


def _largest_micro(e: MemoryEstimate, usable: float) -> int:
    """The largest micro-batch whose estimate fits ``usable`` bytes (0: none)."""
    from zebractl.schemas import bounds

    per, fixed = e.activations_per_sample + e.lm_head_per_sample, e.total(0)
    best = max(0, min(int((usable - fixed) // per), bounds.MICRO)) if usable > fixed else 0
    while best > 0 and e.total(best) > usable:  # guard the float division
        best -= 1
    return best


@dataclass(frozen=True)
class Plan:
    """The plan of one resolved recipe (with ``fit_gib``: also :func:`fit` for that capacity)."""

    recipe: str
    cfg: RunConfig
    fit_gib: float | None = None
    built: int | None = None
    """The parameters of the model actually built (``parameters.built``; ``plan --build`` counts
    them with :func:`zebractl.model.model.built_parameter_count`: planning never builds one)."""

    def report(self) -> PlanReport:
        """The typed document of `zebractl plan --json` (:meth:`to_dict`, validated)."""
        return PlanReport.model_validate(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data: the fields of :class:`PlanReport` without ``schema_version``."""
        cfg, m = self.cfg, self.cfg.model
        d = derive(cfg)
        params = parameter_report(m)
        params["built"] = self.built
        fl = flops_per_token(m, cfg.data.seq_length)
        limit, why = max_sequence_length(m)
        return {
            "recipe": self.recipe,
            "preset": cfg.preset,
            "description": cfg.description,
            "preset_description": m.description,
            "sequence": {"length": cfg.data.seq_length, "max": limit, "limited_by": why},
            "parameters": params,
            "pattern": {
                "blocks": m.blocks,
                "sublayers": d.sublayers,
                "counts": dict(Counter(d.sublayers)),
            },
            "flops": {
                "per_token_forward": fl.forward,
                "per_token_training": fl.training,
                "per_step_training": fl.training * d.tokens_per_step,
                "total_training": fl.training * d.total_tokens,
                "six_n_per_token": 6 * params["non_embedding"]
                + 6 * m.padded_vocab_size * m.hidden_size,
                "forward_breakdown": {
                    "linear": fl.linear,
                    "conv": fl.conv,
                    "recurrent": fl.recurrent,
                    "attention": fl.attention,
                    "lm_head": fl.lm_head,
                },
                "seq_length": cfg.data.seq_length,
            },
            "tokens": {
                "per_step": d.tokens_per_step,
                "iterations": d.iterations,
                "total": d.total_tokens,
            },
            "batch": {
                "micro": cfg.batch.micro,
                "data_parallel": d.data_parallel,
                "grad_accumulation": d.grad_accumulation,
                "global": cfg.batch.global_,
                "num_gpus": cfg.parallelism.num_gpus,
                "tp": cfg.parallelism.tp,
                "pp": cfg.parallelism.pp,
                "cp": cfg.parallelism.cp,
            },
            "memory_per_gpu": memory_report(cfg, params["total"], d),
            "fit": fit(cfg, params["total"], self.fit_gib) if self.fit_gib is not None else None,
            "time_to_train": time_to_train(
                cfg.preset, cfg.parallelism.num_gpus, fl.training, d.total_tokens
            ),
        }
