"""What a recipe will do before it runs: parameters, pattern, FLOPs, tokens, memory, batch layout.

Parameter counts are exact (from :mod:`zebractl.layout`). The memory figure is an estimate: model and
optimizer state are exact byte counts; activations count the tensors autograd keeps per token with the
fused kernels on, and ignore allocator slack, temporary buffers and kernel workspaces.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from zebractl.layout import SUBLAYER_SHAPES, model_shapes, numel
from zebractl.planning.flops import flops_per_token
from zebractl.schemas.preset import ModelConfig, max_sequence_length
from zebractl.schemas.recipe import Derived, RunConfig, derive
from zebractl.schemas.reports import PlanReport

GIB = 1024**3


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


def _activation_elems_per_token(m: ModelConfig, kind: str) -> int:
    """Elements autograd keeps per token for one sublayer (fused kernels; an estimate)."""
    h = m.hidden_size
    if kind == "mlp":
        return 2 * h + 3 * m.ffn_hidden_size  # input, normed, fc1 out (2F), act out (F)
    if kind in ("kda", "gdn"):
        d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
        in_rows = SUBLAYER_SHAPES[kind](m)["mixer.in_proj.weight"][0]
        conv = 2 * d.key_dim + d.value_dim
        return (
            2 * h + in_rows + conv + 3 * d.value_dim
        )  # in, normed, in_proj, conv, o, gate, normed o
    if kind == "mamba2":
        assert m.mamba2 is not None
        di = m.mamba2_dims.d_inner
        in_rows = SUBLAYER_SHAPES[kind](m)["mixer.in_proj.weight"][0]
        conv = di + 2 * m.mamba2.num_groups * m.mamba2.state_dim
        return 2 * h + in_rows + conv + 3 * di
    assert m.mla is not None
    a = m.mla
    q = a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
    lora = 2 * (a.q_lora_rank or 0) + 2 * a.kv_lora_rank + a.qk_pos_emb_head_dim
    return 2 * h + lora + 2 * q + a.num_heads * (a.qk_head_dim + 2 * a.v_head_dim)


def memory_report(cfg: RunConfig, total_params: int, d: Derived) -> dict[str, Any]:
    """Per-GPU memory estimate in bytes and GiB."""
    p = cfg.parallelism
    params_per_gpu = total_params / (p.tp * p.pp)
    mixed = cfg.precision in ("bf16", "fp16")
    if cfg.optimizer.impl == "torch_fused" or not mixed:
        weights_b, grads_b, state_b = 4, 4, 8  # fp32 params + grads, Adam m and v
        scheme = "fp32 params + fp32 grads + Adam m, v (fp32)"
    else:
        weights_b, grads_b, state_b = 2, 4, 12  # bf16 params, fp32 grads, fp32 main + m + v
        scheme = "bf16 params + fp32 grads + fp32 main params, Adam m, v"
    state_shard = d.data_parallel if p.distributed_optimizer else 1
    model_bytes = params_per_gpu * (weights_b + grads_b)
    optim_bytes = params_per_gpu * state_b / state_shard
    act_dtype = 2 if mixed else 4
    tokens = cfg.batch.micro * cfg.data.seq_length / (p.tp * p.cp)
    per_token = sum(_activation_elems_per_token(cfg.model, k) for k in cfg.model.sublayers)
    per_token += 2 * cfg.model.hidden_size  # final norm in/out
    logits = 0.0
    if not cfg.kernels.fused_linear_cross_entropy:
        logits = tokens * cfg.model.padded_vocab_size * (act_dtype + 4)  # logits + fp32 softmax
    else:
        logits = tokens * cfg.model.padded_vocab_size * 4 / cfg.kernels.fused_ce_chunks
    # With 1F1B the first pipeline stage holds pp micro-batches of 1/pp of the layers: about the
    # activations of the whole model for one micro-batch, whatever pp is.
    act_bytes = tokens * per_token * act_dtype + logits
    total = model_bytes + optim_bytes + act_bytes

    def gib(x: float) -> float:
        return round(x / GIB, 2)

    return {
        "scheme": scheme,
        "params_and_grads_gib": gib(model_bytes),
        "optimizer_gib": gib(optim_bytes),
        "activations_gib": gib(act_bytes),
        "total_gib": gib(total),
        "note": "estimate: exact state bytes + activations kept by autograd; excludes allocator "
        "slack and kernel workspaces",
    }


def built_parameter_count(m: ModelConfig) -> int | None:
    """Parameters of the model actually built (meta device), or None without the runtime installed."""
    try:
        from zebractl.model.model import build_model
    except ImportError:
        return None

    model = build_model(m, device="meta")
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class Plan:
    """The plan of one resolved recipe."""

    recipe: str
    cfg: RunConfig

    def report(self) -> PlanReport:
        """The typed document of `zebractl plan --json` (:meth:`to_dict`, validated)."""
        return PlanReport.model_validate(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data: the fields of :class:`PlanReport` without ``schema_version``."""
        cfg, m = self.cfg, self.cfg.model
        d = derive(cfg)
        params = parameter_report(m)
        params["built"] = built_parameter_count(m)
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
        }
