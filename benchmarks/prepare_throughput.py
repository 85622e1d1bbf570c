"""Tokens/s of `zebractl prepare` with 1 and 2 workers beside a plain `tokenizers` baseline.

Same text (the demo corpus: State of the Union + Wikipedia leads, 10,282 documents, repeated
``--copies`` times and split into 4 JSONL files), same tokenizer (GPT-2 BPE), one machine, all runs interleaved in one invocation, median of
``--repeats`` rounds:

- baseline: ``Tokenizer.encode_batch_fast`` over all texts already in memory, in this process,
  single-threaded (``TOKENIZERS_PARALLELISM=false``: one core, like one prepare worker); the Rust
  multi-threaded figure is reported beside it for reference;
- prepare: the full command end to end (read JSONL, tokenize, write .bin/.idx, hash, manifest) into a
  fresh folder, timed from the library call, so interpreter start-up is excluded but worker start-up
  is not.

Per-worker ratio = prepare tokens/s / (workers x baseline tokens/s). Target >= 0.8.

    python benchmarks/prepare_throughput.py --repeats 3 --json-out benchmarks/results/....json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zebractl.data import demo  # noqa: E402
from zebractl.data.prepare import PrepareOptions, prepare  # noqa: E402

BASELINE = """
import json, os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = sys.argv[2]
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
d = sys.argv[1]
tok = Tokenizer(models.BPE.from_file(d + "/encoder.json", d + "/vocab.bpe"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
texts = [json.loads(line)["text"] for p in sys.argv[3:] for line in open(p, encoding="utf-8")]
start = time.perf_counter()
n = 0
for i in range(0, len(texts), 256):
    n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + 256], add_special_tokens=False))
print(json.dumps({"tokens": n, "seconds": time.perf_counter() - start}))
"""


def _baseline(files: list[Path], parallel: bool) -> dict:
    # a fresh process: the parallelism setting must be in place before tokenizers first runs
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            BASELINE,
            str(demo.tokenizer_dir()),
            "true" if parallel else "false",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def _prepare(files: list[Path], workers: int, tmp: Path) -> dict:
    out = tmp / f"out-{workers}-{time.time_ns()}"
    opts = PrepareOptions(
        inputs=tuple(map(str, files)),
        tokenizer=str(demo.tokenizer_dir()),
        output=str(out),
        add_eos=False,
        shard_bytes=1,
    )
    start = time.perf_counter()
    manifest = prepare(opts, workers=workers)
    seconds = time.perf_counter() - start
    shutil.rmtree(out)
    return {"tokens": manifest["totals"]["tokens"], "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--copies", type=int, default=3, help="times the demo corpus is repeated")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    sources = demo.write_sources(tmp / "sources")
    rows = [line for p in sources for line in p.read_text(encoding="utf-8").splitlines()]
    rows = rows * args.copies  # a larger input amortises start-up as real corpora do
    files = []
    for i in range(4):  # 4 input files so 2 workers both have work
        f = tmp / f"part{i}.jsonl"
        f.write_text("\n".join(rows[i::4]) + "\n", encoding="utf-8")
        files.append(f)
    runs: dict[str, list[dict]] = {
        "baseline_1thread": [],
        "baseline_rayon": [],
        "prepare_1": [],
        "prepare_2": [],
    }
    for _ in range(args.repeats):
        runs["baseline_1thread"].append(_baseline(files, parallel=False))
        runs["baseline_rayon"].append(_baseline(files, parallel=True))
        runs["prepare_1"].append(_prepare(files, 1, tmp))
        runs["prepare_2"].append(_prepare(files, 2, tmp))
    rate = {k: statistics.median(r["tokens"] / r["seconds"] for r in v) for k, v in runs.items()}
    base = rate["baseline_1thread"]
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "corpus": {
            "documents": len(rows),
            "files": len(files),
            "copies": args.copies,
            "tokens": runs["prepare_1"][0]["tokens"],
        },
        "repeats": args.repeats,
        "tokens_per_s": {k: round(v) for k, v in rate.items()},
        "per_worker_ratio": {
            "1_worker": round(rate["prepare_1"] / base, 3),
            "2_workers": round(rate["prepare_2"] / (2 * base), 3),
        },
        "raw": runs,
    }
    shutil.rmtree(tmp)
    text = json.dumps(result, indent=2)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
