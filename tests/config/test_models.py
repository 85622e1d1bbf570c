"""Two models side by side (zebractl.config.models): the summary of each and the fields where they
differ, as `train --init-from` and `compare` name them. No torch: the models are the presets'."""

from __future__ import annotations

import itertools

import pytest

from zebractl.config import models
from zebractl.config.resolve import resolve_preset

TINY = ("tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid")


def _model(preset: str, *sets: str):
    return resolve_preset(preset, list(sets)).config


def test_a_summary_names_the_blocks_and_the_width():
    assert models.summary(_model("tiny_kda")) == "2 blocks: kda, kda; hidden 64"
    assert models.summary(_model("tiny_hybrid")) == "4 blocks: mla, kda, kda, kda; hidden 64"
    assert models.blocks_text(["kda"] * 24) == "kda x 24"
    assert models.blocks_text(["mla", "kda", "kda", "kda"] * 3) == "(mla, kda, kda, kda) x 3"
    irregular = ["mla", "kda", "gdn", "kda", "kda", "mla", "gdn"]
    assert models.blocks_text(irregular) == "mla, kda, gdn, kda, kda, mla, ... (7 in all)"


@pytest.mark.parametrize(("a", "b"), list(itertools.permutations(TINY, 2)))
def test_every_pair_of_tiny_presets_differs_in_its_layout_first(a, b):
    diffs = models.differences(_model(a), _model(b))
    assert diffs and diffs[0].kind == "layout", diffs
    assert models.blocking(diffs)
    assert models.preset_name(_model(a)) == a  # a shipped model is known by its preset


def test_a_model_is_its_own_and_the_same_heads_written_otherwise_are_too():
    m = _model("tiny_kda")
    assert models.differences(m, m) == []
    # expand_v 2 over 16-wide keys is head_v_dim 32; a pattern spells out mixer + ratio
    same = _model(
        "tiny_kda", "kda.head_v_dim=null", "kda.expand_v=2.0", "layout.mixer=null",
        "layout.pattern=[kda, kda]",
    )  # fmt: skip
    assert models.differences(m, same) == []
    assert models.differences(m, _model("tiny_kda", "description=other")) == []


def test_a_width_and_a_head_are_named_with_both_values():
    diffs = models.differences(_model("tiny_kda"), _model("tiny_kda", "hidden_size=96"))
    assert [d.text() for d in diffs] == ["hidden_size 64 ≠ 96"]
    (d,) = models.differences(_model("tiny_gdn"), _model("tiny_gdn", "gdn.num_v_heads=2"))
    assert (d.key, d.a, d.b, d.kind) == ("gdn.num_v_heads", 4, 2, "weights")


def test_the_block_mixers_are_grouped_by_pair():
    (d,) = models.differences(_model("tiny_kda"), _model("tiny_gdn"))
    assert d.text() == "blocks 1-2 mixer kda ≠ gdn"
    hybrid = _model("tiny_hybrid")
    mixed = _model("tiny_hybrid", "layout.mixer=null", "layout.hybrid_attention_ratio=0.0",
                   "layout.pattern=[mla, kda, mla, kda]")  # fmt: skip
    (d,) = models.differences(hybrid, mixed)
    assert d.text() == "block 3 mixer kda ≠ mla"
    (d,) = models.differences(_model("tiny_kda"), hybrid)
    assert d.text() == "blocks 2 (kda, kda) ≠ 4 (mla, kda, kda, kda)"


def test_what_weights_load_across_is_not_blocking():
    m = _model("tiny_hybrid")
    other = _model(
        "tiny_hybrid", "max_position_embeddings=4096", "mla.rope_base=50000.0",
        "vocab_size=50300", "dropout.hidden=0.1", "init_std=0.01",
    )  # fmt: skip
    diffs = models.differences(m, other)
    kinds = {d.key: d.kind for d in diffs}
    assert kinds == {
        "vocab_size": "vocabulary", "max_position_embeddings": "positions",
        "mla.rope_base": "positions", "dropout.hidden": "training", "init_std": "training",
    }  # fmt: skip
    assert models.blocking(diffs) == []
    notes = models.loading_notes("SRC", m, diffs)
    assert len(notes) == 3 and "tokens 50257-50299 start from rows" in notes[0], notes


def test_a_vocabulary_of_other_rows_says_which_size_fits():
    a, b = _model("tiny_kda"), _model("tiny_kda", "vocab_size=60000")
    refused = models.blocking(models.differences(a, b))
    assert [d.text() for d in refused] == ["embedding rows 50304 ≠ 60032"]
    text = models.mismatch("SRC", "A", "B", refused)
    assert text.startswith("SRC holds A, which does not fit the model B: embedding rows")
    assert "set model.vocab_size to at most 50304" in text


def test_a_long_list_ends_with_how_many_more():
    diffs = [models.Difference(f"k{i}", i, i + 1, "weights") for i in range(11)]
    text = models.listed(diffs)
    assert text.count("≠") == models.SHOWN and text.endswith(", and 3 more")


def test_a_changed_preset_is_named_as_such():
    assert models.preset_name(_model("tiny_kda"), "tiny_kda") == "tiny_kda"
    assert models.preset_name(_model("tiny_kda", "hidden_size=96"), "tiny_kda") == (
        "tiny_kda with changes"
    )
    assert models.preset_name(_model("tiny_kda", "hidden_size=96")) is None
    assert models.described(_model("tiny_gdn", "hidden_size=96")).startswith("a model (2 blocks")
