"""``zebractl generate --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report


class GenerateSampling(StrictModel):
    """How tokens were chosen."""

    temperature: FiniteFloat = Field(ge=0)
    """0: greedy (the most likely token every step)."""
    top_k: int = Field(ge=0)
    """Only the k most likely tokens (0: all)."""
    top_p: FiniteFloat = Field(gt=0, le=1)
    """Only the smallest set of tokens whose probability reaches p (1: all)."""
    seed: int
    """The sampler's random seed."""


class GenerateReport(Report):
    """``zebractl generate SOURCE --json``: one completion and its speed."""

    command: ClassVar[str] = "generate"

    source: str
    """SOURCE as given."""
    source_kind: Literal["hf", "run"]
    """hf: a Hugging Face folder; run: a run directory or checkpoint converted in memory."""
    model_class: str
    """The model's class (ZebraForCausalLM, or FLA's for a folder of theirs)."""
    iteration: int | None = None
    """The checkpoint's iteration (a run)."""
    device: str
    """Where it ran (cpu / cuda)."""
    dtype: str
    """The weights' dtype (bf16 / fp32)."""
    sampling: GenerateSampling
    """The sampler's settings."""
    prompt: str
    """The prompt as given."""
    text: str
    """The generated text (without the prompt; cut before a --stop text)."""
    prompt_tokens: int
    """Tokens of the prompt (pre-filled in one forward pass)."""
    new_tokens: int
    """Tokens generated."""
    stop_reason: Literal["eos", "stop", "length", "max_positions", "interrupted"]
    """eos: the end-of-sequence token; stop: a --stop text; length: --max-new-tokens; max_positions:
    the model's last position; interrupted: Ctrl-C (what was generated until then)."""
    prefill_seconds: FiniteFloat
    """Wall time of the prompt's forward pass."""
    decode_seconds: FiniteFloat
    """Wall time of the new tokens after the first."""
    prefill_tokens_per_second: FiniteFloat | None
    """Prompt tokens / prefill time (null when too short to time)."""
    decode_tokens_per_second: FiniteFloat | None
    """Tokens generated after the first / decode time (null with fewer than two)."""
    cuda_graph: str | None = None
    """With --cuda-graph on a CUDA GPU: "replayed (N steps, M capture(s))", "not reached" (no
    step after the first), or "failed: why" (the steps ran eagerly); null otherwise."""


class ChatTurn(StrictModel):
    """One exchange of ``zebractl chat``."""

    user: str
    """The message."""
    reply: str
    """The model's reply (without its end-of-turn text)."""
    prefill_tokens: int
    """Tokens fed before the reply: the turn's own (the end of the last reply, the message, the
    generation prompt), more only where ``fed`` says so."""
    new_tokens: int
    """Tokens generated."""
    stop_reason: Literal["eos", "stop", "length", "max_positions", "interrupted"]
    """eos or stop: the end-of-turn; length: --max-new-tokens (see ``zebractl generate``)."""
    fed: Literal["incremental", "resync", "refed"]
    """incremental: only the turn's tokens; resync: the last reply again as the tokenizer writes it
    (it was generated as other tokens), from the last prompt on; refed: the whole conversation."""


class ChatReport(Report):
    """``zebractl chat SOURCE --json``: the conversation read from stdin, one message per line."""

    command: ClassVar[str] = "chat"

    source: str
    """SOURCE as given."""
    model_class: str
    """The model's class."""
    template: str
    """The chat template's name (the data's, a file, the tokenizer's, or chatml)."""
    system: str | None = None
    """The --system message."""
    turns: list[ChatTurn] = Field(default_factory=list)
    """The exchanges, in order (a /reset shows as a turn's fed: refed after it)."""
