"""``zebractl verify SOURCE CONVERTED``: is an export the checkpoint, tier by tier?

1. **structure**: every tensor the mapping produces is in the export exactly once with its shape, all
   in one dtype, nothing else; and ``config.json`` carries the model's values (a changed ``norm_eps``
   fails here).
2. **weights**: each exported tensor equals the checkpoint's, mapped and cast to the export dtype,
   bitwise; mapping the export back gives the checkpoint's tensors (cast) bitwise.
3. **logits**: on real text (the run's dataset), our model on the export's weights against the
   exported class loaded with ``from_pretrained``: fp32 on CPU (FLA's pure-PyTorch code), max
   |difference| / max |logit| at most :data:`LOGITS_RTOL_FP32`; or (``device="cuda"``) bf16 on
   the GPU with both models on their kernels, at most :data:`LOGITS_RTOL_BF16`.
4. **generation**: greedy decoding of ``gen_tokens`` tokens from a prompt of the same text agrees.

The first failing tier ends the check (later tiers are reported as not run).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zebractl.errors import ConfigError
from zebractl.schemas.reports import ModelVerifyReport, VerifyTier

LOGITS_RTOL_FP32 = 1e-5
"""Tier 3 on CPU in fp32: max |ours - theirs| / max |theirs|."""
MAX_TOKENS = 32768
"""Upper bound of ``--tokens`` (one CPU forward pass over them per model)."""
LOGITS_RTOL_BF16 = 2e-2
"""Tier 3 on a CUDA GPU in bf16 (both models on their GPU kernels)."""
TIERS = ("structure", "weights", "logits", "generation")


def _tier(name: str, status: str, detail: str, metrics: dict[str, Any] | None = None) -> VerifyTier:
    return VerifyTier(name=name, status=status, detail=detail, metrics=metrics or {})


def _fail(name: str, problems: list[str], **metrics: Any) -> VerifyTier:
    """A failed tier naming its first five problems."""
    shown = "; ".join(problems[:5]) + (
        f"; ... {len(problems) - 5} more" if len(problems) > 5 else ""
    )
    return _tier(name, "fail", shown, metrics)


def documents(cfg: Any, held_out: bool = False) -> Iterator[list[int]]:
    """The token ids of the run's documents, one list per document, in order: its training data,
    or (``held_out``) what it validated on: the validation shards `zebractl prepare
    --valid-fraction` wrote, else the part ``data.split`` carves out of each shard (megatron gives
    each dataset's documents in order to train, then valid, then test)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from zebractl.data.spec import resolve_data

    spec = resolve_data(cfg)
    if not spec.train:
        raise ConfigError("the run's dataset has no train shards (real text is read from it)")
    split = cfg.data.split
    if held_out and spec.valid:
        for shard in spec.valid:
            ds = IndexedDataset(shard.prefix)
            for i in range(len(ds)):
                yield [int(t) for t in ds[i]]
        return
    if held_out and (split is None or split[1] <= 0):
        raise ConfigError("the run held no data out (set data.split with a validation part)")
    for shard in spec.train:
        ds = IndexedDataset(shard.prefix)
        docs = range(len(ds))
        if held_out:
            total = sum(split)
            docs = range(
                int(round(len(ds) * split[0] / total)),
                int(round(len(ds) * (split[0] + split[1]) / total)),
            )
        for i in docs:
            yield [int(t) for t in ds[i]]


def real_tokens(cfg: Any, n: int, held_out: bool = False) -> torch.Tensor:
    """The first ``n`` tokens of the run's :func:`documents` (real text)."""
    out: list[int] = []
    for doc in documents(cfg, held_out):
        out += doc
        if len(out) >= n:
            return torch.tensor(out[:n], dtype=torch.long)[None]
    if len(out) < 2:
        raise ConfigError("verify: the run's dataset holds fewer than 2 tokens")
    return torch.tensor(out, dtype=torch.long)[None]


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaNs included, which ``torch.equal`` calls unequal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _greedy_ours(model: Any, prompt: torch.Tensor, n: int, vocab: int) -> list[int]:
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids)[:, -1, :vocab].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids[0, prompt.shape[1] :].tolist()


def verify_conversion(
    source: Path,
    converted: Path,
    *,
    tokens: int = 128,
    gen_tokens: int = 32,
    device: str = "auto",
    console: Callable[[str], None] = print,
    checkpoint: int | str | None = None,
) -> ModelVerifyReport:
    """Run the tiers (see the module docstring); the report holds one :class:`VerifyTier` each."""
    from zebractl.convert.hf import load_model, mla_rope, model_state, open_source
    from zebractl.hf import mapping
    from zebractl.hf.load import folder_format, read_safetensors

    device = _check_options(device, tokens, gen_tokens)
    converted = Path(converted)
    config = _read_config(converted)
    src = open_source(source, checkpoint)
    src.announce(console, "checking", f" against {converted}")
    m = src.cfg.model
    fmt = folder_format(config)
    if fmt == "fla":
        try:
            mapping.family(m)
        except mapping.MappingError as exc:
            raise ConfigError(f"verify: {exc}") from None
    theirs = read_safetensors(converted)
    model = load_model(src)
    ours, rope = model_state(model), mla_rope(model)
    del model
    expected = mapping.to_hf(ours, m, fmt, keep_padding=True)
    tiers = [_structure(config, m, fmt, rope, expected, theirs)]
    if tiers[-1].status == "pass":
        tiers.append(_weights(m, fmt, ours, expected, theirs))
    if tiers[-1].status == "pass":
        tiers += _forward(src, converted, fmt, theirs, device, tokens, gen_tokens)
    done = {t.name for t in tiers}
    tiers += [_tier(n, "not run", "an earlier tier failed") for n in TIERS if n not in done]
    failed = next((t for t in tiers if t.status == "fail"), None)
    return ModelVerifyReport(
        source=str(src.checkpoint.folder),
        converted=str(converted),
        ok=failed is None,
        first_failure=failed.name if failed else None,
        tiers=tiers,
    )


def _check_options(device: str, tokens: int, gen_tokens: int) -> str:
    """The device to run tiers 3 and 4 on (``auto`` resolved); usage errors raise."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(f"--device {device}: expected auto, cpu or cuda (with a CUDA GPU)")
    if not 2 <= tokens <= MAX_TOKENS or gen_tokens < 1:
        raise ConfigError(
            f"--tokens must be between 2 and {MAX_TOKENS} and the generation length at least 1"
        )
    return device


def _read_config(converted: Path) -> dict[str, Any]:
    """The ``config.json`` of the converted folder (usage error when absent or not JSON)."""
    import json

    if not (converted / "config.json").is_file():
        raise ConfigError(f"{converted}: no config.json (not a Hugging Face folder)")
    try:
        return json.loads((converted / "config.json").read_text())
    except ValueError as exc:
        raise ConfigError(f"{converted / 'config.json'}: not JSON ({exc})") from None


def _structure(
    config: dict[str, Any],
    m: Any,
    fmt: str,
    rope: dict[str, Any] | None,
    expected: dict[str, torch.Tensor],
    theirs: dict[str, torch.Tensor],
) -> VerifyTier:
    """Tier 1: keys, shapes, one export dtype, and the config's values."""
    from zebractl.convert.hf import DTYPES

    problems = [f"missing {k}" for k in sorted(set(expected) - set(theirs))]
    problems += [f"unexpected {k}" for k in sorted(set(theirs) - set(expected))]
    problems += [
        f"{k}: shape {list(theirs[k].shape)}, expected {list(v.shape)}"
        for k, v in expected.items()
        if k in theirs and theirs[k].shape != v.shape
    ]
    dtypes = {str(v.dtype) for v in theirs.values()}
    if len(dtypes) > 1:
        problems.append(f"mixed dtypes {sorted(dtypes)}")
    problems += _config_problems(config, m, fmt, rope)
    if problems:
        return _fail("structure", problems)
    dt = next(iter(theirs.values())).dtype if theirs else torch.float32
    if dt not in DTYPES.values():
        return _fail("structure", [f"dtype {dt} is not an export dtype"])
    return _tier(
        "structure", "pass", f"{len(theirs)} tensors, {dtypes.pop()}", {"tensors": len(theirs)}
    )


def _config_problems(
    config: dict[str, Any], m: Any, fmt: str, rope: dict[str, Any] | None
) -> list[str]:
    """How ``config.json`` differs from what the export of model ``m`` writes."""
    from zebractl.convert.hf import zebra_config
    from zebractl.hf import mapping
    from zebractl.hf.load import config_problems, model_differences

    if fmt != "fla":
        return [
            f"config.json {d}"
            for k, v in zebra_config(m, rope).items()
            for d in model_differences(config.get(k), v, f"{k}.")
        ]
    problems = []
    want_type = {"kda": "kda", "gdn": "gated_deltanet"}[mapping.family(m)]
    if config.get("model_type") != want_type:
        problems.append(
            f"config.json model_type is {config.get('model_type')!r}, expected {want_type!r}"
        )
    return problems + config_problems(config, mapping.fla_config(m, keep_padding=True))


def _weights(
    m: Any,
    fmt: str,
    ours: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    theirs: dict[str, torch.Tensor],
) -> VerifyTier:
    """Tier 2: every tensor bitwise in the export dtype, mapped both ways."""
    from zebractl.hf import mapping

    dt = next(iter(theirs.values())).dtype if theirs else torch.float32
    diff = [k for k, v in expected.items() if not _bitwise_equal(theirs[k], v.to(dt))]
    back = mapping.from_hf(theirs, m, fmt)
    for k, v in ours.items():
        if not _bitwise_equal(back[k], v.to(dt)):
            diff.append(f"{k} (round trip)")
    if diff:
        return _fail("weights", [f"{k} differs" for k in diff], differing=len(diff))
    return _tier("weights", "pass", f"bitwise in {str(dt).removeprefix('torch.')}, both directions")


@dataclass
class _Pair:
    """Our model on the export's weights and the exported class, ready for tiers 3 and 4."""

    ours: Any
    hf: Any
    """None when ``from_pretrained`` failed."""
    fla_context: Callable[[], Any]
    """The context the forwards run in (FLA's pure-PyTorch code for FLA's classes on CPU)."""
    device: str
    dtype: torch.dtype


def _load_pair(src: Any, converted: Path, fmt: str, theirs: dict, device: str) -> tuple[_Pair, str]:
    """Both models (see :class:`_Pair`); and why ``from_pretrained`` failed, or ``""``."""
    import contextlib

    from zebractl.hf import mapping
    from zebractl.model.model import build_model
    from zebractl.runtime.fla_cpu import on_cpu

    m = src.cfg.model
    gpu = device == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    backend = "auto" if gpu else "torch"
    kernels = src.cfg.kernels.model_copy(update={"backend": backend, "fp8_mlp": "off"})
    model = build_model(m, kernels=kernels, device=device, params_dtype=dtype).eval()
    model.load_state_dict(
        {k: v.to(dtype) for k, v in mapping.from_hf(theirs, m, fmt).items()}, strict=False
    )
    if fmt == "fla":
        from zebractl.runtime.fla_import import whole

        whole()  # registers FLA's classes with the auto classes
    else:
        import zebractl.hf  # noqa: F401 - registers ZebraForCausalLM with the auto classes
    from transformers import AutoModelForCausalLM

    # FLA's classes on CPU run through FLA's own pure-PyTorch code; ZebraForCausalLM picks its
    # backend from the device (zebractl's torch ops on CPU) by itself
    fla_context = contextlib.nullcontext if gpu or fmt == "zebra" else on_cpu
    error = ""
    try:
        hf = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype).to(device).eval()
    except Exception as exc:  # noqa: BLE001 - a folder transformers cannot load fails tier 3
        hf, error = None, f"from_pretrained failed: {exc}"
    return _Pair(model, hf, fla_context, device, dtype), error


def _forward(
    src: Any,
    converted: Path,
    fmt: str,
    theirs: dict[str, torch.Tensor],
    device: str,
    tokens: int,
    gen_tokens: int,
) -> list[VerifyTier]:
    """Tiers 3 and 4 on the run's real text (tier 4 only when tier 3 passed)."""
    ids = real_tokens(src.cfg, tokens).to(device)
    pair, error = _load_pair(src, converted, fmt, theirs, device)
    if error:
        return [_fail("logits", [error])]
    tiers = [_logits(pair, ids)]
    if tiers[-1].status == "pass":
        tiers.append(_generation(pair, ids, gen_tokens, src.cfg.model.padded_vocab_size, fmt))
    return tiers


def _logits(pair: _Pair, ids: torch.Tensor) -> VerifyTier:
    """Tier 3: max |ours - theirs| / max |theirs| on ``ids`` within the dtype's tolerance."""
    import math

    tol = LOGITS_RTOL_BF16 if pair.dtype == torch.bfloat16 else LOGITS_RTOL_FP32
    with torch.no_grad(), pair.fla_context():
        a = pair.ours(ids).float()
        b = pair.hf(input_ids=ids).logits.float()
    rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    device = pair.device
    metrics = {
        "max_rel_err": rel if math.isfinite(rel) else None,  # JSON has no NaN
        "tolerance": tol,
        "tokens": ids.shape[1],
        "device": device,
        "dtype": str(pair.dtype).removeprefix("torch."),
    }
    if rel <= tol:
        detail = f"max rel err {rel:.2e} on {ids.shape[1]} tokens ({device})"
        return _tier("logits", "pass", detail, metrics)
    return _fail("logits", [f"max rel err {rel:.2e} > {tol:.0e} ({device})"], **metrics)


def _generation(
    pair: _Pair, ids: torch.Tensor, gen_tokens: int, vocab: int, fmt: str
) -> VerifyTier:
    """Tier 4: greedy decoding of ``gen_tokens`` tokens from a prompt of ``ids`` agrees."""
    prompt = ids[:, : max(1, min(16, ids.shape[1] - 1))]
    mine = _greedy_ours(pair.ours, prompt, gen_tokens, vocab)
    with torch.no_grad(), pair.fla_context(), warnings.catch_warnings():
        # FLA 0.6.0's prepare_inputs_for_generation uses a keyword transformers deprecates
        warnings.simplefilter("ignore", FutureWarning)
        out = pair.hf.generate(
            prompt,
            max_new_tokens=gen_tokens,
            do_sample=False,
            # ZebraForCausalLM decodes with its cache (the path users take); FLA's
            # classes recompute (their cache on FLA's CPU code is not ours to test)
            use_cache=fmt == "zebra",
            min_new_tokens=gen_tokens,
            pad_token_id=0,
        )
    theirs_gen = out[0, prompt.shape[1] :].tolist()
    agree = next(
        (i for i, (x, y) in enumerate(zip(mine, theirs_gen, strict=False)) if x != y),
        min(len(mine), len(theirs_gen)),
    )  # tokens that agree before the first difference
    metrics = {"tokens": gen_tokens, "agreeing_prefix": agree}
    if mine == theirs_gen:
        return _tier("generation", "pass", f"{gen_tokens} greedy tokens agree", metrics)
    return _fail("generation", [f"greedy tokens differ from position {agree}"], **metrics)
