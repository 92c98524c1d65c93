"""The HTML report of one run: a single self-contained page, readable offline.

Everything is inline: the CSS in a ``<style>`` element and every plot as inline SVG. The
page loads nothing: no script, no font, no image, no stylesheet from anywhere, so it can
be mailed, archived, or opened on an air-gapped machine.

Every section renders from one typed value, the run's :class:`Timeline`, built in the
same replay as the verdict (``replay_timeline``): the verified events as typed payloads
(a break in the log ends them, and the page says where), the seed-baseline run's scores
from its own replay, and what replay concluded, so the page says exactly what
``holedger replay`` says. Beside the ledger it may read (:class:`Sources`) the run's
candidate repository for each candidate's diff, the task's prepared edits to name the
edit a candidate is, and the optimizer's log, which it links (a relative link to the file
beside the page; nothing is fetched to render it).

Modules: ``timeline`` (the typed timeline and the fold that builds it), ``verdict`` (the
replay report, typed), ``stats`` (error bars), ``diffs`` (candidate diffs and prepared
edits), ``markup`` (escaping, tables), ``plots`` (inline SVG), ``sections``, ``search``,
``heldout`` and ``evolve`` (the sections), ``page`` (the page, and the replay that builds it).
"""

from holedger.replay.html.page import (
    SECTION_IDS,
    Sources,
    render_html,
    replay_timeline,
    with_sources,
    write_report,
)
from holedger.replay.html.timeline import Timeline

__all__ = [
    "SECTION_IDS",
    "Sources",
    "Timeline",
    "render_html",
    "replay_timeline",
    "with_sources",
    "write_report",
]
