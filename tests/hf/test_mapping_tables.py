"""The conversion tables map every tensor once in each direction, for every shipped preset and
format that applies; a table that maps a name twice is refused naming it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from zebractl.config.catalog import shipped  # noqa: E402
from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.hf import mapping  # noqa: E402
from zebractl.layout.common import OURS, THEIRS, Rename  # noqa: E402


def _presets():
    names = sorted(shipped("preset"))
    assert len(names) >= 15
    return names


@pytest.mark.parametrize("preset", _presets())
def test_every_shipped_preset_maps_each_tensor_once(preset):
    m = resolve_preset(preset).config
    mapping.check_table(m, "zebra")
    try:
        mapping.family(m)
    except mapping.MappingError:
        return  # FLA has no class for it
    mapping.check_table(m, "fla")


def test_a_doubly_mapped_name_is_refused(monkeypatch):
    m = resolve_preset("tiny_kda").config
    broken = (*mapping.BLOCKS["kda"], Rename(OURS + "A_log", THEIRS + "dt_bias"))
    monkeypatch.setitem(mapping.BLOCKS, "kda", broken)
    with pytest.raises(mapping.MappingError, match=r"doubly mapped.*A_log.*dt_bias"):
        mapping.check_table(m, "fla")
