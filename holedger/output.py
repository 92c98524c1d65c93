"""Shared command-line plumbing: settings from the click context, JSON output, tables."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from holedger.config import Settings
from holedger.numbers import for_json
from holedger.untrusted import escape_text, is_safe


def settings(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


_json_written = False


def emit_json(data: Any) -> None:
    """One JSON document on stdout (scripts read it). Every Fraction in ``data`` is given
    as a number and, beside it, its exact string (``holedger.numbers``)."""
    global _json_written
    click.echo(json.dumps(for_json(data), indent=2, sort_keys=False, default=str))
    _json_written = True


def json_written(reset: bool = False) -> bool:
    """Whether this command has written its JSON document already (``reset``: forget it,
    as a new command starts). A command that prints its report and then fails with an exit
    status (``task verify`` of a damaged task) has said all; no error document follows."""
    global _json_written
    written = _json_written
    if reset:
        _json_written = False
    return written


def pipe_closed() -> None:
    """The reader closed the pipe (`holedger replay RUN | head -1`): stop quietly, with the
    status of a process that SIGPIPE ended, not 1 (which means "failed")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's own exits 1
        pipe_closed()

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # Whatever the text came from (an event's detail, a path, a name), no control
        # character or escape sequence of it reaches the terminal; rich's own styles are
        # control segments, and stay.
        return super()._render_buffer(
            segment if segment.control else Segment(_shown(segment.text), *segment[1:])
            for segment in buffer
        )


def _shown(text: str) -> str:
    return text if is_safe(text, keep="\n\t") else escape_text(text, keep="\n\t")


def plain(value: object) -> str:
    """``value`` as text to put inside console markup: its brackets are shown as they are
    (a reason such as "[judged on seq 0 to 14 only ...]" is data, not a style tag)."""
    return escape(str(value))


# The width of output that is not a terminal: wide enough that no line is ever wrapped.
UNWRAPPED = 1 << 20


def console(stderr: bool = False, **options: Any) -> Console:
    """A console for stdout (or stderr). On a terminal, text and tables fit its width.
    Anywhere else (a pipe, a file, a log) nothing is wrapped, whatever the width of the
    terminal the command was started from, unless COLUMNS says a width: a key, a digest,
    a path or a run id comes out whole on one line, to be copied or searched for, and a
    table is as wide as its cells."""
    options.setdefault("soft_wrap", False)
    out = _Console(stderr=stderr, highlight=False, **options)
    if "width" not in options and not out.is_terminal and not _columns_given():
        out.width = UNWRAPPED
    return out


def _columns_given() -> bool:
    return os.environ.get("COLUMNS", "").isdigit()


class OutputTable:
    """A table that lays itself out for where it is printed.

    On a terminal (or where COLUMNS names a width): a boxed table that fits the width.
    The columns named in ``whole`` (ids a user copies) are never shortened or wrapped:
    the other columns give way. In the columns named in ``fold`` (prose that may hold a
    key or a digest) a word too long for the column goes on over the next lines; any
    other cell too long for its column is cut short with an ellipsis.

    Anywhere else (a pipe, a file, a log): plain lines, no box and no padding, so that every cell
    comes out whole and ``cut``, ``awk -F'\t'`` or a spreadsheet read it. The title (when
    there is one) on a line of its own as ``# title``, then the column names, then one line
    per row, cells separated by a tab. A tab, a newline or a backslash inside a cell is
    written ``\t``, ``\n``, ``\\``, so a row stays one line.

    Cells are plain text: a bracket in them is shown, never read as markup.
    """

    def __init__(
        self,
        title: str | None,
        columns: list[str],
        rows: list[list[Any]],
        whole: tuple[str, ...] = (),
        fold: tuple[str, ...] = (),
    ) -> None:
        self.title = title
        self.columns = list(columns)
        # escaped before layout, so a box is as wide as what it shows
        self.cells = [[escape_text(str(cell), keep="\n\t\r") for cell in row] for row in rows]
        self.whole = whole
        self.fold = fold

    def boxed(self) -> Table:
        """The terminal layout."""
        tbl = Table(title=self.title, show_lines=False)
        for index, col in enumerate(self.columns):
            if col in self.whole:
                widest = max([len(col), *(len(row[index]) for row in self.cells)])
                tbl.add_column(col, no_wrap=True, min_width=widest)
            else:
                tbl.add_column(col, overflow="fold" if col in self.fold else "ellipsis")
        for row in self.cells:
            tbl.add_row(*(Text(cell) for cell in row))
        return tbl

    def plain_lines(self) -> list[str]:
        """The pipe layout, one string per line."""
        lines = [] if self.title is None else [f"# {_tsv_cell(self.title)}"]
        lines.append("\t".join(_tsv_cell(c) for c in self.columns))
        lines += ["\t".join(_tsv_cell(c) for c in row) for row in self.cells]
        return lines

    def __rich_console__(self, out: Console, options: ConsoleOptions) -> RenderResult:
        if out.is_terminal or _columns_given():
            yield self.boxed()
            return
        # raw segments: a Text would expand the tabs into spaces and wrap at the width
        for line in self.plain_lines():
            yield Segment(line)
            yield Segment.line()


def _tsv_cell(value: str) -> str:
    return escape_text(
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")
    )


def table(
    title: str | None,
    columns: list[str],
    rows: list[list[Any]],
    whole: tuple[str, ...] = (),
    fold: tuple[str, ...] = (),
) -> OutputTable:
    """A table for :meth:`Console.print`: boxed to fit a terminal, tab-separated plain
    lines anywhere else (see :class:`OutputTable`)."""
    return OutputTable(title, columns, rows, whole, fold)


def is_tty() -> bool:
    return sys.stdout.isatty()


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for long work, fed with (done, total); None, and nothing
    printed, when stderr is not a terminal (logs, pipes and scripts never see it). The
    bar is cleared when the work ends, so the result is all that stays on the screen."""
    err = console(stderr=True)
    if not err.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done))

        yield update
