"""Harness-updating and harness-benefit as the paper defines them (C3-C5), against values
worked out by hand on small grids."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holedger.analysis.updating import (
    READINGS,
    Grid,
    across_benchmarks,
    analyse,
    benefit,
    default_anchors,
    given_anchors,
    updating,
)
from holedger.analysis.updating import (
    regressions as regressions_of,
)


def _grid() -> Grid:
    """Agents A (Base 1/2), B (1/4), C (3/4); evolvers e1, e2, e3; C has no e3 cell.

    delta:      e1     e2     e3
        A     +3/8    0     +1/8      (A, e2) a tie with NONE
        B      0    +5/16   -1/8      (B, e1) a tie, (B, e3) a regression
        C     +1/4  -1/4     -        (C, e2) a regression
    """
    return Grid(
        "bench",
        "in-situ",
        base={"A": F(1, 2), "B": F(1, 4), "C": F(3, 4)},
        cells={
            ("A", "e1"): F(7, 8),
            ("A", "e2"): F(1, 2),
            ("A", "e3"): F(5, 8),
            ("B", "e1"): F(1, 4),
            ("B", "e2"): F(9, 16),
            ("B", "e3"): F(1, 8),
            ("C", "e1"): F(1),
            ("C", "e2"): F(1, 2),
        },
    )


def test_default_anchors_are_the_complete_rows_and_columns() -> None:
    anchors = default_anchors(_grid())
    # C misses e3 (not a complete row); e3 misses C (not a complete column)
    assert anchors.agents == ("A", "B") and anchors.evolvers == ("e1", "e2")
    assert anchors.chosen == "default"


def test_updating_is_the_mean_and_benefit_the_max() -> None:
    """On agent A the anchor evolvers give delta 3/8 and 0: benefit is 3/8 (their max), not
    3/16 (their mean). Evolver e1 gives A 3/8 and B 0: updating is 3/16 (the mean), not
    3/8 (the max)."""
    grid = _grid()
    anchors = default_anchors(grid)
    assert benefit(grid, "A", anchors) == (F(3, 8), ["e1"])
    assert updating(grid, "e1", anchors) == F(3, 16)
    assert updating(grid, "e2", anchors) == F(5, 32)  # (0 + 5/16) / 2
    assert updating(grid, "e3", anchors) == F(0)  # (1/8 - 1/8) / 2: not an anchor, computed
    assert benefit(grid, "B", anchors) == (F(5, 16), ["e2"])
    assert benefit(grid, "C", anchors) == (F(1, 4), ["e1"])  # max(1/4, -1/4)


def test_benefit_names_every_evolver_of_a_tied_max() -> None:
    grid = Grid("b", "in-situ", base={"A": F(0)}, cells={("A", "x"): F(1, 2), ("A", "y"): F(1, 2)})
    assert benefit(grid, "A", default_anchors(grid)) == (F(1, 2), ["x", "y"])


def test_given_anchors_change_both_measures_and_a_missing_cell_gives_none() -> None:
    grid = _grid()
    anchors = given_anchors(grid, ["A", "C"], [])
    assert anchors.agents == ("A", "C") and anchors.evolvers == ("e1", "e2")
    assert anchors.chosen == "given"
    assert updating(grid, "e1", anchors) == F(5, 16)  # (3/8 + 1/4) / 2
    assert updating(grid, "e2", anchors) == F(-1, 8)  # (0 - 1/4) / 2
    assert updating(grid, "e3", anchors) is None  # C has no e3 cell
    wide = given_anchors(grid, [], ["e1", "e3"])
    assert benefit(grid, "C", wide) == (None, [])
    with pytest.raises(ValueError, match="anchor agent 'Z'"):
        given_anchors(grid, ["Z"], [])
    with pytest.raises(ValueError, match="anchor evolver 'e9'"):
        given_anchors(grid, [], ["e9"])


def test_derived_comparisons_worked_by_hand() -> None:
    out = analyse(_grid())
    spread = out["evolver_spread"]
    assert spread["spread"] == F(3, 16) - F(5, 32) == F(1, 32)
    assert spread["top"] == ["e1"] and spread["bottom"] == ["e2"]
    assert spread["breakdown"] == {
        "evolver": "e1",
        "deltas": [{"agent": "A", "delta": F(3, 8)}, {"agent": "B", "delta": F(0)}],
    }
    wb = out["within_between"]
    # A: J 7/8 and 1/2 over e1, e2; B: 1/4 and 9/16; Base 1/2 and 1/4
    assert wb["within"] == [
        {"agent": "A", "range": F(3, 8), "evolvers": 2},
        {"agent": "B", "range": F(5, 16), "evolvers": 2},
    ]
    assert wb["between"] == F(1, 4)
    # strongest anchor A (Base 1/2), its worst anchor evolver e2 (J 1/2); weakest anchor B
    # (Base 1/4), its best e2 (J 9/16): 1/2 - 9/16
    ext = out["extreme_pairing"]
    assert (ext["strongest"], ext["worst_evolver"], ext["weakest"], ext["best_evolver"]) == (
        "A",
        "e2",
        "B",
        "e2",
    )
    assert ext["difference"] == F(-1, 16)
    assert out["headroom"] == [
        {
            "agent": "A",
            "base": F(1, 2),
            "headroom": F(1, 2),
            "benefit": F(3, 8),
            "best_evolvers": ["e1"],
        },
        {
            "agent": "B",
            "base": F(1, 4),
            "headroom": F(3, 4),
            "benefit": F(5, 16),
            "best_evolvers": ["e2"],
        },
        {
            "agent": "C",
            "base": F(3, 4),
            "headroom": F(1, 4),
            "benefit": F(1, 4),
            "best_evolvers": ["e1"],
        },
    ]


def test_regression_cells_are_strictly_below_none_and_ties_apart() -> None:
    reg = analyse(_grid())["regressions"]
    assert reg["cells"] == 8
    assert reg["regression_cells"] == [
        {"agent": "B", "evolver": "e3"},
        {"agent": "C", "evolver": "e2"},
    ]
    assert reg["tie_cells"] == [{"agent": "A", "evolver": "e2"}, {"agent": "B", "evolver": "e1"}]
    assert (reg["regressions"], reg["ties"]) == (2, 2)
    assert reg["regressions_by_evolver"] == {"e2": 1, "e3": 1}
    assert reg["regressions_by_agent"] == {"B": 1, "C": 1}
    assert reg["ties_by_evolver"] == {"e1": 1, "e2": 1}


def test_readings_are_named_with_the_source() -> None:
    grid = _grid()
    out = analyse(grid)
    assert READINGS["delta"] in out["readings"] and READINGS["anchors_default"] in out["readings"]
    assert READINGS["held_out"] not in out["readings"]
    held = Grid("b", "held-out", base=grid.base, cells=grid.cells)
    given = analyse(held, given_anchors(held, ["A"], ["e1"]))
    assert READINGS["held_out"] in given["readings"]
    assert READINGS["anchors_default"] not in given["readings"]
    assert given["anchors"] == {"agents": ["A"], "evolvers": ["e1"], "chosen": "given"}
    with pytest.raises(ValueError):
        Grid("b", "mixed")


def test_across_benchmarks_no_evolver_wins_every_one() -> None:
    one = analyse(_grid())  # top e1
    other = Grid(
        "other",
        "in-situ",
        base={"A": F(0)},
        cells={("A", "e1"): F(1, 4), ("A", "e2"): F(1, 2)},  # top e2
    )
    both = across_benchmarks([one, analyse(other)])
    assert both["top_by_benchmark"] == {"bench": ["e1"], "other": ["e2"]}
    assert both["wins_every_benchmark"] == []
    same = across_benchmarks([one, one | {"benchmark": "copy"}])
    assert same["wins_every_benchmark"] == ["e1"]
    assert same["regressions_by_evolver"] == {"e2": 2, "e3": 2}


rates = st.fractions(min_value=0, max_value=1, max_denominator=16)


@given(
    base=st.lists(rates, min_size=1, max_size=4),
    js=st.lists(st.lists(rates, min_size=3, max_size=3), min_size=4, max_size=4),
)
def test_benefit_is_a_cell_at_least_every_other_and_updating_lies_within_its_column(
    base: list[F], js: list[list[F]]
) -> None:
    """On any complete grid: benefit(f) is delta(f, e) of some anchor evolver and no less
    than any; updating(e) lies between the smallest and largest delta of its column, and
    times the number of anchor agents is their sum."""
    agents = [f"f{i}" for i in range(len(base))]
    grid = Grid(
        "b",
        "in-situ",
        base=dict(zip(agents, base, strict=True)),
        cells={(f, f"e{k}"): js[i][k] for i, f in enumerate(agents) for k in range(3)},
    )
    anchors = default_anchors(grid)
    assert anchors.agents == tuple(agents) and len(anchors.evolvers) == 3
    for f in agents:
        deltas = [grid.delta(f, e) for e in anchors.evolvers]
        value, best = benefit(grid, f, anchors)
        assert value == max(d for d in deltas if d is not None)
        assert best and all(grid.delta(f, e) == value for e in best)
    for e in anchors.evolvers:
        column = [d for f in agents if (d := grid.delta(f, e)) is not None]
        up = updating(grid, e, anchors)
        assert up is not None and min(column) <= up <= max(column)
        assert up * len(agents) == sum(column)
    reg = regressions_of(grid)
    assert reg["regressions"] + reg["ties"] == sum(
        1 for (f, _), j in grid.cells.items() if j <= grid.base[f]
    )
