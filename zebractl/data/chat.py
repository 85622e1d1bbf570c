"""Conversations as training data (issue 29, groundwork for ``prepare --format chat``).

A record is a JSON object whose ``messages`` is a list of turns, each ``{"role": ROLE, "content":
TEXT}`` with ROLE one of ``system``, ``user``, ``assistant`` and at least one assistant turn.
:func:`parse_messages` checks a record and names the first problem (``InputError``, exit 2, with the
record's ``file:line``). :func:`encode` renders the turns with a template into token ids and a loss
mask that is 1 exactly on the assistant turns' content and their end-of-turn marker, and
:func:`fit` applies the declared policy to a conversation longer than the sequence.

A template cuts a conversation into pieces of text, each marked trained or not (``pieces``); each
piece is tokenized on its own and the ids concatenated, so the mask's boundaries are the pieces'
boundaries by construction and no token straddles one (tokenizing the rendered string whole could
merge a content's last characters with the marker: GPT-2 reads ``18.<|im_end|>`` as ``18``,
``.<``, ...). The built-in template is ChatML (``<|im_start|>ROLE\\n ... <|im_end|>\\n``), the
default for tokenizers without a chat template of their own; its pieces are each turn's header,
content and end marker. A Jinja template (the tokenizer's own or a file) is rendered and cut by
:mod:`zebractl.data.chat_template` into the same kind of pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from zebractl.data.sources import SURROGATE, InputError

ROLES = ("system", "user", "assistant")
PROBLEMS = (
    "missing_messages",
    "bad_messages",
    "bad_turn",
    "bad_role",
    "bad_content",
    "empty_content",
    "no_assistant",
    "template_refused",
)
"""The reasons a record is bad (``--skip-bad`` counts them): :func:`parse_messages`'s, and a
Jinja template's ``raise_exception`` refusing the record (:mod:`zebractl.data.chat_template`)."""


@dataclass(frozen=True)
class Message:
    """One turn of a conversation."""

    role: str
    content: str


@dataclass(frozen=True)
class Template:
    """A built-in template: a turn is ``header`` (with ``{role}``), the content, then ``end``.
    ``jinja`` is the same template as Jinja text (rendered with it, a conversation gives the same
    pieces, so the same ids and mask: tested); its sha256 is the one the manifest records."""

    name: str
    header: str
    end: str
    jinja: str = ""

    def pieces(self, messages: list[Message], where: str = "") -> list[tuple[str, int]]:
        """(text, trained) pieces: each turn's header (0), content and end (1 for an assistant)."""
        out: list[tuple[str, int]] = []
        for m in messages:
            trained = int(m.role == "assistant")
            out += [(self.header.format(role=m.role), 0), (m.content, trained), (self.end, trained)]
        return out


CHATML_JINJA = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML as a Jinja chat template (the common Hugging Face text of it)."""

TEMPLATES = {"chatml": Template("chatml", "<|im_start|>{role}\n", "<|im_end|>\n", CHATML_JINJA)}
"""The built-in templates, by name."""


def parse_messages(obj: Any, where: str) -> list[Message]:
    """The turns of one record, checked (see the module docstring)."""
    if not isinstance(obj, dict) or "messages" not in obj:
        found = ", ".join(sorted(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise InputError(f"{where}: no 'messages' list (found: {found})", "missing_messages")
    turns = obj["messages"]
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{where}: 'messages' must be a non-empty list of turns", "bad_messages")
    out = []
    for i, turn in enumerate(turns):
        at = f"{where}: messages[{i}]"
        if not isinstance(turn, dict):
            raise InputError(f"{at} is {type(turn).__name__}, not a turn object", "bad_turn")
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            got = "no role" if role is None else f"role {role!r}"
            raise InputError(f"{at}: {got}; a turn's role is one of {', '.join(ROLES)}", "bad_role")
        if not isinstance(content, str):
            what = "no content" if content is None else f"content of type {type(content).__name__}"
            raise InputError(f"{at} ({role}): {what}, not text", "bad_content")
        if not content.strip():
            raise InputError(f"{at} ({role}): empty content", "empty_content")
        bad = SURROGATE.search(content)
        if bad:
            raise InputError(
                f"{at} ({role}): a lone surrogate escape (\\u{ord(bad.group()):04x}), not Unicode text",
                "invalid_unicode",
            )
        out.append(Message(role, content))
    if not any(m.role == "assistant" for m in out):
        raise InputError(f"{where}: no assistant turn: nothing to learn from", "no_assistant")
    return out


def encode(
    messages: list[Message],
    tok: Any,
    template: Any,
    eos_id: int | None = None,
    where: str = "",
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a conversation: the mask is 1 on every assistant turn's content
    and end-of-turn marker, 0 elsewhere; ``eos_id`` (if given) closes the conversation, unmasked.
    ``tok`` is a :class:`zebractl.data.tokenizer.Tokenizer` (``encode_batch``); ``template`` a
    :class:`Template` or a :class:`zebractl.data.chat_template.JinjaTemplate` (``pieces``);
    ``where`` (``file:line``) names the record in a template's errors."""
    pieces = template.pieces(messages, where)
    ids: list[int] = []
    mask: list[int] = []
    texts = [text for text, _ in pieces]
    for piece_ids, on in zip(tok.encode_batch(texts), [on for _, on in pieces], strict=True):
        ids += piece_ids
        mask += [on] * len(piece_ids)
    if eos_id is not None:
        ids.append(eos_id)
        mask.append(0)
    return ids, mask


def fit(
    ids: list[int], mask: list[int], seq_length: int, policy: Literal["truncate", "drop"]
) -> tuple[list[int], list[int]] | None:
    """A conversation of at most ``seq_length`` tokens: as it is when it fits; else, ``truncate``
    keeps the first ``seq_length`` tokens and ``drop`` drops it (None). A truncated conversation
    with no assistant token left is dropped too (it would teach nothing)."""
    if len(ids) <= seq_length:
        return ids, mask
    if policy == "drop" or not any(mask[:seq_length]):
        return None
    return ids[:seq_length], mask[:seq_length]
