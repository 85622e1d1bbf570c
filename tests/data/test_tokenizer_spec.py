"""Which tokenizer specs are local paths and which are Hub ids (issue 42, item 6): a missing
local path is said at once (it was taken for a Hub id and retried for ~25 s before the message)."""

from __future__ import annotations

import time

import pytest

from zebractl.errors import ConfigError


@pytest.mark.parametrize(
    "spec",
    ["data/tok", "data/tok/tokenizer.json", "./tok", "../tok", "~/no-such-tok", "/no/such/tok",
     "tok.json", "spm.model", "a/b/c", "data/with space"],
)  # fmt: skip
def test_a_missing_local_path_is_said_at_once(tmp_path, monkeypatch, spec):
    from zebractl.data.tokenizer import load_tokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_hub(*a, **k):
        raise AssertionError(f"{spec!r} was taken for a Hub id")

    monkeypatch.setattr("zebractl.data.tokenizer._load_from_hub", no_hub)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="no such tokenizer file or folder"):
        load_tokenizer(spec)
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize("spec", ["gpt2", "meta-llama/Llama-3.2-1B", "org/name.v2"])
def test_hub_ids_go_to_the_hub(tmp_path, monkeypatch, spec):
    from zebractl.data import tokenizer

    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr(tokenizer, "_load_from_hub", lambda s: asked.append(s) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        tokenizer.load_tokenizer(spec)
    assert asked == [spec]
