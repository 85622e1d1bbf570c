"""The LM-head loss alone on one GPU: zebractl's chunked loss vs FLA 0.6.0's fused linear
cross-entropy (issue 12). Speed and weight-gradient accuracy, side by side in one process.

    python benchmarks/lm_head_bench.py --hidden 1024 --tokens 32768 131072

bf16 hidden states and weight (the Megatron engine's dtypes), vocabulary 128256, reduction sum,
forward + backward, median of --repeat runs (CUDA events), peak memory above the inputs. Variants:
FLA default (``accumulate_grad_in_fp32=True``), FLA with ``accumulate_grad_in_fp32=False``, FLA
default with TF32 switched on for the call only, and ours, each at 8 and 32 chunks. Accuracy (at the
smallest token count): relative L2 error of the weight gradient against an fp64 reference of the
same bf16 operands, computed chunk by chunk. One ``RESULT`` JSON line per variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

F = torch.nn.functional
V = 128256


def emit(**kw) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def reference_dw(
    x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, rows: int = 2048
) -> torch.Tensor:
    wd = w.double()
    dw = torch.zeros_like(wd)
    for s in range(0, x.shape[0], rows):
        xc = x[s : s + rows].double()
        logits = xc @ wd.t()
        p = torch.softmax(logits, -1)
        p[torch.arange(p.shape[0], device=p.device), y[s : s + rows]] -= 1
        dw += p.t() @ xc
        del logits, p
    return dw


def variants():
    from fla.modules.fused_linear_cross_entropy.ops import fused_linear_cross_entropy_loss as flce

    from zebractl.model.ops.lm_head import linear_cross_entropy

    def fla(acc32: bool, chunks: int, tf32: bool = False):
        def run(x, w, y):
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                return flce(
                    x, y, w, num_chunks=chunks, reduction="sum", accumulate_grad_in_fp32=acc32
                )
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old

        return run

    def ours(chunks: int):
        return lambda x, w, y: linear_cross_entropy(x, w, y, num_chunks=chunks, ce_kernel="fla")

    for chunks in (8, 32):
        yield f"fla_default_nc{chunks}", fla(True, chunks)
        yield f"fla_bf16acc_nc{chunks}", fla(False, chunks)
        yield f"fla_tf32_nc{chunks}", fla(True, chunks, tf32=True)
        yield f"ours_nc{chunks}", ours(chunks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    emit(
        env="versions",
        torch=torch.__version__,
        device=torch.cuda.get_device_name(),
        tf32_default=torch.backends.cuda.matmul.allow_tf32,
    )
    for n in a.tokens:
        x = (torch.randn(n, a.hidden, device="cuda") * 1.0).bfloat16()
        w = (torch.randn(V, a.hidden, device="cuda") * 0.02).bfloat16()
        y = torch.randint(0, V, (n,), device="cuda")
        ref = reference_dw(x, w, y) if n == min(a.tokens) else None
        for name, fn in variants():
            wg = w.detach().clone().requires_grad_()
            xg = x.detach().clone().requires_grad_()

            def step(fn=fn, xg=xg, wg=wg, y=y):
                wg.grad = xg.grad = None
                fn(xg, wg, y).backward()

            step()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(a.repeat):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                step()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            row = {
                "check": "lm_head",
                "variant": name,
                "tokens": n,
                "hidden": a.hidden,
                "vocab": V,
                "ms": round(statistics.median(times), 2),
                "peak_extra_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 3),
            }
            if ref is not None:
                d = wg.grad.double()
                row["dw_rel_err_vs_fp64"] = ((d - ref).norm() / ref.norm()).item()
            emit(**row)
            del wg, xg
            torch.cuda.empty_cache()
        del x, w, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
