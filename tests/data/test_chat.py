"""zebractl.data.chat: conversation records checked, rendered with ChatML, and masked so that only
the assistant's tokens are learned (the demo GPT-2 tokenizer)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")

from zebractl.data import demo  # noqa: E402
from zebractl.data.chat import TEMPLATES, Message, encode, fit, parse_messages  # noqa: E402
from zebractl.data.sources import InputError  # noqa: E402
from zebractl.data.tokenizer import load_tokenizer  # noqa: E402

CHAT = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5."},
        {"role": "user", "content": "And 2 * 3?"},
        {"role": "assistant", "content": "6, since 2 * 3 = 6."},
    ]
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(demo.tokenizer_dir()))


def _decode(tok, ids):
    return tok._impl.decode(ids)


def test_the_mask_covers_exactly_the_assistant_turns_and_their_end_marker(tok):
    msgs = parse_messages(CHAT, "chat.jsonl:1")
    ids, mask = encode(msgs, tok, TEMPLATES["chatml"], eos_id=tok.eos_id)
    assert len(ids) == len(mask) and ids[-1] == tok.eos_id and mask[-1] == 0
    spans, cur = [], []
    for i, on in zip(ids, mask, strict=True):
        if on:
            cur.append(i)
        elif cur:
            spans.append(_decode(tok, cur))
            cur = []
    assert spans == ["5.<|im_end|>\n", "6, since 2 * 3 = 6.<|im_end|>\n"]
    assert _decode(tok, ids[:-1]) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n5.<|im_end|>\n<|im_start|>user\nAnd 2 * 3?<|im_end|>\n"
        "<|im_start|>assistant\n6, since 2 * 3 = 6.<|im_end|>\n"
    )


@pytest.mark.parametrize(
    ("record", "reason", "needle"),
    [
        ({"text": "x"}, "missing_messages", "no 'messages' list (found: text)"),
        ([1, 2], "missing_messages", "found: list"),
        ({"messages": []}, "bad_messages", "non-empty list"),
        ({"messages": ["hi"]}, "bad_turn", "messages[0] is str"),
        ({"messages": [{"content": "hi"}]}, "bad_role", "messages[0]: no role"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "bad_role", "role 'robot'"),
        ({"messages": [{"role": "user"}]}, "bad_content", "(user): no content, not text"),
        ({"messages": [{"role": "user", "content": 7}]}, "bad_content", "content of type int"),
        ({"messages": [{"role": "assistant", "content": "  "}]}, "empty_content", "empty content"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "invalid_unicode", "surrogate"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no_assistant", "no assistant turn"),
    ],
)
def test_hostile_records_name_file_line_and_the_problem(record, reason, needle):
    with pytest.raises(InputError) as info:
        parse_messages(json.loads(json.dumps(record)), "chat.jsonl:7")
    assert info.value.reason == reason and str(info.value).startswith("chat.jsonl:7")
    assert needle in str(info.value), str(info.value)


def test_a_conversation_longer_than_the_sequence_follows_the_policy(tok):
    ids, mask = encode(parse_messages(CHAT, "x:1"), tok, TEMPLATES["chatml"])
    assert fit(ids, mask, len(ids), "drop") == (ids, mask)
    assert fit(ids, mask, len(ids) - 1, "drop") is None
    first = mask.index(1)
    cut = fit(ids, mask, first + 1, "truncate")
    assert cut == (ids[: first + 1], mask[: first + 1]) and cut[1][-1] == 1
    assert fit(ids, mask, first, "truncate") is None  # no assistant token left: nothing to learn
    long = [Message("user", "hi"), Message("assistant", "word " * 300)]
    ids, mask = encode(long, tok, TEMPLATES["chatml"])
    assert len(fit(ids, mask, 64, "truncate")[0]) == 64
