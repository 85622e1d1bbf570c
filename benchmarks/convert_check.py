"""Conversion on a real run (issue 13): time and host memory of `convert`, then the same loss from our
model and from the exported Hugging Face class on the run's own tokens.

    python benchmarks/convert_check.py RUN OUT [--dtype bf16] [--sequences 8] [--seq 2048]

Exports RUN to OUT (``zebractl.convert.hf.export_hf``; seconds and peak RSS recorded), then computes
the mean token cross-entropy over ``--sequences`` windows of ``--seq`` tokens of the run's data
(``--held-out``: of its validation split, when the run set ``data.split``) with
(a) our model on the checkpoint's weights and (b) ``AutoModelForCausalLM.from_pretrained(OUT)``: on a
CUDA GPU in bf16 on both stacks' kernels, on CPU in fp32 through FLA's references. Prints one
``RESULT`` JSON line; ``--json-out`` writes it too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--json-out", type=Path)
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="the last documents of each shard: held out from training when the run set data.split "
        "with a validation part (megatron splits each dataset's documents in order)",
    )
    a = ap.parse_args()

    from zebractl.config.errors import ConfigError
    from zebractl.convert.hf import export_hf, load_state, open_source
    from zebractl.convert.verify import real_tokens
    from zebractl.model.model import build_model
    from zebractl.runtime.fla_cpu import on_cpu

    src = open_source(a.run)
    try:  # before the export: a run that held nothing out is refused at once
        ids = real_tokens(src.cfg, a.sequences * (a.seq + 1), held_out=a.held_out)
    except ConfigError as exc:
        sys.exit(f"{a.run}: {exc}")
    res = export_hf(a.run, a.out, dtype=a.dtype)
    m = src.cfg.model
    gpu = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    n = ids.shape[1] // (a.seq + 1)
    batch = ids[0, : n * (a.seq + 1)].view(n, a.seq + 1).to(dev)
    x, y = batch[:, :-1], batch[:, 1:]

    kernels = src.cfg.kernels.model_copy(
        update={"backend": "auto" if gpu else "torch", "fp8_mlp": "off"}
    )
    ours = build_model(m, kernels=kernels, device=dev, params_dtype=dtype).eval()
    ours.load_state_dict({k: v.to(dtype) for k, v in load_state(src).items()}, strict=False)
    if res.format == "fla":
        import fla  # noqa: F401 - registers FLA's classes
    else:
        import zebractl.hf  # noqa: F401 - registers ZebraForCausalLM
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(a.out, dtype=dtype).to(dev).eval()
    ref = contextlib.nullcontext if gpu or res.format == "zebra" else on_cpu

    def loss(logits: torch.Tensor) -> float:
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()

    with torch.no_grad(), ref():
        t0 = time.perf_counter()
        ours_loss = loss(torch.cat([ours(x[i : i + 1]) for i in range(n)]))
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        hf_loss = loss(torch.cat([hf(input_ids=x[i : i + 1]).logits for i in range(n)]))
        t_hf = time.perf_counter() - t0
    row = {
        "check": "convert",
        "run": str(a.run),
        "architecture": res.architecture,
        "format": res.format,
        "iteration": res.iteration,
        "dtype": a.dtype,
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "convert_s": round(res.seconds, 2),
        "convert_peak_rss_gib": round(res.peak_rss_gib or 0.0, 3),
        "bytes": res.bytes,
        "sequences": n,
        "tokens_from": "held-out split" if a.held_out else "first training tokens",
        "seq": a.seq,
        "loss_ours": ours_loss,
        "loss_hf": hf_loss,
        "rel_diff": abs(ours_loss - hf_loss) / abs(ours_loss),
        "eval_s_ours": round(t_ours, 2),
        "eval_s_hf": round(t_hf, 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    print("RESULT " + json.dumps(row), flush=True)
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
