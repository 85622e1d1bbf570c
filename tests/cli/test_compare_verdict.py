"""`zebractl compare`'s last-but-one line: the verdict the README's main job ends on."""

from __future__ import annotations

from zebractl.cli.compare import verdict
from zebractl.schemas.reports import CompareCheck


def _check(value: float, ok: bool) -> CompareCheck:
    return CompareCheck(name="iteration1_abs", what="iteration-1 |Δ loss|", value=value,
                        tolerance=1e-3, ok=ok)  # fmt: skip


def test_pass_names_each_tolerance_with_its_value():
    assert verdict([_check(9.54e-7, True)], asserted=True) == (
        "parity: PASS (iteration-1 |Δ loss| 9.54e-07 <= 0.001)"
    )


def test_fail_says_which_bound_and_whether_it_exits_3():
    line = verdict([_check(0.5, False)], asserted=False)
    assert line.startswith("parity: FAIL (iteration-1 |Δ loss| 0.5 > 0.001)")
    assert line.endswith("--assert makes this exit 3")
    assert "--assert" not in verdict([_check(0.5, False)], asserted=True)


def test_nothing_to_check_is_not_a_pass():
    assert "PASS" not in verdict([], asserted=True)
