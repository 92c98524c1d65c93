"""The capability grids as heat maps in the analysis report: values and colours by hand."""

from __future__ import annotations

import re
from fractions import Fraction as F
from pathlib import Path

from holedger.analysis.heatmap import heatmap
from holedger.analysis.updating import Grid, analyse


def _cell(svg: str, agent: str, evolver: str) -> str:
    match = re.search(
        rf"<g><title>{re.escape(agent)} x {re.escape(evolver)}[^<]*</title>.*?</g>", svg
    )
    assert match, (agent, evolver)
    return match.group(0)


def test_cells_show_j_and_delta_coloured_by_sign_with_regressions_bordered() -> None:
    grid = Grid("bench", "in-situ")
    grid.base.update({"strong": F(3, 4), "weak": F(1, 4)})
    grid.cells.update(
        {
            ("strong", "e1"): F(4, 5),  # +5 %p
            ("strong", "e2"): F(3, 4),  # a tie
            ("strong", "e3"): F(1, 2),  # -25 %p: a regression
            ("weak", "e1"): F(1, 2),  # +25 %p, the largest |delta|: the deepest green
            ("weak", "e2"): F(3, 10),  # +5 %p
        }
    )
    svg = heatmap(analyse(grid))
    regression = _cell(svg, "strong", "e3")
    assert "J 50.0" in regression and "-25.0 %p" in regression and 'stroke="#b00"' in regression
    assert "delta -1/4" in regression
    assert 'fill="rgb(215,105,105)"' in regression  # |delta| = the scale: the deepest red
    assert 'fill="rgb(255,255,255)"' in _cell(svg, "strong", "e2")  # the tie: white
    assert 'fill="rgb(105,195,105)"' in _cell(svg, "weak", "e1")  # the deepest green
    assert ">-</text>" in _cell(svg, "weak", "e3")  # no cell
    # anchors: the complete row (strong; weak has no e3 cell) and the complete columns of
    # the agents with a Base (e1, e2). benefit = the max over e1, e2: strong +5.0, weak
    # +25.0; updating of e1 = the mean over the anchor agents, strong alone: +5.0
    assert "+5.0 %p" in _cell(svg, "strong", "benefit (max)")
    assert "+25.0 %p" in _cell(svg, "weak", "benefit (max)")
    assert re.search(r"updating of e1: 1/20</title><text[^>]*>\+5\.0 %p", svg)
    assert "e1 *" in svg and "e3 *" not in svg
    assert "strong *" in svg and "weak *" not in svg


def test_the_report_has_the_in_situ_grids_apart_from_held_out_ones(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from holedger.cli import cli

    from .test_evolve_insitu import home_with_a_run

    home = home_with_a_run(tmp_path)
    page = tmp_path / "report.html"
    done = CliRunner().invoke(
        cli, ["--home", str(home.home), "analysis", "report", "-o", str(page)]
    )
    assert done.exit_code == 0, done.output
    html = page.read_text()
    section = html[html.index('<section id="capabilities">') :]
    held, situ = section.split("<h3>")[1:3]
    assert held.startswith("held-out scores of search runs") and "No grid" in held
    assert situ.startswith("in-situ pass rates of solve-evolve runs") and "<svg" in situ
    assert "J 83.3" in situ and "+16.7 %p" in situ  # J = 5/6 against Base 2/3
