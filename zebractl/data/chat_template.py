"""Chat templates for ``zebractl prepare --format chat`` (issue 29): which one, and how a Jinja one
is rendered, cut into pieces and masked.

Which (:func:`resolve`): ``--chat-template`` is ``auto`` (the default), a built-in name
(``chatml``, :data:`zebractl.data.chat.TEMPLATES`) or the path of a Jinja file. ``auto`` takes the
tokenizer's own chat template (``chat_template.jinja`` or ``tokenizer_config.json``'s
``chat_template``, :mod:`zebractl.data.tokenizer`) and, when it has none, the built-in ``chatml``.
The result (:class:`ChatTemplate`) says which and why; the manifest's ``chat.template`` records its
name (the built-in's name, the file, or the tokenizer file it came from), source (``builtin`` /
``file`` / ``tokenizer``), the sha256 of its text (a built-in's: of its Jinja text) and the text.

Rendering, as ``transformers`` renders chat templates (its conventions, not its code): a sandboxed
environment (``jinja2.sandbox.ImmutableSandboxedEnvironment``) with ``trim_blocks`` and
``lstrip_blocks``, loop controls, ``raise_exception(message)``, a ``tojson`` that keeps non-ASCII
text, and ``{% generation %}`` blocks rendered as they are; the variables are ``messages`` (dicts of
``role`` and ``content``), ``add_generation_prompt``, and ``bos_token`` / ``eos_token`` where the
tokenizer has them. ``strftime_now`` is deliberately absent: a template that dates its system
prompt falls back to its own fixed date, so the same inputs prepare the same data on any day.

Masking (:meth:`JinjaTemplate.pieces`). With ``R(k)`` the rendering of the first ``k`` turns
(``R(0)`` is empty) and ``G(k)`` the same with ``add_generation_prompt``:

- every ``R(k)`` must be a prefix of ``R(k+1)`` (turn ``k`` is the text between them) and, for an
  assistant turn, ``G(k)`` a prefix of ``R(k+1)``: the prefix property. A template without it
  (one that rewrites earlier turns as the conversation grows) cannot be masked this way: exit 2
  naming the template and the record's ``file:line``;
- an assistant turn's trained span runs from the end of ``G(k)`` (its header and generation prompt
  are not trained; where the template has no generation prompt, ``G(k) = R(k)``, from the start of
  its content) to the end of ``R(k+1)``: the content, anything the template writes between the
  prompt and the content, and the end-of-turn text (``<|im_end|>\\n``, ``<|eot_id|>``, ...);
- the content (verbatim, or stripped, as templates ``trim`` it) must lie in that span: a template
  that does not put the assistant's content in its output is exit 2. A content whose text occurs
  in its turn more than once (``user`` under the header ``<|im_start|>user``) is placed where a
  stand-in content (:data:`STAND_IN`) is rendered;
- the rendering is cut at every turn's boundaries, every content's start and end, and every span's
  edges, and each piece is tokenized on its own, as the built-in template's pieces are. A span's
  edge is therefore always a token boundary: no token straddles one, and a piece is trained or not
  as a whole. The cost: text that a template glues to a content without a separator (``[INST] ``
  before it) is tokenized apart from the content's first word, as with the built-in template.
  ChatML written as a Jinja file (:data:`zebractl.data.chat.CHATML_JINJA`) gives the built-in's
  pieces exactly, so the same ids and mask (tested on the demo conversations).

A template's ``raise_exception`` on a record refuses that record (reason ``template_refused``:
exit 2 naming ``file:line``, or counted with ``--skip-bad``); any other failure of a template is a
problem of the template (exit 2, never skipped). jinja2 is imported only when a Jinja template is
used.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebractl.data.chat import TEMPLATES, Message, Template
from zebractl.data.sources import InputError
from zebractl.errors import ConfigError, first_line

AUTO = "auto"
STAND_IN = "\ue000zebractl\ue001"
"""A content no conversation holds (private-use characters): where a template renders it tells
where a turn's content starts when the content's text occurs in the turn more than once."""


class _Refused(Exception):
    """What a template's ``raise_exception(message)`` raises."""


@dataclass(frozen=True)
class JinjaTemplate:
    """A Jinja chat template: ``name`` (its file) for messages, ``text`` its source. Picklable
    (the compiled template is cached per process)."""

    name: str
    text: str
    bos_token: str | None = None
    eos_token: str | None = None

    def compile(self) -> Any:
        """The compiled template; a syntax error is exit 2 naming the file and line."""
        import jinja2

        try:
            return _compiled(self.text)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(
                f"{self._at(exc.lineno)}: Jinja syntax error: {exc.message}"
            ) from None

    def render(self, messages: list[Message], generation_prompt: bool, where: str) -> str:
        """The template's text for ``messages``."""
        variables: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "add_generation_prompt": generation_prompt,
        }
        for key, value in (("bos_token", self.bos_token), ("eos_token", self.eos_token)):
            if value is not None:
                variables[key] = value
        try:
            return self.compile().render(**variables)
        except _Refused as exc:
            raise InputError(
                f"{where}: the chat template {self.name} refuses this record: {exc}",
                "template_refused",
            ) from None
        except Exception as exc:  # noqa: BLE001 - a template is code: any failure is its own
            line = _template_line(exc)
            at = self._at(line) if line else self.name
            first = first_line(exc)
            if "strftime_now" in first:
                first += (
                    "; zebractl leaves strftime_now out so that prepared data does not depend on "
                    "the day: guard it with `strftime_now is defined`"
                )
            raise ConfigError(
                f"{at}: the chat template failed on {where} ({type(exc).__name__}: {first})"
            ) from None

    def pieces(self, messages: list[Message], where: str = "") -> list[tuple[str, int]]:
        """(text, trained) pieces of a conversation (see the module docstring)."""
        renders = [""]  # R(0) .. R(n)
        for k in range(1, len(messages) + 1):
            text = self.render(messages[:k], False, where)
            if not text.startswith(renders[-1]):
                raise self._problem(
                    f"not prefix-stable: its rendering of the first {k - 1} turn(s) is not the "
                    f"start of its rendering of the first {k}",
                    where,
                )
            renders.append(text)
        full = renders[-1]
        if not full:
            raise self._problem("renders nothing for this conversation", where)
        cuts = {0, len(full)}
        spans: list[tuple[int, int]] = []
        for k, m in enumerate(messages):
            start, end = len(renders[k]), len(renders[k + 1])
            cuts |= {start, end}
            prompt_end = start
            if m.role == "assistant":
                prompt = self.render(messages[:k], True, where)  # G(k)
                if not renders[k + 1].startswith(prompt):
                    raise self._problem(
                        f"not prefix-stable: its generation prompt after {k} turn(s) is not the "
                        f"start of the assistant turn (messages[{k}])",
                        where,
                    )
                prompt_end = max(start, len(prompt))
            found = self._find(full, messages, k, prompt_end, end, where)
            if found:
                cuts |= set(found)
            if m.role != "assistant":
                continue
            if found is None:
                raise self._problem(
                    f"does not put the assistant's content (messages[{k}]) in its output", where
                )
            span = (prompt_end if prompt_end > start else found[0], end)
            spans.append(span)
            cuts |= set(span)
        edges = sorted(cuts)
        return [
            (full[a:b], int(any(s <= a < e for s, e in spans)))
            for a, b in zip(edges, edges[1:], strict=False)
        ]

    def _find(
        self, full: str, messages: list[Message], k: int, lo: int, hi: int, where: str
    ) -> tuple[int, int] | None:
        """Where turn ``k``'s content (or, for a template that trims it, its stripped text) lies
        in ``full[lo:hi]``, or None. Found more than once (a content ``user`` in the header
        ``<|im_start|>user``), the place a stand-in content is rendered at decides."""
        content = messages[k].content
        for needle in dict.fromkeys((content, content.strip())):
            at = full.find(needle, lo, hi) if needle else -1
            if at < 0:
                continue
            if full.find(needle, at + 1, hi) >= 0:
                stand_in = [*messages[:k], Message(messages[k].role, STAND_IN)]
                try:
                    probe = self.render(stand_in, False, where)
                except ConfigError:  # refused or failed on the stand-in: keep the first match
                    probe = ""
                there = probe.find(STAND_IN, lo)
                if (
                    lo <= there <= hi - len(needle)
                    and probe[:there] == full[:there]
                    and full.startswith(needle, there)
                ):
                    at = there
            return at, at + len(needle)
        return None

    def _at(self, line: int | None) -> str:
        if line is None:
            return self.name
        if self.name.endswith(".json"):  # tokenizer_config.json: the line is the template's own
            return f"{self.name} (its chat_template, line {line})"
        return f"{self.name}:{line}"

    def _problem(self, what: str, where: str) -> ConfigError:
        return ConfigError(f"chat template {self.name}: {what} ({where})")


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception was raised at (jinja2 rewrites the traceback to it)."""
    import traceback

    lines = [
        f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<template>"
    ]
    return lines[-1] if lines else None


@functools.cache
def _environment() -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it
        for a mask of its own): rendered as it is, the mask here coming from the renderings."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message: str) -> None:
        raise _Refused(message)

    def tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, Generation]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


@functools.lru_cache(maxsize=8)
def _compiled(text: str) -> Any:
    return _environment().from_string(text)


@dataclass(frozen=True)
class ChatTemplate:
    """The template a preparation renders with: what the manifest records, and its renderer (a
    built-in :class:`zebractl.data.chat.Template` or a :class:`JinjaTemplate`, both ``pieces``)."""

    name: str
    source: str
    reason: str
    text: str
    renderer: Any

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def identity(self) -> dict[str, str]:
        """What must match when a preparation resumes (job.json)."""
        return {"name": self.name, "source": self.source, "sha256": self.sha256}

    def describe(self) -> dict[str, str]:
        """The manifest's ``chat.template``."""
        return self.identity() | {"reason": self.reason, "text": self.text}


def describe_in_words(record: dict[str, str]) -> str:
    """A manifest's ``chat.template`` in one phrase (the CLI's summary line)."""
    sha = record["sha256"][:12]
    if record["source"] == "builtin":
        return f"the built-in {record['name']} template ({record['reason']})"
    if record["source"] == "tokenizer":
        return f"the tokenizer's own chat template ({record['name']}, sha256 {sha}...)"
    return f"the chat template {record['name']} (sha256 {sha}...)"


def resolve(spec: str, tok: Any) -> ChatTemplate:
    """The template ``--chat-template SPEC`` names for tokenizer ``tok`` (see the module
    docstring); a missing, unreadable or malformed Jinja file is exit 2 naming it."""
    if spec == AUTO:
        if tok.chat_template_problem:
            raise ConfigError(tok.chat_template_problem)
        if tok.chat_template is not None:
            name = tok.chat_template_file or tok.source
            why = "auto: the tokenizer's own chat template"
            return _jinja(name, "tokenizer", why, tok.chat_template, tok)
        return _builtin("chatml", "auto: the tokenizer has no chat template of its own")
    if spec in TEMPLATES:
        return _builtin(spec, f"--chat-template {spec}")
    return _jinja(spec, "file", f"--chat-template {spec}", read_template(spec), tok)


def read_template(spec: str) -> str:
    """The text of a Jinja template file (exit 2 naming it when it cannot be one)."""
    path = Path(spec).expanduser()
    builtins = f"the built-in templates are {', '.join(TEMPLATES)}; {AUTO} (the default) takes "
    builtins += "the tokenizer's own"
    if not path.exists():
        raise ConfigError(f"--chat-template {spec!r}: no such Jinja file ({builtins})")
    if path.is_dir():
        raise ConfigError(f"--chat-template {spec}: a folder, not a Jinja file ({builtins})")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--chat-template {spec}: unreadable ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{spec}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); a chat template "
            "is a Jinja text file"
        ) from None
    if not text.strip():
        raise ConfigError(f"{spec}: an empty chat template")
    return text


def _builtin(name: str, reason: str) -> ChatTemplate:
    t: Template = TEMPLATES[name]
    return ChatTemplate(name, "builtin", reason, t.jinja, t)


def _jinja(name: str, source: str, reason: str, text: str, tok: Any) -> ChatTemplate:
    renderer = JinjaTemplate(name, text, tok.token_text(tok.bos_id), tok.token_text(tok.eos_id))
    renderer.compile()  # a syntax error is found now, before any record is read
    return ChatTemplate(name, source, reason, text, renderer)
