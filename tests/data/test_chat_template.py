"""zebractl.data.chat_template: Jinja chat templates rendered as transformers renders them, cut
into pieces whose trained ones are exactly the assistant turns' content and end-of-turn text, and
which template ``--chat-template`` picks (``auto``: the tokenizer's own, else chatml). The demo
GPT-2 tokenizer, offline; no randomness."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from zebractl.data import demo  # noqa: E402
from zebractl.data.chat import CHATML_JINJA, TEMPLATES, encode, parse_messages  # noqa: E402
from zebractl.data.chat_template import JinjaTemplate, resolve  # noqa: E402
from zebractl.data.sources import InputError  # noqa: E402
from zebractl.data.tokenizer import load_tokenizer  # noqa: E402
from zebractl.errors import ConfigError  # noqa: E402

CHAT = parse_messages(
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": "  5.  "},
            {"role": "user", "content": "And 2 * 3?"},
            {"role": "assistant", "content": "6, since 2 * 3 = 6."},
        ]
    },
    "chat.jsonl:1",
)

# Llama-3-like: BOS, role headers, contents trimmed, <|eot_id|> ends a turn (whitespace control)
LLAMA3 = r"""{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# ChatML written over several lines: equal to the built-in only with trim_blocks (as transformers)
CHATML_LINES = """{% for message in messages %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

# Qwen-like: a default system turn when the conversation has none
SYSTEM_DEFAULT = r"""{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}
{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

# Mistral-like: no generation prompt, a space glued before the answer, EOS after it
INST = r"""{% for message in messages %}
{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
{%- elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}
{%- else %}{{ raise_exception('only user and assistant roles') }}{% endif %}
{% endfor %}"""

# a generation prompt followed by more template text before the content (a thinking block)
THINK = r"""{% for message in messages %}
{% if message['role'] == 'assistant' %}{{ '<|assistant|>\n<think></think>\n' + message['content'] + '<|end|>\n' }}
{%- else %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{% endif %}
{% endfor %}
{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"""


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(demo.tokenizer_dir()))


def _jinja(tok, text, name="t.jinja"):
    return JinjaTemplate(name, text, tok.token_text(tok.bos_id), tok.token_text(tok.eos_id))


def _turns(messages, last=False):
    return [m.content.strip() if last else m.content for m in messages if m.role == "assistant"]


@pytest.mark.parametrize("text", [CHATML_JINJA, CHATML_LINES], ids=["one-line", "multi-line"])
def test_chatml_in_jinja_gives_the_builtin_pieces_ids_and_mask(tok, text):
    t = _jinja(tok, text)
    assert t.pieces(CHAT) == TEMPLATES["chatml"].pieces(CHAT)
    want = encode(CHAT, tok, TEMPLATES["chatml"], tok.eos_id)
    assert encode(CHAT, tok, t, tok.eos_id, "chat.jsonl:1") == want


def test_a_content_that_also_occurs_in_the_template_text_is_placed_right(tok):
    """``user`` is in the header ``<|im_start|>user``, ``end`` in ``<|im_end|>``: still the
    built-in's pieces (the first match would cut the header instead)."""
    talk = parse_messages(
        {
            "messages": [
                {"role": "user", "content": "user"},
                {"role": "assistant", "content": "end"},
                {"role": "user", "content": "im"},
                {"role": "assistant", "content": "assistant"},
            ]
        },
        "x:1",
    )
    for text in (CHATML_JINJA, CHATML_LINES):
        assert _jinja(tok, text).pieces(talk) == TEMPLATES["chatml"].pieces(talk)


@pytest.mark.parametrize(
    ("text", "end", "rendered_start"),
    [
        (LLAMA3, "<|eot_id|>", "<|endoftext|><|start_header_id|>system<|end_header_id|>\n\n"),
        (SYSTEM_DEFAULT, "<|im_end|>\n", "<|im_start|>system\nYou are terse."),
        (THINK, "<|end|>\n", "<|system|>\n"),
    ],
    ids=["llama3", "system-default", "think"],
)
def test_a_template_s_mask_is_exactly_the_assistant_content_and_end_of_turn(
    tok, text, end, rendered_start, masked_spans
):
    t = _jinja(tok, text)
    ids, mask = encode(CHAT, tok, t, tok.eos_id, "chat.jsonl:1")
    assert ids[-1] == tok.eos_id and mask[-1] == 0
    rendered = t.render(CHAT, False, "chat.jsonl:1")
    assert tok._impl.decode(ids[:-1]) == rendered and rendered.startswith(rendered_start)
    contents = [m.content.strip() if text == LLAMA3 else m.content for m in CHAT[2::2]]
    think = "<think></think>\n" if text == THINK else ""  # after the prompt: the model writes it
    assert masked_spans(tok, ids, mask) == [think + c + end for c in contents]


def test_a_default_system_turn_is_not_trained(tok, masked_spans):
    talk = CHAT[1:]  # no system turn: the template adds its own
    ids, mask = encode(talk, tok, _jinja(tok, SYSTEM_DEFAULT), None, "x:1")
    assert tok._impl.decode(ids).startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert masked_spans(tok, ids, mask) == [m.content + "<|im_end|>\n" for m in talk[1::2]]


def test_without_a_generation_prompt_the_span_starts_at_the_content(tok, masked_spans):
    talk = CHAT[1:]
    ids, mask = encode(talk, tok, _jinja(tok, INST), None, "x:1")
    rendered = tok._impl.decode(ids)
    assert rendered.startswith("[INST] What is 2 + 3? [/INST]   5.  <|endoftext|>[INST]")
    assert masked_spans(tok, ids, mask) == [m.content + "<|endoftext|>" for m in talk[1::2]]


def test_a_refusing_template_names_the_record_and_can_be_skipped(tok):
    with pytest.raises(InputError) as info:
        encode(CHAT, tok, _jinja(tok, INST, "inst.jinja"), None, "chat.jsonl:7")
    assert info.value.reason == "template_refused"
    assert str(info.value) == (
        "chat.jsonl:7: the chat template inst.jinja refuses this record: "
        "only user and assistant roles"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}", "prefix"),
        ("{% for m in messages %}{{ m.role }}\n{% endfor %}", "does not put the assistant"),
        ("{% if false %}x{% endif %}", "renders nothing"),
        (  # the generation prompt is not how an assistant turn begins
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<bot>{% endif %}",
            "generation prompt",
        ),
        ("line one\n{{ messages[0].content.nope() }}", "t.jinja:2: the chat template failed"),
        ("{{ strftime_now('%Y') }}", "strftime_now is defined"),
    ],
    ids=["prefix", "no-content", "nothing", "generation-prompt", "runtime", "strftime"],
)
def test_a_template_that_cannot_be_masked_is_a_usage_error_naming_it_and_the_record(
    tok, text, needle
):
    with pytest.raises(ConfigError) as info:
        encode(CHAT, tok, _jinja(tok, text), None, "chat.jsonl:7")
    assert not isinstance(info.value, InputError)  # never skipped with --skip-bad
    msg = str(info.value)
    assert needle in msg and "t.jinja" in msg and "chat.jsonl:7" in msg and "\n" not in msg, msg


def test_a_syntax_error_names_the_file_and_line(tok, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }}\n{% if %}\n{% endfor %}\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:3: Jinja syntax error: "):
        resolve(str(bad), tok)


def test_rendering_follows_transformers_conventions(tok):
    """No strftime_now (the template's own fixed date: the same data on any day), tojson keeps
    non-ASCII, {% generation %} blocks render as they are, loop controls work."""
    dated = (
        "{% if strftime_now is defined %}{{ strftime_now('%Y') }}{% else %}26 Jul 2024{% endif %}"
    )
    assert _jinja(tok, dated).render(CHAT, False, "x") == "26 Jul 2024"
    as_json = "{{ messages[0] | tojson }}"
    one = parse_messages({"messages": [{"role": "assistant", "content": "café"}]}, "x")
    assert (
        _jinja(tok, as_json).render(one, False, "x") == '{"role": "assistant", "content": "café"}'
    )
    marked = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    marked += "{% generation %}[{{ m.role }}]{% endgeneration %}{% endfor %}"
    assert _jinja(tok, marked).render(CHAT, False, "x") == "[system][user]"


def test_the_sandbox_refuses_unsafe_code(tok):
    with pytest.raises(ConfigError, match="SecurityError"):
        _jinja(tok, "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render(
            CHAT, False, "x:1"
        )


def test_rendering_matches_transformers_apply_chat_template(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "tok"
    tok.save(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    talk = [{"role": m.role, "content": m.content} for m in CHAT]
    for text in (LLAMA3, CHATML_LINES, SYSTEM_DEFAULT, THINK):
        config["chat_template"] = text
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
        ours = resolve("auto", load_tokenizer(str(folder)))
        assert ours.source == "tokenizer" and ours.text == text
        for gen in (False, True):
            want = theirs.apply_chat_template(talk, tokenize=False, add_generation_prompt=gen)
            assert ours.renderer.render(CHAT, gen, "x") == want


def test_auto_takes_the_tokenizer_s_own_template_else_chatml(tok, tmp_path):
    chosen = resolve("auto", tok)  # GPT-2's files carry no chat template
    assert (chosen.name, chosen.source, chosen.renderer) == (
        "chatml",
        "builtin",
        TEMPLATES["chatml"],
    )
    assert "no chat template" in chosen.reason
    assert chosen.sha256 == hashlib.sha256(CHATML_JINJA.encode()).hexdigest()
    folder = tmp_path / "tok"
    tok.save(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": LLAMA3},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    chosen = resolve("auto", load_tokenizer(str(folder)))
    assert (chosen.source, chosen.text) == ("tokenizer", LLAMA3)
    assert chosen.name == str(folder / "tokenizer_config.json")
    (folder / "chat_template.jinja").write_text(CHATML_LINES)  # beside the config: it wins
    chosen = resolve("auto", load_tokenizer(str(folder)))
    assert (chosen.name, chosen.text) == (str(folder / "chat_template.jinja"), CHATML_LINES)
    assert resolve("chatml", load_tokenizer(str(folder))).source == "builtin"  # named: as asked


def test_a_tokenizer_s_broken_template_is_named(tok, tmp_path):
    folder = tmp_path / "tok"
    tok.save(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}\n{{ m.content }"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json \(its chat_template, line 2\)"):
        resolve("auto", load_tokenizer(str(folder)))
    config["chat_template"] = [{"name": "tool_use", "template": "x"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer(str(folder))  # loads: only auto needs the template
    with pytest.raises(ConfigError, match="none named 'default'"):
        resolve("auto", loaded)
    assert resolve("chatml", loaded).source == "builtin"
