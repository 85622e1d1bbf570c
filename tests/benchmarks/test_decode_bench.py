"""benchmarks/decode_bench.py on CPU (its smoke): every implementation's row is measured (FLA's class
only on CUDA: recorded as that row's error), MLA's latent cache grows by exactly
``kv_lora_rank + qk_pos_emb_head_dim`` elements per token and MLA layer, a pure recurrent model's
cache not at all, and a spent --budget-s skips rows instead of failing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "decode_bench", ROOT / "benchmarks/decode_bench.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("decode_bench", mod)
    spec.loader.exec_module(mod)
    return mod


def _rows(tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "decode.json"
    assert (
        _bench().main(["--device", "cpu", "--new-tokens", "3", "--json-out", str(out), *args]) == 0
    )
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["dtype"] == "bf16"
    return doc["rows"]


def test_the_cpu_smoke_measures_every_implementation(tmp_path):
    from zebractl.config.resolve import resolve_preset

    rows = _rows(tmp_path, "--presets", "tiny_hybrid", "tiny_kda", "--contexts", "16", "40")
    assert len(rows) == 2 * len(_bench().IMPLS) * 2
    for r in rows:
        if r["impl"] == "fla":  # said once, then the model is not built again
            cpu = "RuntimeError: FLA's classes decode with a cache on CUDA only"
            assert r["error"] == (
                cpu if r["context"] == 16 else "skipped: the model could not be built"
            )
            continue
        assert r["error"] is None, r
        assert r["prefill_s"] > 0 and r["decode_tok_s"] > 0 and r["token_ms_median"] > 0, r
    a = resolve_preset("tiny_hybrid").config.mla
    engine = {(r["preset"], r["context"]): r for r in rows if r["impl"] == "engine"}
    for ctx in (16, 40):
        hybrid, kda = engine["tiny_hybrid", ctx], engine["tiny_kda", ctx]
        width = a.kv_lora_rank + a.qk_pos_emb_head_dim  # one MLA layer in tiny_hybrid, bf16
        assert hybrid["mla_elems_per_token_layer"] == hybrid["mla_bound"] == width
        assert hybrid["mla_ok"] is True and hybrid["cache_bytes_per_token"] == 2 * width
        assert kda["cache_bytes_per_token"] == 0 and "mla_ok" not in kda
    for r in rows:  # the same weights and prompt: the same greedy tokens (eager steps on a CPU)
        if r["impl"] == "engine_graph":
            ref = engine[r["preset"], r["context"]]
            assert len(r["tokens"]) == 3 and r["tokens"] == ref["tokens"], (r, ref)
            assert r["agree_with_engine"] == 3 and "graph" not in r  # no graph on a CPU
        if r["impl"] in ("engine", "llama"):
            assert "agree_with_engine" not in r
        if r["impl"].startswith("hf_generate"):  # generate(): the same positions, one fewer
            assert len(r["tokens"]) == 2 and 0 <= r["agree_with_engine"] <= 2, r
    for r in rows:  # hidden 64: one head of 64, one KV head; keys and values, 2 bytes each
        if r["impl"] == "llama":
            blocks = resolve_preset(r["preset"]).config.num_blocks
            assert r["cache_bytes_per_token"] == blocks * 2 * 64 * 2, r


def test_a_spent_budget_skips_the_rows(tmp_path):
    rows = _rows(tmp_path, "--presets", "tiny_kda", "--contexts", "16", "--budget-s", "0")
    assert [r["error"] for r in rows] == ["skipped: past --budget-s 0.0"] * len(_bench().IMPLS)


def test_agreement_counts_the_leading_tokens_the_eager_engine_chose_too():
    agree = _bench().agree
    rows = [{"impl": "engine", "preset": "p", "context": 8, "tokens": [5, 6, 7, 8]},
            {"impl": "engine", "preset": "p", "context": 16, "tokens": [1, 2, 3, 4]}]  # fmt: skip
    for impl, tokens, want in (("engine_graph", [5, 6, 9, 8], 2), ("fla", [5, 6, 7, 8], 4),
                               ("fla", [0, 6, 7, 8], 0)):  # fmt: skip
        row = {"impl": impl, "preset": "p", "context": 8, "tokens": tokens}
        agree(row, rows)
        assert row["agree_with_engine"] == want, (impl, tokens)
    lone = {"impl": "fla", "preset": "q", "context": 8, "tokens": [5]}
    agree(lone, rows)
    assert "agree_with_engine" not in lone  # no eager row to compare with
