"""The LM-head loss's softmax part alone: FLA's two kernels against zebractl's one-pass kernel
(``kernels.cross_entropy``) on one chunk of logits, side by side in one process.

    python benchmarks/ce_kernel_bench.py --rows 2048 --vocab 128256 --json-out ce.json

Each variant turns the same bf16 logits ``[rows x vocab]`` (a fresh copy per call, made outside
the timing) into the per-row loss and the in-place gradient; the median of --repeat CUDA-event
timings after two warm-up calls, and the bytes each would move at one pass per read or write over
the logits (3 passes for FLA's pair, 2 for the one-pass kernel) as an effective bandwidth. The
one-pass kernel runs in several configurations PER_SM:BLOCK:WARPS[:lanes] (programs per SM: how
many rows are in flight, whose sum must fit the L2 cache for the second sweep to find them there;
logits per sweep step; warps per program; lanes: the first sweep's maximum and sum per lane). Every variant's loss and gradient are
compared with FLA's (max |loss difference|, max |gradient difference|).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _time(fn, x: torch.Tensor, repeat: int) -> tuple[float, object]:
    out = None
    times = []
    for i in range(repeat + 2):
        buf = x.clone()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = fn(buf)
        e.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(s.elapsed_time(e))
        out = (loss, buf)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048, help="tokens per chunk (65,536 / 32 chunks)")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument(
        "--configs",
        nargs="+",
        default=[
            "2:8192:16",
            "1:8192:32",
            "1:16384:32",
            "2:16384:16",
            "2:8192:16:lanes",
            "1:8192:32:lanes",
            "1:4096:16:lanes",
            "2:4096:8:lanes",
        ],  # fmt: skip
        help="one-pass configurations PER_SM:BLOCK:WARPS[:lanes]",
    )
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    from zebractl.model.ops.lm_head import _ce_fla
    from zebractl.model.ops.softmax_ce import ce_rows_

    torch.manual_seed(1234)
    x = torch.randn(a.rows, a.vocab, device="cuda").mul(3).bfloat16()
    y = torch.randint(0, a.vocab, (a.rows,), device="cuda")
    y[::97] = -100
    gib = x.numel() * x.element_size() / 2**30
    variants = {"fla": (lambda b: _ce_fla(b, y, -100), 3)}
    for spec in a.configs:
        k, blk, w, *rest = spec.split(":")
        lanes = rest == ["lanes"]
        name = f"one_pass_{k}_per_sm_block{blk}_warps{w}{'_lanes' if lanes else ''}"
        variants[name] = (
            lambda b, k=int(k), blk=int(blk), w=int(w), lanes=lanes: ce_rows_(
                b, y, -100, k, blk, w, lanes
            ),
            2,
        )
    rows = []
    ref = None
    for name, (fn, passes) in variants.items():
        ms, (loss, grad) = _time(fn, x, a.repeat)
        if ref is None:
            ref = (loss, grad)
        row = {
            "variant": name,
            "ms": round(ms, 4),
            "effective_gb_s": round(passes * gib * 2**30 / (ms / 1e3) / 1e9, 1),
            "loss_max_diff": (loss - ref[0]).abs().max().item(),
            "grad_max_diff": (grad.float() - ref[1].float()).abs().max().item(),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": a.rows,
        "vocab": a.vocab,
        "results": rows,
    }
    if a.json_out:
        a.json_out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
