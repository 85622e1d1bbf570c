"""Decode speed and memory at long contexts (issue 43): zebractl's cached decode beside FLA's own
class, a dense Llama and our Hugging Face export's plain ``generate()``.

    python benchmarks/decode_bench.py --presets kda_300M zebra_mamba_1B_hybrid_1gpu \
        --contexts 1024 8192 32768 --new-tokens 64 --json-out decode.json
    python benchmarks/decode_bench.py --device cpu --presets tiny_kda --contexts 64 128 \
        --new-tokens 4                                     # the CPU smoke (tests/benchmarks)

Each model is built from a preset (or a recipe's preset) with random weights: zebractl's own init
(``build_model``, seeded), exported in memory to ``ZebraForCausalLM`` as ``zebractl convert --format
zebra`` would, cast whole to --dtype (as ``zebractl generate --dtype`` loads it). Implementations:

- ``engine``: :class:`zebractl.generate.engine.Decoder` (what ``zebractl generate`` runs): its cache
  made for the whole generation, recurrent states stepped by FLA's fused recurrent kernels on CUDA,
  MLA's latent cache with absorbed decode, only the last position's logits. ``engine_graph``: the
  same with its one-token steps replayed as a CUDA graph (``zebractl generate --cuda-graph``).
- ``fla``: FLA's ``KDAForCausalLM`` / ``GatedDeltaNetForCausalLM`` (pure KDA/GDN presets only) from
  the same weights (``mapping.to_fla``), FLA's fusions as FLA ships them, its own cache; CUDA only.
- ``llama``: transformers' ``LlamaForCausalLM`` of the same width, depth, MLP and vocabulary (head dim
  64, ``--llama-kv-heads``, default a quarter of the heads as Llama 3), random weights, a
  ``StaticCache`` for the whole generation.
- ``hf_generate``: the export's plain ``model.generate()`` through transformers (greedy; the prompt
  in one piece; per-token times from a streamer). ``hf_generate_before``: the same with the export's
  class as it was before the generation cache (``benchmarks/baselines/hf_modeling_55bdf6d.py``:
  MLA's full keys and values concatenated every step), the same weights.

A row: a random prompt of ``context`` tokens prefilled (in pieces of --prefill-chunk, but
``hf_generate``), --warmup greedy tokens, then --new-tokens greedy tokens each timed to a
``torch.cuda.synchronize``. Columns: prefill seconds, decode tokens/s (new tokens / their total
time), median ms per token, peak GPU memory (GiB, weights included), the cache's growth per token
in bytes (the rows MLA's latent buffers hold, not their preallocated size; a static KV cache's size
over its length) and, for MLA, its growth in elements per token and MLA layer against
``kv_lora_rank + qk_pos_emb_head_dim``. A failing row (out of memory, say) records its error and
the bench goes on; rows after --budget-s are skipped. A table goes to stdout, --json-out gets all.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

IMPLS = ("engine", "engine_graph", "fla", "llama", "hf_generate", "hf_generate_before")
BEFORE = Path(__file__).resolve().parent / "baselines" / "hf_modeling_55bdf6d.py"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def model_config(name: str) -> Any:
    """A preset's ModelConfig (a recipe's preset for a recipe name)."""
    from zebractl.config.resolve import resolve_ref

    r = resolve_ref(name)
    return r.run.model if r.kind == "recipe" else r.config


def build_ours(m: Any, device: str, dtype: torch.dtype, seed: int) -> Any:
    """``ZebraForCausalLM`` with zebractl's seeded init, as the in-memory export makes it."""
    import zebractl.hf as zh
    from zebractl.convert.hf import mla_rope
    from zebractl.hf import mapping
    from zebractl.model.model import build_model
    from zebractl.schemas.recipe import KernelsConfig

    kernels = KernelsConfig(backend="auto" if device.startswith("cuda") else "torch")
    ours = build_model(m, kernels=kernels, device=device, seed=seed)
    sd = {k: v.detach() for k, v in ours.state_dict().items() if not k.endswith("_extra_state")}
    theirs = mapping.to_hf(sd, m, "zebra", keep_padding=True)
    config = zh.ZebraConfig(zebractl_model=m.model_dump(mode="json"), mla_rope=mla_rope(ours))
    with torch.device(device):
        hf = zh.ZebraForCausalLM(config)
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"export: missing {missing}, unexpected {unexpected}")
    del ours, sd, theirs
    return hf.to(dtype).eval()


def build_before(ours: Any) -> Any:
    """The export's class before the generation cache (:data:`BEFORE`) with ``ours``' weights."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_modeling_55bdf6d", BEFORE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    device, dtype = next(ours.parameters()).device, next(ours.parameters()).dtype
    with torch.device(device):
        model = mod.ZebraForCausalLM(ours.config)
    missing, unexpected = model.load_state_dict(ours.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"before: missing {missing}, unexpected {unexpected}")
    return model.to(dtype).eval()


def build_fla(m: Any, ours: Any, device: str, dtype: torch.dtype) -> Any:
    """FLA's class of a pure KDA/GDN preset with ``ours``' weights, FLA's fusions as shipped."""
    import fla.models as fm

    from zebractl.hf import mapping

    fam = mapping.family(m)  # a MappingError for hybrids: recorded as the row's error
    sd = mapping.to_fla(mapping.from_hf(ours.state_dict(), m, "zebra"), m, keep_padding=True)
    cfg = mapping.fla_config(m, keep_padding=True)
    for key in ("fuse_norm", "fuse_swiglu", "fuse_cross_entropy", "fuse_linear_cross_entropy"):
        cfg.pop(key, None)  # FLA's defaults
    conf, cls = {
        "kda": (fm.KDAConfig, fm.KDAForCausalLM),
        "gdn": (fm.GatedDeltaNetConfig, fm.GatedDeltaNetForCausalLM),
    }[fam]
    with torch.device(device):
        model = cls(conf(**cfg))
    model = model.to(dtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"FLA load: missing {missing}, unexpected {unexpected}")
    return model.eval()


def build_llama(m: Any, device: str, dtype: torch.dtype, kv_heads: int | None, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, m.hidden_size // 64)
    kv = kv_heads or max(1, heads // 4)
    cfg = LlamaConfig(
        vocab_size=m.padded_vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_blocks,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=m.hidden_size // heads,
        max_position_embeddings=m.max_position_embeddings,
        rms_norm_eps=m.norm.eps,
        tie_word_embeddings=m.tie_embeddings,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def _cache_arg(model: Any) -> str:
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Stepper:
    """Prefill and greedy steps of one implementation; ``held()``: the cache's bytes now."""

    def __init__(self, impl: str, model: Any, capacity: int) -> None:
        self.impl, self.model, self.seen = impl, model, 0
        self.device = next(model.parameters()).device
        if impl.startswith("engine"):
            from zebractl.generate.engine import Decoder

            self.dec = Decoder(model, capacity + 1, cuda_graph=impl == "engine_graph")
            self.dec.reset(capacity)
            return
        self.key, self.cache = _cache_arg(model), None
        if impl == "llama":
            from transformers import StaticCache

            self.cache = StaticCache(config=model.config, max_cache_len=capacity)

    @torch.inference_mode()
    def feed(self, ids: list[int]) -> int:
        """Run ``ids``; the greedy next token."""
        if self.impl.startswith("engine"):
            return int(self.dec.feed(ids).argmax())
        x = torch.tensor([ids], device=self.device)
        kw: dict[str, Any] = {self.key: self.cache, "use_cache": True, "logits_to_keep": 1}
        if self.impl == "llama":
            pos = torch.arange(self.seen, self.seen + len(ids), device=self.device)
            kw["position_ids"] = pos[None]
            if "cache_position" in __import__("inspect").signature(self.model.forward).parameters:
                kw["cache_position"] = pos
        out = self.model(input_ids=x, **kw)
        if self.impl != "llama":
            self.cache = out.get("past_key_values", out.get("cache"))
        self.seen += len(ids)
        return int(out.logits[0, -1].argmax())

    def held(self) -> tuple[int, dict[str, int]]:
        """(bytes the cache holds, MLA latent rows held per layer); a static cache counts whole."""
        if self.impl.startswith("engine"):
            total, rows = 0, {}
            for i, layer in enumerate(self.dec.cache.layers):
                for k, v in layer.items():
                    if not isinstance(v, torch.Tensor):
                        continue
                    if k == "latent":  # the rows written so far, not the buffer
                        rows[i] = layer["latent_len"]
                        total += v.shape[0] * rows[i] * v.shape[2] * v.element_size()
                    else:
                        total += v.numel() * v.element_size()
            return total, rows
        return tensor_bytes(self.cache), {}


def tensor_bytes(obj: Any, seen: set | None = None) -> int:
    """The bytes of every distinct tensor reachable from ``obj`` (lists, dicts, attributes)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = (obj.data_ptr(), obj.numel())
        if key in seen or obj.device.type == "meta":
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if id(obj) in seen or isinstance(obj, str | bytes | int | float | bool | type(None)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple | set):
        return sum(tensor_bytes(v, seen) for v in obj)
    return sum(tensor_bytes(v, seen) for v in getattr(obj, "__dict__", {}).values())


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure(impl: str, model: Any, m: Any, prompt: list[int], args: Any) -> dict[str, Any]:
    """One row's numbers (see the module docstring)."""
    n, w = args.new_tokens, args.warmup
    st = Stepper(impl, model, len(prompt) + w + n + 1)
    sync(st.device)
    t0 = time.perf_counter()
    for s in range(0, len(prompt), args.prefill_chunk):
        tok = st.feed(prompt[s : s + args.prefill_chunk])
    sync(st.device)
    prefill = time.perf_counter() - t0
    for _ in range(w):
        tok = st.feed([tok])
    held0, rows0 = st.held()
    times, tokens = [], []
    for _ in range(n):
        t = time.perf_counter()
        tok = st.feed([tok])
        sync(st.device)
        times.append(time.perf_counter() - t)
        tokens.append(tok)
    held1, rows1 = st.held()
    row: dict[str, Any] = {
        "prefill_s": prefill,
        "decode_tok_s": n / sum(times),
        "token_ms_median": 1e3 * statistics.median(times),
        "cache_bytes_per_token": (held1 - held0) / n,
        "tokens": tokens,
    }
    g = getattr(getattr(st, "dec", None), "graphed", None)
    if g is not None:  # what the CUDA graph did (failed: every step ran eagerly)
        row["graph"] = {"captures": g.captures, "replays": g.replays,
                        "eager_steps": g.eager_steps, "failed": g.failed}  # fmt: skip
    if impl == "llama":  # preallocated for its whole length: its keys and values per position
        kv = [t for layer in st.cache.layers for t in (layer.keys, layer.values)]
        row["cache_bytes_per_token"] = sum(t.numel() * t.element_size() / t.shape[-2] for t in kv)
    if rows1:
        width = m.mla.kv_lora_rank + m.mla.qk_pos_emb_head_dim
        per_layer = [(rows1[i] - rows0[i]) * st.dec.cache.layers[i]["latent"].shape[2] / n
                     for i in rows1]  # fmt: skip
        row |= {"mla_elems_per_token_layer": max(per_layer), "mla_bound": width,
                "mla_ok": max(per_layer) <= width}  # fmt: skip
    return row


class _Clock:
    """A ``generate()`` streamer: the time of each token it is handed (the prompt first)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stamps = device, []

    def put(self, value: Any) -> None:
        sync(self.device)
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def measure_generate(model: Any, prompt: list[int], args: Any) -> dict[str, Any]:
    """``model.generate()`` greedily for warmup + new tokens, timed by a streamer."""
    dev = next(model.parameters()).device
    clock, total = _Clock(dev), args.warmup + args.new_tokens
    x = torch.tensor([prompt], device=dev)
    sync(dev)
    t0 = time.perf_counter()
    with torch.inference_mode():
        seq = model.generate(input_ids=x, max_new_tokens=total, min_new_tokens=total,
                             do_sample=False, streamer=clock, pad_token_id=0)  # fmt: skip
    gaps = [b - a for a, b in zip(clock.stamps[1:], clock.stamps[2:], strict=False)]
    times = gaps[args.warmup :]  # stamps: the prompt, then each new token
    return {
        "prefill_s": clock.stamps[1] - t0,
        "decode_tok_s": len(times) / sum(times) if times else None,
        "token_ms_median": 1e3 * statistics.median(times) if times else None,
        # the engine's timed tokens begin one later (its first comes with the prefill): aligned
        "tokens": seq[0, len(prompt) + args.warmup + 1 :].tolist(),
    }


def build(impl: str, m: Any, ours: Any, args: argparse.Namespace) -> Any:
    dev, dtype = args.device, DTYPES[args.dtype]
    if impl in ("engine", "engine_graph", "hf_generate"):
        return ours
    if impl == "hf_generate_before":
        return build_before(ours)
    if impl == "fla":
        if not dev.startswith("cuda"):
            raise RuntimeError("FLA's classes decode with a cache on CUDA only")
        return build_fla(m, ours, dev, dtype)
    return build_llama(m, dev, dtype, args.llama_kv_heads, args.seed)


def one(
    impl: str, model: Any, m: Any, prompt: list[int], args: Any, n: int, chunk: int = 0
) -> dict[str, Any]:
    a = argparse.Namespace(**{**vars(args), "new_tokens": n})
    a.prefill_chunk = chunk or a.prefill_chunk
    if impl.startswith("hf_generate"):
        return measure_generate(model, prompt, a)
    return measure(impl, model, m, prompt, a)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cuda = args.device.startswith("cuda")
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for preset in args.presets:
        m, gen = model_config(preset), torch.Generator().manual_seed(args.seed)
        ours: Any = None  # False: it could not be built
        for impl in args.impls:
            model: Any = None
            for ctx in args.contexts:
                row = {"preset": preset, "impl": impl, "context": ctx,
                       "new_tokens": args.new_tokens, "error": None}  # fmt: skip
                rows.append(row)
                if time.perf_counter() - start > args.budget_s:
                    row["error"] = f"skipped: past --budget-s {args.budget_s}"
                    continue
                if model is False or ours is False:
                    row["error"] = "skipped: the model could not be built"
                    continue
                try:
                    if ours is None:
                        ours = False
                        ours = build_ours(m, args.device, DTYPES[args.dtype], args.seed)
                    if model is None:
                        model = False
                        model = build(impl, m, ours, args)
                        # compile/tune the kernels: a prompt in pieces (a carried state) too
                        warm = torch.randint(0, m.vocab_size, (min(300, ctx),), generator=gen)
                        one(impl, model, m, warm.tolist(), args, 2, chunk=128)
                    # the same prompt for every implementation of a preset at this context
                    fixed = torch.Generator().manual_seed(args.seed + ctx)
                    prompt = torch.randint(0, m.vocab_size, (ctx,), generator=fixed).tolist()
                    if cuda:
                        gc.collect()
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                    row |= one(impl, model, m, prompt, args, args.new_tokens)
                    agree(row, rows)
                    if cuda:  # this model's weights and what its generation took
                        weights = sum(p.numel() * p.element_size() for p in model.parameters())
                        peak = torch.cuda.max_memory_allocated() - base + weights
                        row["peak_gib"] = peak / 2**30
                except Exception as exc:  # noqa: BLE001 - a row's failure is its result
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    if args.verbose:
                        traceback.print_exc()
                print(fmt_row(row), flush=True)
            model = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        ours = None
    return rows


def agree(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``agree_with_engine``: how many of the row's greedy tokens, from the start, the eager engine
    chose too for the same preset, context and prompt (the same weights: ``engine_graph``,
    ``fla``, ``hf_generate``; bf16 near-ties may part them after a while)."""
    if row["impl"] in ("engine", "llama") or "tokens" not in row:
        return
    ref = next((r for r in rows if r["impl"] == "engine" and r["preset"] == row["preset"]
                and r["context"] == row["context"] and r.get("tokens")), None)  # fmt: skip
    if ref is None:
        return
    same = 0
    for a, b in zip(ref["tokens"], row["tokens"], strict=False):
        if a != b:
            break
        same += 1
    row["agree_with_engine"] = same


COLUMNS = [("preset", 28, "{}"), ("impl", 12, "{}"), ("context", 8, "{}"),
           ("new_tokens", 5, "{}"), ("prefill_s", 9, "{:.3f}"), ("decode_tok_s", 10, "{:.1f}"),
           ("token_ms_median", 9, "{:.2f}"), ("peak_gib", 8, "{:.2f}"),
           ("cache_bytes_per_token", 12, "{:.0f}"), ("mla_elems_per_token_layer", 8, "{:.0f}"),
           ("agree_with_engine", 5, "{}")]  # fmt: skip
HEADER = "  ".join(f"{h[:w]:>{w}}" for h, w, _ in COLUMNS)


def fmt_row(row: dict[str, Any]) -> str:
    cells = []
    for key, width, spec in COLUMNS:
        v = row.get(key)
        cells.append(f"{'-' if v is None else spec.format(v):>{width}}")
    line = "  ".join(cells)
    return f"{line}  {row['error']}" if row.get("error") else line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["kda_300M", "zebra_mamba_1B_hybrid_1gpu"])
    ap.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    ap.add_argument("--contexts", nargs="+", type=int, default=[1024, 8192, 32768])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2, help="untimed tokens after the prefill")
    ap.add_argument("--prefill-chunk", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--llama-kv-heads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--budget-s", type=float, default=float("inf"))
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks of failed rows")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here (use --device cpu)")
    print(HEADER, flush=True)
    rows = run(args)
    meta = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "dtype": args.dtype, "torch": torch.__version__, "args": {
                k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}  # fmt: skip
    for mod in ("fla", "transformers"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            meta[mod] = None
    if args.json_out:
        args.json_out.write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))
    print(f"\n{len([r for r in rows if not r['error']])}/{len(rows)} rows measured", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
