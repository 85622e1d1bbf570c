"""GPU checks of the model runtime (issue 3): FLA kernels vs our torch path, and 300M fwd+bwd timing.

Usage (on a CUDA machine; see benchmarks/README.md for the exact device command):

    python benchmarks/gpu_model.py kernels --mixer kda   # FLA vs torch, fwd + grads, one mixer
    python benchmarks/gpu_model.py step --preset kda_300M --micro 16 [--fla-reference]
    python benchmarks/gpu_model.py smoke                  # CPU: runs the code paths on tiny sizes

Each command prints one JSON line per result (prefix ``RESULT ``).

kernels: one block of the real 300M mixer dims (hidden 1024), vocabulary 4096, B=2, T=2048. The same
weights and tokens run (a) on the FLA backend in bf16 (params and activations, as trained) and (b) on
our pure-torch backend in fp32. Reported: relative L2 error ||a - b|| / ||b|| of the final hidden
states and of every parameter gradient of the mean token loss (worst one named). Two more variants
frame the number: our torch path in bf16 (the error bf16 itself costs: the floor) and FLA in fp32
(kernel error alone; tf32 dot products inside Triton).

step: forward + backward of the full preset at seq 2048 with bf16 parameters, fused kernels on
(recipe defaults), random tokens; median of 8 timed steps after 3 warm-up steps (CUDA events), peak
allocated memory. With --fla-reference, FLA's own HF class of the same model is timed the same way
(bf16 params, fuse_* on) in the same process, for a side-by-side ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from zebractl.config.resolve import resolve_preset, resolve_recipe  # noqa: E402
from zebractl.schemas.preset import LayoutConfig  # noqa: E402


def emit(**kw) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def _one_block(mixer: str):
    base = {"kda": "kda_300M", "gdn": "gdn_300M", "mamba2": "zebra_mamba_300M_hybrid"}[mixer]
    m = resolve_preset(base).config
    return m.model_copy(
        update={
            "num_blocks": 1,
            "vocab_size": 4096,
            "mla": None,
            "layout": LayoutConfig(mixer=mixer),
        }
    )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss_sum, n = model(ids, labels=ids.roll(-1, 1))
    (loss_sum / n).backward()
    with torch.no_grad():
        h = model.hidden_states(ids).float()
    grads = {k: p.grad.float().clone() for k, p in model.named_parameters()}
    return h, grads


def kernels(mixer: str, device: str, batch: int, seq: int) -> None:
    from zebractl.model.model import build_model

    m = _one_block(mixer)
    recipe_kernels = resolve_recipe("kda_300M").run.kernels
    ref = build_model(
        m,
        kernels=recipe_kernels.model_copy(update={"backend": "torch"}),
        device=device,
        seed=int(time.time()) % 10_000,
    )
    state = {k: v for k, v in ref.state_dict().items() if not k.endswith("_extra_state")}
    ids = torch.randint(0, m.vocab_size, (batch, seq), device=device)
    t0 = time.time()
    h_ref, g_ref = _loss_and_grads(ref, ids)
    variants = [("torch", torch.bfloat16)]  # the bf16 floor: our own torch path in bf16
    if device == "cuda":
        variants += [("fla", torch.bfloat16), ("fla", torch.float32)]
    for backend, dtype in variants:
        fast = build_model(
            m,
            kernels=recipe_kernels.model_copy(update={"backend": backend}),
            device=device,
            params_dtype=dtype,
        )
        fast.load_state_dict(state, strict=False)
        h, g = _loss_and_grads(fast, ids)
        errs = {k: _rel(g[k], g_ref[k]) for k in g_ref}
        worst = max(errs, key=errs.get)
        emit(
            check="kernels",
            mixer=mixer,
            backend=backend,
            dtype=str(dtype).split(".")[-1],
            batch=batch,
            seq=seq,
            hidden_rel_err=_rel(h, h_ref),
            grad_rel_err_max=errs[worst],
            grad_rel_err_worst=worst,
            grad_rel_err_median=statistics.median(errs.values()),
            seconds=round(time.time() - t0, 1),
        )


def _time_steps(fn, warmup: int = 3, steps: int = 8) -> list[float]:
    from step_bench import _time

    return _time(fn, warmup, steps, cuda=True)


def step(preset: str, micro: int, seq: int, fla_reference: bool) -> None:
    from zebractl.model.model import build_model

    m = resolve_preset(preset).config
    kernels_cfg = resolve_recipe(preset).run.kernels
    torch.cuda.reset_peak_memory_stats()
    model = build_model(m, kernels=kernels_cfg, device="cuda", params_dtype=torch.bfloat16)
    ids = torch.randint(0, m.vocab_size, (micro, seq), device="cuda")
    losses = []

    def ours():
        model.zero_grad(set_to_none=True)
        loss_sum, n = model(ids, labels=ids.roll(-1, 1))
        (loss_sum / n).backward()
        losses.append(loss_sum.detach() / n)

    t0 = time.time()
    ours()
    first = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    times = _time_steps(ours)
    med = statistics.median(times)
    emit(
        check="step",
        impl="zebractl",
        preset=preset,
        micro=micro,
        seq=seq,
        first_step_s=round(first, 1),
        step_ms=round(med, 1),
        step_ms_all=[round(t, 1) for t in times],
        tokens_per_s=round(micro * seq / med * 1e3),
        peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
        loss=round(losses[-1].item(), 4),
        params=sum(p.numel() for p in model.parameters()),
    )
    if not fla_reference:
        return
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    model = None  # free its memory before the reference model is built
    torch.cuda.empty_cache()
    from step_bench import _fla_model

    ref = _fla_model(m, sd)
    ref = ref.to(device="cuda", dtype=torch.bfloat16).train()
    torch.cuda.reset_peak_memory_stats()
    ref_losses = []

    def theirs():
        ref.zero_grad(set_to_none=True)
        out = ref(input_ids=ids, labels=ids)
        out.loss.backward()
        ref_losses.append(out.loss.detach())

    theirs()
    torch.cuda.reset_peak_memory_stats()
    times = _time_steps(theirs)
    med_ref = statistics.median(times)
    emit(
        check="step",
        impl="fla",
        preset=preset,
        micro=micro,
        seq=seq,
        step_ms=round(med_ref, 1),
        step_ms_all=[round(t, 1) for t in times],
        tokens_per_s=round(micro * seq / med_ref * 1e3),
        peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
        loss=round(ref_losses[-1].item(), 4),
        speed_ratio_ours_over_fla=round(med_ref / med, 3),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels")
    k.add_argument("--mixer", choices=["kda", "gdn", "mamba2"], required=True)
    k.add_argument("--batch", type=int, default=2)
    k.add_argument("--seq", type=int, default=2048)
    s = sub.add_parser("step")
    s.add_argument("--preset", required=True)
    s.add_argument("--micro", type=int, default=16)
    s.add_argument("--seq", type=int, default=2048)
    s.add_argument("--fla-reference", action="store_true")
    sub.add_parser("smoke")
    args = ap.parse_args()
    emit(
        env="versions",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        fla=_version("flash-linear-attention"),
        megatron_core=_version("megatron-core"),
        triton=_version("triton"),
        tilelang=_version("tilelang"),
        triton_cache=os.environ.get("TRITON_CACHE_DIR"),
    )
    if args.cmd == "kernels":
        kernels(args.mixer, "cuda", args.batch, args.seq)
    elif args.cmd == "step":
        step(args.preset, args.micro, args.seq, args.fla_reference)
    else:
        for mixer in ("kda", "gdn", "mamba2"):
            kernels(mixer, "cpu", 1, 96)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
