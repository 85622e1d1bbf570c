"""Training-step throughput, side by side in one process on one GPU: zebractl vs FLA (issue 12).

    python benchmarks/step_bench.py --preset kda_300M --runs ours:16,64 fla_shipped:16,64 \
        fla_tuned:16,64 --repeat-ours --json-out RESULTS.json
    python benchmarks/step_bench.py --smoke            # CPU: exercises the code paths on tiny_kda

A step is one optimizer step over one micro-batch of random tokens at seq 2048 (accumulation 1, so
the optimizer's share is the largest it can be), timed with CUDA events: median of --steps steps
after --warmup steps. Three implementations, each built fresh from the same initial weights:

- ``ours``: zebractl's training step as `zebractl train` runs the recipe: its engine and kernel
  settings (the shipped 300M recipes use ``optimizer.impl: torch_fused``: fp32 params, bf16
  autocast, torch's fused AdamW, clip 1.0, as FLA trains). ``ours_megatron``: the Megatron engine
  (bf16 params, fp32 mains and grads, megatron DDP, fused AdamW). ``ours_torch_fused``: forced
  torch_fused.
  ``ours_fp8`` / ``ours_fp8_rowwise``: the recipe's engine with ``kernels.fp8_mlp`` tensorwise /
  rowwise (opt-in FP8 MLP GEMMs through torchao, the MLP compiled); ``ours_megatron_fp8``: the
  Megatron engine with tensorwise FP8. ``ours_graph``: forward+backward replayed as a CUDA graph
  (``kernels.cuda_graph``; ``ours_graph_fp8`` with the FP8 MLP). ``ours_tiled_norm``: zebractl's
  RMSNorm backward (``kernels.rmsnorm_backward=tiled``; ``ours_graph_tiled_norm`` with the graph).
  ``ours_packed_swiglu``: zebractl's SwiGLU on the packed projection (``kernels.swiglu_kernel=packed``);
  ``ours_fast``: both kernels; ``ours_fast_graph``: both and the graph; ``ours_fla_kernels``: FLA's
  RMSNorm backward and SwiGLU whatever the defaults say. ``ours_ssd_mixed``: Mamba2's scan on
  bf16 operands (``kernels.ssd_precision=mixed``); ``ours_glue``: the compiled glue
  (``kernels.compile=glue``); ``ours_mamba_fast``: both kernels, both of these. ``ours_chunks32`` / ``8`` / ``4`` /
  ``2``: the LM-head loss in that many chunks (the 300M recipes: 8 since 2026-12-01, 32
  before); ``ours_fp8_chunks4``,
  ``ours_fp8_rowwise_chunks4``: FP8 with 4 chunks. ``ours_unfused_add``: the residual add outside the
  next norm, as before the fused add+RMSNorm (measures that change alone). ``ours_qkv_split``:
  KDA's/GDN's q, k, v convolved one tensor at a time into contiguous outputs
  (``kernels.qkv_conv=per_tensor``); ``ours_norm_fwd``: zebractl's RMSNorm forward
  (``kernels.rmsnorm_forward=tiled``); ``ours_split_norm``: both.
- ``fla_shipped``: FLA 0.6.0's own model class (KDAForCausalLM / GatedDeltaNetForCausalLM) trained
  the way FLA trains (fp32 params, bf16 autocast, ``torch.optim.AdamW(fused=True)``, clip 1.0),
  every FLA fusion on, its loss as shipped (fused linear cross-entropy, fp32 weight-gradient
  accumulation, 8 chunks).
- ``fla_tuned``: the same with the LM-head fix applied to FLA's model too (its criterion replaced
  by zebractl's chunked loss: bf16 products, fp32 accumulation, FLA's cross-entropy kernels, 8 chunks).

Presets without an FLA class (the hybrids) run ``ours`` only. An out-of-memory micro-batch is
recorded as such. MFU is against 989 TFLOP/s (dense bf16, H100/H200), with 6 x parameters per token
and with plan's FLOP count (recurrence and attention included). Each result is one JSON line
(prefix ``RESULT``) and, with --json-out, one list in that file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from zebractl.config.errors import ConfigError  # noqa: E402
from zebractl.config.resolve import resolve_recipe  # noqa: E402

PEAK = 989e12
RESULTS: list[dict] = []
JSON_OUT: list[Path] = []  # --json-out, rewritten after every result (a later crash loses nothing)


def emit(**kw) -> None:
    RESULTS.append(kw)
    print("RESULT " + json.dumps(kw), flush=True)
    for path in JSON_OUT:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(RESULTS, indent=1) + "\n")


def _time(fn, warmup: int, steps: int, cuda: bool) -> list[float]:
    for _ in range(warmup):
        fn()
    if not cuda:
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize()
    out = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


class OurLoss(torch.nn.Module):
    """FLA's criterion interface (hidden, labels, weight, bias) -> mean loss, with zebractl's
    chunked LM-head loss inside (the "LM-head fix" applied to FLA's model)."""

    ignore_index = -100
    reduction = "mean"

    def __init__(self, num_chunks: int = 8) -> None:
        super().__init__()
        self.num_chunks = num_chunks

    def forward(self, hidden, labels, weight, bias=None):
        from zebractl.model.ops.lm_head import linear_cross_entropy

        assert bias is None
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1)
        loss = linear_cross_entropy(
            h, weight, y, num_chunks=self.num_chunks, ce_kernel="fla" if h.is_cuda else "torch"
        )
        return loss / (y != self.ignore_index).sum().clamp_min(1)


OURS_SETS = {
    "ours_megatron": ["optimizer.impl=megatron"],
    "ours_fp8": ["kernels.fp8_mlp=tensorwise"],
    "ours_fp8_rowwise": ["kernels.fp8_mlp=rowwise"],
    "ours_megatron_fp8": ["optimizer.impl=megatron", "kernels.fp8_mlp=tensorwise"],
    "ours_graph": ["kernels.cuda_graph=true"],
    "ours_graph_fp8": ["kernels.cuda_graph=true", "kernels.fp8_mlp=tensorwise"],
    "ours_tiled_norm": ["kernels.rmsnorm_backward=tiled"],
    "ours_graph_tiled_norm": ["kernels.cuda_graph=true", "kernels.rmsnorm_backward=tiled"],
    "ours_packed_swiglu": ["kernels.swiglu_kernel=packed"],
    "ours_fast": ["kernels.rmsnorm_backward=tiled", "kernels.swiglu_kernel=packed"],
    "ours_fast_graph": [
        "kernels.rmsnorm_backward=tiled",
        "kernels.swiglu_kernel=packed",
        "kernels.cuda_graph=true",
    ],
    "ours_fla_kernels": ["kernels.rmsnorm_backward=fla", "kernels.swiglu_kernel=fla"],
    "ours_ssd_mixed": ["kernels.ssd_precision=mixed"],
    "ours_glue": ["kernels.compile=glue"],
    "ours_mamba_fast": [
        "kernels.rmsnorm_backward=tiled",
        "kernels.swiglu_kernel=packed",
        "kernels.ssd_precision=mixed",
        "kernels.compile=glue",
    ],
    "ours_ce_one_pass": ["kernels.cross_entropy=one_pass"],
    "ours_qkv_split": ["kernels.qkv_conv=per_tensor"],
    "ours_norm_fwd": ["kernels.rmsnorm_forward=tiled"],
    "ours_split_norm": ["kernels.qkv_conv=per_tensor", "kernels.rmsnorm_forward=tiled"],
    "ours_chunks32": ["kernels.fused_ce_chunks=32"],
    "ours_chunks8": ["kernels.fused_ce_chunks=8"],
    "ours_chunks4": ["kernels.fused_ce_chunks=4"],
    "ours_chunks2": ["kernels.fused_ce_chunks=2"],
    "ours_fp8_chunks4": ["kernels.fp8_mlp=tensorwise", "kernels.fused_ce_chunks=4"],
    "ours_fp8_rowwise_chunks4": ["kernels.fp8_mlp=rowwise", "kernels.fused_ce_chunks=4"],
}


def _unfuse_residual_adds(model) -> None:
    """Run the decoder as it ran before the fused add+RMSNorm: each sublayer adds its own residual
    (``x = layer(x)``), then the next norm reads the sum (benchmark only)."""
    stack = model.module.decoder if hasattr(model, "module") else model.decoder

    def forward(x, stack=stack):
        for layer in stack.layers:
            x = layer(x)
        return stack.final_norm(x)

    stack.forward = forward


def _cfg(preset: str, micro: int, seq: int, extra: list[str]):
    sets = [
        "data.paths=[{path: /unused}]",
        f"batch.micro={micro}",
        f"batch.global={micro}",
        f"data.seq_length={seq}",
        "parallelism.num_gpus=1",
        *extra,
    ]
    return resolve_recipe(preset, sets).run


def _fla_model(m, state_dict):
    import fla.models as fm

    from zebractl.hf import mapping

    cfg = mapping.fla_config(m) | {
        "fuse_norm": True,
        "fuse_swiglu": True,
        "fuse_cross_entropy": True,
    }
    if mapping.family(m) == "gdn":
        cfg |= {"fuse_cross_entropy": False, "fuse_linear_cross_entropy": True}
        model = fm.GatedDeltaNetForCausalLM(fm.GatedDeltaNetConfig(**cfg))
    else:
        model = fm.KDAForCausalLM(fm.KDAConfig(**cfg))
    model.load_state_dict(mapping.to_fla(state_dict, m), strict=False)
    return model


def _has_fla_class(m) -> bool:
    from zebractl.hf import mapping

    try:
        return mapping.family(m) in ("kda", "gdn")
    except Exception:  # noqa: BLE001 - a hybrid has no FLA class
        return False


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def initial_weights(preset: str, micro: int, seq: int, extra: list[str]):
    """The model config, the shared initial weights (fp32 on the CPU, as every engine initialises)
    and the parameter count."""
    from zebractl.model.model import build_model

    base = _cfg(preset, micro, seq, extra)
    init = build_model(base.model, kernels=base.kernels, device="cpu", seed=base.seed)
    sd = {k: v for k, v in init.state_dict().items() if not k.endswith("_extra_state")}
    return base.model, sd, sum(p.numel() for p in init.parameters())


def make_step(impl, preset, micro, seq, extra, m, sd, ids, labels, mask, losses):
    """The training step of ``impl`` (see the module docstring) from the initial weights ``sd``,
    and the objects it holds (freed by the caller). Each call appends the step's loss to ``losses``."""
    from zebractl.train.engine import build_engine

    cuda = torch.cuda.is_available()
    device = ids.device
    if impl.startswith("ours"):
        cfg = _cfg(preset, micro, seq, extra + OURS_SETS.get(impl, []))
        if not cuda or impl == "ours_torch_fused":
            cfg = cfg.model_copy(
                update={"optimizer": cfg.optimizer.model_copy(update={"impl": "torch_fused"})}
            )
        engine = build_engine(cfg, device, world=1, seed=cfg.seed)
        if impl == "ours_unfused_add":
            _unfuse_residual_adds(engine.model)
        target = engine.model.state_dict()
        engine.model.load_state_dict(
            {k: v.to(target[k].dtype) for k, v in sd.items()}, strict=False
        )
        engine.reload_model_params()
        for g in engine.optimizer.param_groups:
            g["lr"] = 3e-4

        graphed = None
        if cfg.kernels.cuda_graph:
            from zebractl.train.cuda_graph import GraphedMicroStep

            graphed = GraphedMicroStep(engine, 1, engine.autocast, print)

        def step(engine=engine, ids=ids, labels=labels, mask=mask, losses=losses, g=graphed):
            engine.zero_grad()
            if g is not None:  # the Trainer's graphed micro-step (kernels.cuda_graph)
                loss = g(ids, labels, mask)
            else:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=engine.autocast):
                    loss_sum, ntok = engine.forward(ids, labels=labels, loss_mask=mask)
                    loss = loss_sum / ntok
                    loss.backward()
            engine.finish_grads()
            engine.step()
            losses.append(loss.detach())

        return step, [engine]
    model = _fla_model(m, sd).to(device).train()
    if impl == "fla_tuned":
        model.criterion = OurLoss(num_chunks=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)

    def step(model=model, opt=opt, ids=ids, losses=losses):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.detach())

    return step, [model, opt]


def bench(
    preset: str,
    runs: list[tuple[str, int]],
    seq: int,
    warmup: int,
    steps: int,
    repeat_ours: bool,
    extra: list[str],
) -> None:
    from zebractl.planning.flops import flops_per_token
    from zebractl.runtime.dist import ensure_initialized

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    ensure_initialized()
    m, sd, n_params = initial_weights(preset, runs[0][1], seq, extra)
    plan_flops = flops_per_token(m, seq).training
    order = [(i, mb) for i, mb in runs if i.startswith("ours") or _has_fla_class(m)]
    ours = [r for r in order if r[0] == "ours"]
    if repeat_ours and ours:
        order.append(ours[0])
    seen: set[tuple[str, int]] = set()
    for impl, micro in order:
        repeat = (impl, micro) in seen
        seen.add((impl, micro))
        _free()
        ids = torch.randint(0, m.vocab_size, (micro, seq), device=device)
        labels, mask = ids.roll(-1, 1), torch.ones(micro, seq, device=device)
        losses: list[torch.Tensor] = []
        try:
            t_build = time.perf_counter()
            step, holder = make_step(
                impl, preset, micro, seq, extra, m, sd, ids, labels, mask, losses
            )
            build_s = time.perf_counter() - t_build
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            times = _time(step, warmup, steps, cuda)
            med = statistics.median(times)
            tps = micro * seq / med * 1e3
            emit(
                check="step",
                preset=preset,
                impl=impl + ("_repeat" if repeat else ""),
                micro=micro,
                seq=seq,
                step_ms=round(med, 2),
                step_ms_all=[round(t, 2) for t in times],
                tokens_per_s=round(tps),
                mfu_6n=round(tps * 6 * n_params / PEAK, 4),
                mfu_plan=round(tps * plan_flops / PEAK, 4),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
                reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 3) if cuda else None,
                static_gib=round(torch.cuda.memory_allocated() / 2**30, 3) if cuda else None,
                first_step_s=round(first, 2),
                build_s=round(build_s, 2),
                loss_first=round(losses[0].item(), 4),
                loss_last=round(losses[-1].item(), 4),
                params=n_params,
            )
        except torch.OutOfMemoryError as exc:
            emit(
                check="step",
                preset=preset,
                impl=impl,
                micro=micro,
                seq=seq,
                oom=True,
                error=str(exc).splitlines()[0][:200],
            )
        except ConfigError as exc:  # e.g. a setting this engine refuses: recorded, the rest runs
            emit(check="step", preset=preset, impl=impl, micro=micro, seq=seq, error=str(exc))
        finally:
            holder = step = None  # noqa: F841
            losses.clear()
            _free()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--preset",
        nargs="+",
        default=["kda_300M"],
        help="one or more presets, timed one after the other in this process (the same --runs)",
    )
    ap.add_argument(
        "--runs",
        nargs="+",
        default=["ours:16", "fla_shipped:16", "fla_tuned:16"],
        help="IMPL:MICRO[,MICRO...] in the order to time them, e.g. ours:16,64 fla_shipped:16",
    )
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat-ours", action="store_true", help="time ours again at the end")
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        help="extra --set for ours (e.g. kernels.fused_ce_chunks=16)",
    )
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny_kda, tiny steps")
    a = ap.parse_args()
    if a.json_out:
        JSON_OUT.append(a.json_out)
    from zebractl.runtime import kernel_cache

    cache = kernel_cache.configure()
    emit(
        env="versions",
        torch=torch.__version__,
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        triton_cache=os.environ.get("TRITON_CACHE_DIR"),
        kernel_cache=cache.describe() if cache else None,
        date=time.strftime("%Y-%m-%d"),
    )
    runs = [
        (spec.split(":")[0], int(mb)) for spec in a.runs for mb in spec.split(":")[1].split(",")
    ]
    if a.smoke:
        bench("tiny_kda", [("ours", 2)], 64, 1, 2, True, ["kernels.backend=torch"])
    else:
        for preset in a.preset:
            bench(preset, runs, a.seq, a.warmup, a.steps, a.repeat_ours, a.extra)


if __name__ == "__main__":
    main()
