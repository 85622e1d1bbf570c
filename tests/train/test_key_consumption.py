"""Every key means something: each leaf of a resolved recipe (and of its preset) is read by the code
that plans, builds, trains, validates and checkpoints it.

For every shipped recipe, a CPU-sized miniature (same sections and keys, small dimensions, the demo
corpus) is planned and trained for two iterations with validation and checkpoints, and its model is
run once more through the FLA kernel dispatch (FLA's entry points replaced by shape-correct stand-ins,
since FLA's Triton kernels need a GPU), while every attribute read of the config objects is recorded.
A non-null leaf nobody read fails the test: delete the key or use it. Null leaves (an unset optional
key, a section turned off) claim nothing and are not required.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("fla")

from pydantic import BaseModel  # noqa: E402

from zebractl.config import catalog  # noqa: E402
from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.schemas.base import StrictModel  # noqa: E402

RECIPES = sorted(catalog.shipped("recipe"))


def _key(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


def _nodes(obj: BaseModel, prefix: str = "") -> Iterator[tuple[BaseModel, str]]:
    """Every config object under ``obj`` with its dotted prefix (list items share ``key[]``)."""
    yield obj, prefix
    for name in type(obj).model_fields:
        value = obj.__dict__[name]
        key = f"{prefix}{_key(type(obj), name)}"
        if isinstance(value, BaseModel):
            yield from _nodes(value, key + ".")
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, BaseModel):
                    yield from _nodes(item, key + "[].")


def leaves(obj: BaseModel) -> set[str]:
    """Dotted keys of every non-null leaf value (lists of sections count through their items)."""
    out = set()
    for node, prefix in _nodes(obj):
        for name in type(node).model_fields:
            value = node.__dict__[name]
            if value is None or isinstance(value, BaseModel):
                continue
            if isinstance(value, list) and value and isinstance(value[0], BaseModel):
                continue
            out.add(prefix + _key(type(node), name))
    return out


@contextlib.contextmanager
def reads(root: BaseModel) -> Iterator[set[str]]:
    """Record every field read on ``root``'s config objects while the block runs."""
    where = {id(node): prefix for node, prefix in _nodes(root)}
    seen: set[str] = set()

    def getattribute(self: Any, name: str) -> Any:
        prefix = where.get(id(self))
        if prefix is not None and name in type(self).model_fields:
            seen.add(prefix + _key(type(self), name))
        return object.__getattribute__(self, name)

    StrictModel.__getattribute__ = getattribute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del StrictModel.__getattribute__


def miniature(name: str, data, out, chat=None) -> list[str]:
    """`--set` values shrinking shipped recipe ``name`` to a CPU-sized run of the same shape. A
    chat recipe trains on ``chat`` (the demo conversations); one with ``init_from: runs/NAME``
    starts from the miniature of recipe NAME, trained before it in ``out``'s parent."""
    shipped = resolve_recipe(name, [f"data.paths=[{{path: {data}}}]"]).run
    if shipped.data.format == "chat":
        data = chat
    m = shipped.model
    sets = [
        "model.vocab_size=50257",  # the demo tokenizer
        "model.hidden_size=64",
        "model.ffn_hidden_size=128",
    ]
    if m.layout.pattern is not None:
        short = list(dict.fromkeys(m.layout.pattern))  # each mixer of the pattern once
        sets += [f"model.num_blocks={len(short)}", f"model.layout.pattern=[{', '.join(short)}]"]
    else:
        sets.append(f"model.num_blocks={4 if m.layout.hybrid_attention_ratio else 2}")
    for mixer in ("kda", "gdn"):
        block = getattr(m, mixer)
        if block is None:
            continue
        sets.append(f"model.{mixer}.num_heads=2")
        if block.head_k_dim is not None:
            sets.append(f"model.{mixer}.head_k_dim=16")
        if block.head_v_dim is not None:
            sets.append(f"model.{mixer}.head_v_dim=32")
        if block.num_v_heads is not None:
            sets.append(f"model.{mixer}.num_v_heads={2 * (block.num_v_heads // block.num_heads)}")
    if m.mamba2 is not None:
        sets += ["model.mamba2.state_dim=16", "model.mamba2.head_dim=16", "model.mamba2.expand=2"]
        sets.append(f"model.mamba2.num_groups={min(m.mamba2.num_groups, 2)}")
    if m.mla is not None:
        sets += [
            "model.mla.num_heads=2",
            "model.mla.kv_lora_rank=16",
            "model.mla.qk_head_dim=16",
            "model.mla.qk_pos_emb_head_dim=8",
            "model.mla.v_head_dim=16",
        ]
        if m.mla.q_lora_rank is not None:
            sets.append("model.mla.q_lora_rank=32")
    return (
        sets
        + [
            f"data.paths=[{{path: {data}, weight: 1.0}}]",
            f"data.tokenizer={data / 'tokenizer'}",
            # the demo conversations carry their own held-out split (prepare --valid-fraction)
            "data.split=null" if shipped.data.format == "chat" else "data.split=[98, 2, 0]",
            "data.seq_length=64",
            # two micro-batches a step (gradient accumulation, as in a real run) of 2 sequences:
            # the LM head over the demo's 50257 tokens is most of the time (micro-batches of 4
            # and a validation after each iteration: 86.8 s for all recipes, against 56.8 s)
            "batch.micro=2",
            "batch.global=4",
            "optimizer.impl=torch_fused",
            "parallelism.num_gpus=1",
            "parallelism.distributed_optimizer=false",
            # two iterations, said the way the recipe says its run length (steps or a token budget)
            "schedule.iterations=2" if shipped.schedule.iterations else "schedule.train_tokens=512",
            "schedule.warmup_iterations=1",
            "checkpoint.interval=2",  # one save, after the last iteration: every save key is read by it
            "logging.interval=1",
            # one held-out pass, after iteration 2: every validation key is read by it
            "validation={interval: 2, iterations: 1}",
            "nonfinite.action=skip",
            # the LM-head loss in one chunk: its 32 default chunks of 8 tokens were half the time
            "kernels.fused_ce_chunks=1",
            # the hybrids save in the background (its settings are read), the others wait for saves
            f"checkpoint.async_save={'hybrid' in name}",
            f"output_dir={out}",
        ]
        + ([f"init_from={out.parent / Path(shipped.init_from).name}"] if shipped.init_from else [])
    )


def _fake_fla(monkeypatch) -> None:
    """Replace FLA's entry points with CPU stand-ins of the right shapes (math irrelevant here)."""
    from zebractl.model import ops
    from zebractl.model.ops import torch_ops as T

    def passthrough(q, k, v, g, beta, **_):
        return v + 0 * (q.sum() + k.sum() + g.sum() + beta.sum()), None

    def gla(q, k, v, g=None, scale=None, **_):
        return v + 0 * (q.sum() + k.sum() + g.sum()), None

    def conv(x, w, bias, activation, backend, cu_seqlens=None):
        return T.causal_conv1d(x, w, bias, activation=activation), None

    def ce_fwd(logits, target, ignore_index, **_):
        lse = torch.logsumexp(logits.float(), -1)
        loss = torch.nn.functional.cross_entropy(
            logits.float(), target, ignore_index=ignore_index, reduction="none"
        )
        return loss, torch.zeros_like(loss), lse, logits.shape[1], 0

    def ce_bwd(logits, target, lse, dloss, ignore_index, inplace_backward, **_):
        from zebractl.model.ops.lm_head import _ce_torch

        _ce_torch(logits, target, ignore_index)
        return logits

    def rms(x, w, b, residual=None, eps=1e-6, prenorm=False):
        if residual is None:
            return T.rms_norm(x, w, eps)
        r = residual + x
        return T.rms_norm(r, w, eps), r

    stand_ins = {
        "fla.ops.kda.chunk_kda": passthrough,
        "fla.ops.gated_delta_rule.chunk_gated_delta_rule": passthrough,
        "fla.ops.simple_gla.chunk_simple_gla": gla,
        "fla.modules.norm.l2norm.l2norm": T.l2norm,
        "fla.modules.causal_conv1d.ops.causal_conv1d": conv,
        "fla.modules.norm.layernorm.rms_norm": rms,
        "fla.modules.norm.fused_norm_gate.rms_norm_gated": (
            lambda x, g, w, b, activation, eps: T.gated_rms_norm(x, g, w, eps, activation)
        ),
        "fla.modules.activations.ops.swiglu": T.swiglu,
        "fla.modules.fused_cross_entropy.ops.cross_entropy_fwd": ce_fwd,
        "fla.modules.fused_cross_entropy.ops.cross_entropy_bwd": ce_bwd,
        # zebractl's own Triton kernels (the defaults rmsnorm_backward tiled, swiglu_kernel packed)
        "zebractl.model.ops.rmsnorm.rms_norm": (
            lambda x, w, eps, residual=None, prenorm=False, forward="fla": rms(
                x, w, None, residual, eps, prenorm
            )
        ),
        "zebractl.model.ops.glu.packed_swiglu": lambda h: T.swiglu(*h.chunk(2, dim=-1)),
        # kernels.compile auto compiles the Mamba2 glue on FLA's kernels: read, not compiled here
        "zebractl.model.mixers.mamba2._compiled": lambda fn: fn,
    }
    for target, fn in stand_ins.items():
        monkeypatch.setattr(target, fn)
    monkeypatch.setattr(ops, "resolve_backend", lambda requested, device=None: "fla")


def _exercise(name: str, sets: list[str], monkeypatch) -> tuple[set[str], set[str]]:
    """(non-null leaves, leaves read) of the miniature of recipe ``name``."""
    from zebractl.model.model import build_model
    from zebractl.planning.plan import Plan
    from zebractl.run import ResolvedConfigRecord, RunDir
    from zebractl.runtime import kernel_cache
    from zebractl.train.trainer import Trainer

    r = resolve_recipe(name, sets)
    cfg = r.run
    with reads(cfg) as seen:
        Plan(r.source, cfg).to_dict()
        kernel_cache.configure_for(cfg.kernels)  # what `train` does first (None on the CPU)
        run = RunDir.for_recipe(cfg, r.name)
        result = Trainer(cfg, run, ResolvedConfigRecord.of(r), console=lambda s: None).fit()
        with monkeypatch.context() as mp:
            _fake_fla(mp)
            model = build_model(cfg.model, kernels=cfg.kernels, device="cpu", seed=cfg.seed)
            x = torch.randint(0, 1000, (1, 32))
            loss, _ = model(x, labels=x)
            loss.backward()
    assert result.stopped == "done" and result.iterations == 2 and result.val_loss is not None
    return leaves(cfg), seen


def not_applicable(cfg) -> set[str]:
    """Keys that are set but cannot act on this model: kernel toggles of components it does not
    have (each toggle's schema docstring names the component). The union check below still
    requires every one of them to be read by the recipes that have the component."""
    blocks = set(cfg.model.blocks)
    out = set()
    if "kda" not in blocks:
        out.add("kernels.kda_gate_in_kernel")
    if "gdn" not in blocks:
        out.add("kernels.gdn_gate_in_kernel")
    if not blocks & {"kda", "gdn"}:
        out |= {"kernels.qk_l2norm_in_kernel", "kernels.fused_gated_norm", "kernels.qkv_conv"}
    if "mamba2" not in blocks:  # the Mamba2 scan's precision and the Mamba2 mixer's glue
        out |= {"kernels.ssd_precision", "kernels.compile"}
    return out


def _starts_from(name: str) -> tuple[bool, str]:
    return resolve_recipe(name, []).run.init_from is not None, name


@pytest.mark.slow
def test_every_key_of_every_shipped_recipe_is_read(demo_data, demo_chat, tmp_path, monkeypatch):
    unread: dict[str, list[str]] = {}
    every_leaf: set[str] = set()
    every_read: set[str] = set()
    for name in sorted(RECIPES, key=_starts_from):  # a run another starts from trains first
        shipped = resolve_recipe(name, [f"data.paths=[{{path: {demo_data}}}]"]).run
        sets = miniature(name, demo_data, tmp_path / name, chat=demo_chat)
        mine, seen = _exercise(name, sets, monkeypatch)
        keys = leaves(shipped) | mine
        every_leaf |= keys
        every_read |= seen
        missing = sorted(keys - seen - not_applicable(resolve_recipe(name, sets).run))
        if missing:
            unread[name] = missing
    assert not unread, f"keys nobody reads: {unread}"
    assert every_leaf <= every_read, sorted(every_leaf - every_read)
    assert len(RECIPES) >= 15


@pytest.mark.slow
def test_the_tracker_sees_an_unread_key(demo_data, tmp_path, monkeypatch):
    """The check itself can fail: a key the code ignores shows up as unread."""
    from zebractl.train import trainer

    sets = miniature("tiny_kda", demo_data, tmp_path / "run")
    real = trainer.Trainer.setup

    def setup_without_seed(self):  # a trainer that forgets the recipe's seed
        cfg = self.cfg
        self.cfg = cfg.model_copy(update={"seed": 1234})
        try:
            real(self)
        finally:
            self.cfg = cfg

    monkeypatch.setattr(trainer.Trainer, "setup", setup_without_seed)
    r = resolve_recipe("tiny_kda", sets)
    with reads(r.run) as seen:
        from zebractl.run import ResolvedConfigRecord, RunDir

        trainer.Trainer(
            r.run,
            RunDir.for_recipe(r.run, r.name),
            ResolvedConfigRecord.of(r),
            console=lambda s: None,
        ).fit()
    assert "seed" not in seen and "seed" in leaves(r.run)
