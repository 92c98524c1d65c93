"""The HTML report of one run: a single self-contained page, readable offline.

Everything is inline: the CSS in a ``<style>`` element and every plot as inline SVG. The
page loads nothing: no script, no font, no image, no stylesheet from anywhere, so it can
be mailed, archived, or opened on an air-gapped machine.

What it shows comes from two places. The verdict, the checks and the projections'
sections (budget table, scores, leakage audit, safety) come from the replay report, so
the page says exactly what ``holedger replay`` says. The timeline of evaluations and the
tokens per trial are read from the run's stored events (parsed leniently: a damaged
record is skipped here, and the replay verdict at the top names it).
"""

from holedger.replay.html.data import RunData, collect_run, fold_records
from holedger.replay.html.page import SECTION_IDS, build_report, render_html, write_report

__all__ = [
    "SECTION_IDS",
    "RunData",
    "build_report",
    "collect_run",
    "fold_records",
    "render_html",
    "write_report",
]
