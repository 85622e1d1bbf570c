"""Where one zebractl training step's GPU time goes, by category (issue 12).

    python benchmarks/profile_step.py --preset kda_300M --micro 16 --out DIR

Builds the step of benchmarks/step_bench.py (``ours``: the recipe's engine and its autocast,
accumulation 1; ``--set optimizer.impl=megatron`` for the Megatron engine), runs
--warmup steps, times --timed steps without the profiler (CUDA events, median), then profiles
--profiled steps with torch.profiler (CUDA activity, shapes). Every GPU kernel is attributed to the
innermost CPU op that launched it (chrome-trace correlation ids); GEMMs are split by their operand
shapes (a vocabulary-sized dim = LM head; the FFN width = MLP; else mixer/attention projections),
other kernels by name. Writes DIR/profile.md (tables) and DIR/profile.json; prints the table.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import step_bench as sb  # noqa: E402
import torch  # noqa: E402

GEMM = re.compile(r"gemm|nvjet|cutlass|xmma|sm90_|cublas|splitK", re.I)
NAMED = [  # (category, kernel-name pattern), first match wins
    (
        "recurrent chunk kernels (KDA/GDN/SSD)",
        r"chunk_|kda|gated_delta|simple_gla|fused_recurrent|wy_|solve_tril|kernel_kernel|tilelang",
    ),
    ("short convolution", r"causal_conv1d"),
    ("cross-entropy/softmax", r"cross_entropy|logsumexp|softmax"),
    (
        "norms (RMSNorm, fused norm-gate, l2norm)",
        r"layer_norm|rms_norm|norm_fwd|norm_bwd|l2norm|layernorm",
    ),
    ("SwiGLU", r"swiglu"),
    ("optimizer (AdamW, clip, copies)", r"adam|multi_tensor|foreach|FusedAdam"),
    ("attention (SDPA/flash)", r"flash|fmha|attention|sdpa"),
    ("memcpy/memset", r"^Memcpy|^Memset|memcpy|memset"),
    ("cat/split copies", r"CatArray|cat_|split"),
    ("embedding", r"embedding|index_select|indexSelect|scatter_add|index_put"),
    ("casts/copies", r"copy|direct_copy|to_copy|cast"),
    ("elementwise/reduce/other", r"."),
]


def _gemm_category(dims, vocab: int, ffn: int) -> str:
    flat = [d for shape in (dims or []) if isinstance(shape, list) for d in shape]
    if vocab in flat:
        return "LM-head GEMMs"
    if ffn in flat or 2 * ffn in flat:
        return "MLP GEMMs"
    return "mixer/attention projection GEMMs"


def categorize(trace: dict, vocab: int, ffn: int) -> tuple[dict, dict, float, float]:
    """(ms per category, ms per kernel name, kernel-sum ms, window ms) of a chrome trace."""
    ev = trace["traceEvents"]
    ops = defaultdict(list)  # tid -> [(ts, end, name, dims)]
    launches = {}  # correlation -> (tid, ts)
    kernels = []
    for e in ev:
        cat = e.get("cat", "")
        if cat == "cpu_op":
            ops[e["tid"]].append(
                (e["ts"], e["ts"] + e.get("dur", 0), e["name"], e.get("args", {}).get("Input Dims"))
            )
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            # cuBLAS (nvjet) and Triton launch through the driver API (cuLaunchKernel[Ex]): without
            # these, no GEMM finds its op and every GEMM fell into one category (the profile of 2026-12-01)
            launches[e["args"]["correlation"]] = (e["tid"], e["ts"])
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append(e)
    for tid in ops:
        ops[tid].sort()
    starts = {tid: [o[0] for o in lst] for tid, lst in ops.items()}
    by_cat: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    lo, hi = float("inf"), 0.0
    for k in kernels:
        dur = k.get("dur", 0) / 1e3
        lo, hi = min(lo, k["ts"]), max(hi, k["ts"] + k.get("dur", 0))
        name = k["name"]
        op_name, dims = None, None
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is not None:
            tid, ts = launch
            lst, st = ops.get(tid, []), starts.get(tid, [])
            i = bisect.bisect_right(st, ts) - 1
            best = None
            while i >= 0:  # innermost enclosing op
                s, e_, n, d = lst[i]
                if s <= ts <= e_ and (best is None or s >= best[0]):
                    best = (s, n, d)
                    break
                i -= 1
            if best:
                _, op_name, dims = best
        if GEMM.search(name) or (op_name or "") in ("aten::mm", "aten::addmm", "aten::bmm"):
            cat = _gemm_category(dims, vocab, ffn)
        else:
            cat = next(c for c, pat in NAMED if re.search(pat, name, re.I))
        by_cat[cat] += dur
        by_name[f"{cat} | {name[:90]}"] += dur
    return by_cat, by_name, sum(by_cat.values()), (hi - lo) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="kda_300M")
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timed", type=int, default=5)
    ap.add_argument("--profiled", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra --set")
    ap.add_argument(
        "--impl", default="ours", help="a step of step_bench.py: ours, ours_fp8, fla_tuned, ..."
    )
    a = ap.parse_args()
    from zebractl.runtime import kernel_cache
    from zebractl.runtime.dist import ensure_initialized

    kernel_cache.configure()
    ensure_initialized()
    cfg = sb._cfg(a.preset, a.micro, a.seq, a.extra + sb.OURS_SETS.get(a.impl, []))
    m, sd, _ = sb.initial_weights(a.preset, a.micro, a.seq, a.extra)
    ids = torch.randint(0, m.vocab_size, (a.micro, a.seq), device="cuda")
    labels, mask = ids.roll(-1, 1), torch.ones(a.micro, a.seq, device="cuda")
    # the step as step_bench times it (ours: the engine's autocast, as the Trainer applies it)
    losses: list = []
    step, _holder = sb.make_step(
        a.impl, a.preset, a.micro, a.seq, a.extra, m, sd, ids, labels, mask, losses
    )

    times = sb._time(step, a.warmup, a.timed, True)
    med = statistics.median(times)
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
    ) as prof:
        for _ in range(a.profiled):
            step()
        torch.cuda.synchronize()
    a.out.mkdir(parents=True, exist_ok=True)
    trace_path = a.out / "trace.json"
    prof.export_chrome_trace(str(trace_path))
    trace = json.loads(trace_path.read_text())
    # kept (compressed) so the categories can be recomputed without the GPU
    with gzip.open(a.out / "trace.json.gz", "wt") as f:
        json.dump(trace, f)
    trace_path.unlink()
    by_cat, by_name, total, window = categorize(trace, m.padded_vocab_size, m.ffn_hidden_size)
    n = a.profiled
    rows = sorted(by_cat.items(), key=lambda kv: -kv[1])
    lines = [
        f"# Profile: {a.preset} micro {a.micro} seq {a.seq}, step `{a.impl}` of step_bench.py "
        f"({cfg.optimizer.impl} engine for ours; accumulation 1)",
        "",
        f"Unprofiled step (median of {a.timed}): {med:.1f} ms = {a.micro * a.seq / med * 1e3:,.0f} tok/s. "
        f"Profiled {n} steps: kernel sum {total / n:.1f} ms/step, GPU window {window / n:.1f} ms/step "
        f"(idle {100 * (1 - total / window):.1f}% of the window).",
        "",
        "| category | ms/step | % of kernel time |",
        "|---|---:|---:|",
    ]
    lines += [f"| {c} | {v / n:.2f} | {100 * v / total:.1f}% |" for c, v in rows]
    lines += [
        f"| **sum of GPU kernel time** | {total / n:.2f} | 100% |",
        "",
        "Top kernels:",
        "",
        "| category / kernel | ms/step |",
        "|---|---:|",
    ]
    lines += [
        f"| {k} | {v / n:.2f} |" for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]
    ]
    text = "\n".join(lines) + "\n"
    (a.out / "profile.md").write_text(text)
    (a.out / "profile.json").write_text(
        json.dumps(
            {
                "preset": a.preset,
                "impl": a.impl,
                "micro": a.micro,
                "seq": a.seq,
                "step_ms": med,
                "step_ms_all": times,
                "kernel_ms_per_step": total / n,
                "window_ms_per_step": window / n,
                "categories_ms_per_step": {c: v / n for c, v in rows},
                "kernels_ms_per_step": {k: v / n for k, v in by_name.items()},
            },
            indent=1,
        )
    )
    print(text)


if __name__ == "__main__":
    main()
