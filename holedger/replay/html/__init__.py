"""The HTML report of one run: a single self-contained page, readable offline.

Everything is inline: the CSS in a ``<style>`` element and every plot as inline SVG. The
page loads nothing: no script, no font, no image, no stylesheet from anywhere, so it can
be mailed, archived, or opened on an air-gapped machine.

What it shows comes from two places. The verdict, the checks and the projections'
sections (budget table, scores, leakage audit, safety) come from the replay report, so
the page says exactly what ``holedger replay`` says. The timeline of evaluations and the
tokens per trial are read from the run's stored events (parsed leniently: a damaged
record is skipped here, and the replay verdict at the top names it). Beside the ledger
it may read (:class:`Sources`) the run's candidate repository for each candidate's diff,
the task's prepared edits to name the edit a candidate is, and the optimizer's log, which
it links (a relative link to the file beside the page; nothing is fetched to render it).

Modules: ``data`` (the events folded), ``stats`` (error bars), ``diffs`` (candidate
diffs and prepared edits), ``markup`` (escaping, tables), ``plots`` (inline SVG),
``sections``, ``search`` and ``heldout`` (the sections), ``page`` (the page).
"""

from holedger.replay.html.data import RunData, collect_run, fold_records
from holedger.replay.html.page import (
    SECTION_IDS,
    Sources,
    build_report,
    render_html,
    write_report,
)

__all__ = [
    "SECTION_IDS",
    "RunData",
    "Sources",
    "build_report",
    "collect_run",
    "fold_records",
    "render_html",
    "write_report",
]
