"""A multi-turn conversation over one generation cache: each turn feeds only its new tokens.

The conversation is rendered with a chat template (:class:`zebractl.data.chat_template.JinjaTemplate`;
the built-in ChatML as its Jinja text): which one is :func:`template_for` (``auto``: the template the
run's SFT data was prepared with, from its manifest; a Hugging Face folder's tokenizer template;
ChatML otherwise). Each turn renders the whole conversation (the replies as their content, the
generation prompt at the end) and tokenizes it as one text: exactly what a from-scratch prompt of
the conversation is. The cache holds a prefix of those tokens, so only the rest is fed: the end of
the last reply, the new message and the generation prompt. Where a reply was generated as tokens
the tokenizer would write otherwise (a model may spell ``"\n\n"`` as two tokens), the cache goes
back to the snapshot taken after the last turn's prompt (fixed-size states; MLA's latents are only
cut) and feeds the reply as the tokenizer writes it with the new turn (``resync``); where even that
prompt changed (a template that rewrites earlier turns), the whole conversation is fed again
(``refed``). Generation stops at the template's end-of-turn text (one token of the tokenizer, or a
stop text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zebractl.data.chat import CHATML_JINJA, Message
from zebractl.data.chat_template import JinjaTemplate
from zebractl.errors import ConfigError

PROBE = "\ue000zebractl-reply\ue001"
"""A reply no conversation holds: where the template puts it tells its end-of-turn text."""


def end_of_turn(template: JinjaTemplate) -> str:
    """The text the template writes after an assistant's content (its end-of-turn marker, surrounding
    whitespace dropped): ``<|im_end|>`` for ChatML. Empty when it writes none."""
    msgs = [Message("user", "hi"), Message("assistant", PROBE)]
    text = template.render(msgs, False, "chat template")
    at = text.rfind(PROBE)
    return text[at + len(PROBE) :].strip() if at >= 0 else ""


def template_for(spec: str, manifest_template: dict | None, tokenizer: Any) -> JinjaTemplate:
    """The template ``--chat-template SPEC`` names: ``auto`` (the run's data template, else the
    tokenizer's own, else ChatML), ``chatml``, or a Jinja file's path."""
    from pathlib import Path

    bos = getattr(tokenizer, "bos_token", None)
    eos = getattr(tokenizer, "eos_token", None)
    if spec == "chatml":
        return JinjaTemplate("chatml", CHATML_JINJA, bos, eos)
    if spec != "auto":
        path = Path(spec)
        try:
            return JinjaTemplate(str(path), path.read_text(encoding="utf-8"), bos, eos)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--chat-template {spec}: cannot read it ({exc})") from None
    if manifest_template and manifest_template.get("text"):
        return JinjaTemplate(
            manifest_template.get("name", "data"), manifest_template["text"], bos, eos
        )
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own.strip():
        return JinjaTemplate("tokenizer", own, bos, eos)
    return JinjaTemplate("chatml", CHATML_JINJA, bos, eos)


@dataclass
class Turn:
    """One exchange: the reply, the tokens fed for it, and whether the cache had to be refilled."""

    reply: str
    prefill_tokens: int
    new_tokens: int
    stop_reason: str
    fed: str = "incremental"
    """incremental: only the turn's new tokens were fed; resync: the last reply was tokenized
    otherwise than generated, so the cache went back to the last prompt and fed the reply as the
    tokenizer writes it plus the new turn; refed: the whole conversation again."""


@dataclass
class Conversation:
    """Messages so far and the text (and token ids) the decoder's cache holds."""

    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    held_ids: list[int] = field(default_factory=list)
    """The tokens the decoder's cache has run, in order."""
    mark: tuple[int, Any] | None = None
    """(tokens, decoder snapshot) right after the last turn's prompt ran."""

    def start(self) -> list[Message]:
        return [Message("system", self.system)] if self.system else []


class ChatSession:
    """Turns against one :class:`zebractl.generate.engine.Decoder` and tokenizer."""

    def __init__(
        self,
        decoder: Any,
        tokenizer: Any,
        template: JinjaTemplate,
        *,
        system: str | None,
        sampling: Any,
        max_new_tokens: int,
    ) -> None:
        self.dec, self.tok, self.template = decoder, tokenizer, template
        self.sampling, self.max_new_tokens = sampling, max_new_tokens
        self.eot = end_of_turn(template)
        self.eot_ids = self._eot_ids()
        self.conv = Conversation(system)
        self.dec.reset(0)

    def reset(self) -> None:
        """Forget the conversation (``/reset``)."""
        self.conv = Conversation(self.conv.system)
        self.dec.reset(0)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def turn(self, user: str, on_text: Callable[[str], None] | None = None) -> Turn:
        """Add the user's message, feed what the cache lacks, and generate the reply."""
        from zebractl.generate.engine import eos_ids, generate

        msgs = [*self.conv.start(), *self.conv.messages, Message("user", user)]
        rendered = self.template.render(msgs, True, "chat template")
        ids = self._encode(rendered)
        new_ids, how = self._sync(ids)
        if not new_ids:
            raise ConfigError("chat: the template rendered nothing new for this message")
        stop_ids = self.eot_ids
        out = generate(
            self.dec,
            self.tok,
            new_ids,
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            stop=[self.eot] if self.eot and not stop_ids else None,
            stop_ids=stop_ids | eos_ids(self.tok),
            on_text=on_text,
            fresh=False,
            on_prefill=lambda: self._mark(len(ids)),
        )
        self.conv.messages += [Message("user", user), Message("assistant", out.text)]
        if out.stop_reason == "interrupted":  # what ran is unknown: the next turn starts over
            self.dec.reset(0)
            self.conv.held_ids, self.conv.mark = [], None
        else:  # every token but the last chosen one ran (the end-of-turn token is not in ids)
            self.conv.held_ids = ids + (out.ids if out.stop_reason == "eos" else out.ids[:-1])
        return Turn(out.text, len(new_ids), len(out.ids), out.stop_reason, how)

    def _mark(self, prompt_tokens: int) -> None:
        """After a turn's prompt has run: the point a non-canonical reply is rolled back to."""
        self.conv.mark = (prompt_tokens, self.dec.snapshot())

    def _sync(self, ids: list[int]) -> tuple[list[int], str]:
        """The tokens to feed so that the cache holds exactly ``ids`` (the whole conversation as
        the tokenizer writes it, from scratch): the rest after what it holds; or, where the reply
        it generated is tokenized otherwise than it came out, the rest after the last turn's prompt
        (the cache rolled back there: ``resync``); or everything again (``refed``)."""
        held = self.conv.held_ids
        how = "incremental"
        if held and ids[: len(held)] != held:
            at, snap = self.conv.mark if self.conv.mark else (0, None)
            if snap is not None and at and ids[:at] == held[:at]:
                self.dec.restore(snap)
                held, how = held[:at], "resync"
            else:
                self.dec.reset(0)
                held, how = [], "refed"
        return ids[len(held) :], how

    def _eot_ids(self) -> set[int]:
        """The end-of-turn text as one token of the tokenizer (a stop token), else none."""
        if not self.eot:
            return set()
        ids = self._encode(self.eot)
        return {ids[0]} if len(ids) == 1 else set()
