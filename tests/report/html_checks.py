"""Checks that an HTML report is well formed, self-contained, and holds every section."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from holedger.replay.html import SECTION_IDS

VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}
# SVG elements this page writes as self-closing tags (<line/>, <rect/>, ...).
URL_ATTRS = {"src", "href", "srcset", "action", "formaction", "data", "poster", "xlink:href"}


class PageParser(HTMLParser):
    """Parses a page strictly: every non-void element closed, in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.tags: dict[str, int] = {}
        self.resources: list[tuple[str, str, str]] = []
        self.style_text: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "style":
            self._in_style = True

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._start(tag, attrs)

    def _start(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name, value in attrs:
            if name == "id" and value:
                self.ids.append(value)
            if name in URL_ATTRS and value is not None:
                self.resources.append((tag, name, value))
            if name == "style" and value and "url(" in value:
                self.resources.append((tag, name, value))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack:
            self.errors.append(f"</{tag}> closes nothing")
            return
        if self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1]}>")
            return
        self.stack.pop()
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style_text.append(data)


def _beside(href: str) -> bool:
    """A link to a file beside the page (no scheme, no host, no absolute path): the
    reader may follow it; rendering the page loads nothing from it."""
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^/", href) and ".." not in href


def parse_page(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser


def page_problems(page: str) -> list[str]:
    """Everything wrong with ``page`` as a self-contained report; empty when it is fine."""
    problems: list[str] = []
    if not page.startswith("<!DOCTYPE html>"):
        problems.append("no doctype")
    parser = parse_page(page)
    problems += parser.errors
    if parser.stack:
        problems.append(f"unclosed elements: {parser.stack}")
    for tag in ("script", "link", "img", "iframe", "object", "embed", "base"):
        if parser.tags.get(tag):
            problems.append(f"the page has a <{tag}> element")
    for tag, name, value in parser.resources:
        if not (value.startswith("#") or (tag == "a" and name == "href" and _beside(value))):
            problems.append(f"<{tag} {name}={value!r}> points outside the page")
    css = "".join(parser.style_text)
    if re.search(r"url\s*\(|@import", css):
        problems.append("the stylesheet loads something (url() or @import)")
    for sid in SECTION_IDS:
        if sid not in parser.ids:
            problems.append(f"section {sid!r} is missing")
    duplicates = {i for i in parser.ids if parser.ids.count(i) > 1}
    if duplicates:
        problems.append(f"duplicate ids: {sorted(duplicates)}")
    return problems
