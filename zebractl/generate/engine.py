"""Token generation from a loaded causal LM with its cache: prefill once, then one token per step.

:class:`Decoder` owns the model and its generation cache and feeds it tokens: a Zebra model
(:class:`zebractl.hf.modeling.ZebraForCausalLM`) keeps a :class:`~zebractl.hf.modeling.ZebraCache`
made for the whole generation up front (fixed-size recurrent states, MLA's compressed latents in
preallocated buffers), and only the last position's logits are computed; any other Hugging Face
causal LM (FLA's classes) keeps the cache its forward returns; FLA's classes on a CPU run through
FLA's reference code, which keeps no state, so each token recomputes the whole sequence there. :func:`generate` samples from it
(:func:`pick`: greedy at temperature 0, else temperature / top-k / top-p with a seeded generator),
streams the text as it grows (never half a character) and stops at the end-of-sequence token, a
stop text, the token budget or the model's last position.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from zebractl.generate.options import Sampling

Tensor = torch.Tensor


def pick(logits: Tensor, s: Sampling, gen: torch.Generator | None) -> int:
    """The next token from one position's logits ``[V]``: the argmax at temperature 0; otherwise a
    draw from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
    (0: all) and then to the smallest set whose probability reaches ``top_p``."""
    if s.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / s.temperature
    if 0 < s.top_k < scaled.numel():
        kth = torch.topk(scaled, s.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # probability of the tokens ranked above
        sorted_p = sorted_p.masked_fill(before >= s.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


class Decoder:
    """A causal LM and its cache: :meth:`feed` tokens, get the logits after the last one."""

    def __init__(
        self,
        model: Any,
        max_positions: int,
        context: Callable[[], Any] | None = None,
        cached: bool = True,
        cuda_graph: bool = False,
    ) -> None:
        self.model = model
        self.context = context or contextlib.nullcontext  # around every forward
        self.cached = cached  # False: every feed recomputes the whole sequence (no cache)
        self._history: list[int] = []
        self.max_positions = max_positions
        self.device = next(model.parameters()).device
        self.zebra = type(model).__name__ == "ZebraForCausalLM"
        self.seen = 0
        self.fed = 0  # tokens fed since the last reset (prefill accounting)
        self._cache: Any = None
        self.graphed: Any = None
        """A Zebra model's one-token steps as a CUDA graph (:mod:`zebractl.generate.graph`), with
        ``cuda_graph`` on a CUDA device; None otherwise."""
        if cuda_graph and self.zebra and cached and self.device.type == "cuda":
            from zebractl.generate.graph import GraphedDecode

            self.graphed = GraphedDecode(model)

    def reset(self, capacity: int = 0) -> None:
        """Forget everything fed; a Zebra cache is made for ``capacity`` tokens."""
        self.seen = 0
        self._cache = None
        self._history = []
        if self.zebra:
            from zebractl.hf.modeling import ZebraCache

            self._cache = ZebraCache(len(self.model.model.layers), capacity)

    @torch.inference_mode()
    def feed(self, ids: list[int]) -> Tensor:
        """Run ``ids`` after everything fed so far; the fp32 logits ``[V]`` after the last one."""
        if not ids:
            raise ValueError("feed: no tokens")
        if self._cache is None and self.zebra and self.cached:
            self.reset(len(ids))
        if self.graphed is not None and len(ids) == 1 and self.seen > 0:
            with self.context():
                logits = self.graphed.step(self._cache, ids[0])
            self.seen += 1
            self.fed += 1
            return logits
        if not self.cached:
            self._history += ids
            ids = self._history
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        with self.context():
            if not self.cached:
                out = self.model(input_ids=x, use_cache=False)
            elif self.zebra:
                out = self.model(
                    input_ids=x, past_key_values=self._cache, use_cache=True, logits_to_keep=1
                )
            else:
                out = self.model(input_ids=x, past_key_values=self._cache, use_cache=True)
                self._cache = out.get("past_key_values", out.get("cache"))
        self.seen = len(self._history) if not self.cached else self.seen + x.shape[1]
        self.fed += x.shape[1]
        return out.logits[0, -1].float()

    def snapshot(self) -> Any:
        """A point to :meth:`restore` to (None where the model's cache cannot: not ours)."""
        if self.zebra and self.cached and self._cache is not None:
            return (self.seen, self._cache.snapshot())
        return None

    def restore(self, snap: Any) -> None:
        self.seen = snap[0]
        self._cache.restore(snap[1])

    @property
    def cache(self) -> Any:
        """The generation cache (a ZebraCache for our models)."""
        return self._cache


@dataclass
class Generated:
    """One generation: the new tokens and text, why it stopped, and its timings."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "length"  # eos | stop | length | max_positions | interrupted
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    unfed: list[int] = field(default_factory=list)
    """Tokens chosen but not yet run through the model (the last one, or the end-of-sequence
    token that stopped it): a continuation feeds them first."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    dec: Decoder,
    tokenizer: Any,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    stop: list[str] | None = None,
    stop_ids: set[int] | None = None,
    on_text: Callable[[str], None] | None = None,
    fresh: bool = True,
    on_prefill: Callable[[], None] | None = None,
) -> Generated:
    """Sample up to ``max_new_tokens`` after ``prompt_ids`` (after what ``dec`` holds unless
    ``fresh``), streaming each new piece of text to ``on_text``. Stops at a token of ``stop_ids``
    (the tokenizer's end of sequence by default; not part of the text), at the first ``stop`` text
    (cut there), or at the model's last position. A KeyboardInterrupt ends it with what it has
    (``stop_reason`` interrupted) after the callback saw all of it. ``on_prefill`` is called once
    the prompt has run, before the first token is chosen."""
    gen = torch.Generator().manual_seed(sampling.seed)
    ends = stop_ids if stop_ids is not None else eos_ids(tokenizer)
    out = Generated(prompt_tokens=len(prompt_ids))
    if fresh:
        dec.reset(len(prompt_ids) + max_new_tokens)
    t0 = time.perf_counter()
    t1: float | None = None  # the decode's start, once the prompt has run
    emitted = 0
    try:
        logits = dec.feed(prompt_ids)
        _sync(dec.device)
        out.prefill_seconds = time.perf_counter() - t0
        if on_prefill is not None:
            on_prefill()
        t1 = time.perf_counter()
        while len(out.ids) < max_new_tokens:
            token = pick(logits, sampling, gen)
            if token in ends:
                out.stop_reason, out.unfed = "eos", [token]
                break
            out.ids.append(token)
            text = tokenizer.decode(out.ids, skip_special_tokens=False)
            cut = _first_stop(text, stop or [])
            if cut is not None:
                out.text, out.stop_reason = text[:cut], "stop"
                break
            out.text = text
            ready = len(text) - _held_back(text, stop or [])
            if on_text is not None and ready > emitted:
                on_text(text[emitted:ready])
                emitted = ready
            if dec.seen >= dec.max_positions:
                out.stop_reason = "max_positions"
                break
            if len(out.ids) < max_new_tokens:
                logits = dec.feed([token])
        if out.stop_reason != "eos" and out.ids:
            out.unfed = out.ids[-1:]
        _sync(dec.device)
        out.decode_seconds = time.perf_counter() - t1
    except KeyboardInterrupt:
        out.stop_reason = "interrupted"
        if t1 is not None:  # the tokens decoded so far have their rate too
            out.decode_seconds = time.perf_counter() - t1
    if on_text is not None and len(out.text) > emitted:
        on_text(out.text[emitted:])
    return out


def eos_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's end-of-sequence token ids (none where it has none)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list | tuple | set) else {int(eos)}


def _first_stop(text: str, stop: list[str]) -> int | None:
    hits = [i for s in stop if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _held_back(text: str, stop: list[str]) -> int:
    """Characters at the end of ``text`` not to show yet: an unfinished character (the tokenizer's
    replacement character) or the beginning of a stop text."""
    held = 1 if text.endswith("\ufffd") else 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                held = max(held, k)
                break
    return held
