"""docs/GATEWAY.md's denials table names every error the gateway answers with: each
status, type and code the gateway's source spells is a row of the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import holedger.gateway.app

GATEWAY_MD = Path(__file__).resolve().parents[2] / "docs" / "GATEWAY.md"


def _errors() -> set[tuple[int | None, str, str]]:
    """(status or None, type, code) of every _Denial and error_body in the gateway; a
    code built at run time (f"token_{state}") is its constant part and '*'."""
    tree = ast.parse(Path(holedger.gateway.app.__file__).read_text())
    found: set[tuple[int | None, str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        args = node.args
        if node.func.id == "_Denial" and len(args) >= 3:
            status, kind, code = args[0], args[1], args[2]
        elif node.func.id == "error_body" and isinstance(args[1], ast.Constant):
            status, kind, code = None, args[1], args[2]  # not _deny's, which passes a _Denial's
        else:
            continue
        if isinstance(code, ast.Name):  # a token state decided above: token_*
            code_text = "token_*"
        elif isinstance(code, ast.JoinedStr):
            head = code.values[0]
            assert isinstance(head, ast.Constant)
            code_text = f"{head.value}*"
        else:
            assert isinstance(code, ast.Constant), ast.dump(code)
            code_text = str(code.value)
        assert isinstance(kind, ast.Constant)
        number = status.value if isinstance(status, ast.Constant) else None
        found.add((number, str(kind.value), code_text))
    return found


def _rows() -> list[tuple[str, str, str]]:
    text = GATEWAY_MD.read_text()
    section = text[text.index("## Denials") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.match(r"\d{3}", cells[0]):
            rows.append((cells[0], cells[1].strip("`"), cells[2].strip("`")))
    return rows


def test_every_error_the_gateway_answers_is_a_row_of_the_denials_table() -> None:
    errors = _errors()
    assert {code for _, _, code in errors} >= {"unknown_run", "upstream_stream_cut", "token_*"}
    rows = _rows()
    for status, kind, code in sorted(errors, key=str):
        matches = [r for r in rows if r[1] == kind and r[2] == code]
        assert matches, f"GATEWAY.md's denials table has no row for {kind} {code}"
        if status is not None:
            assert any(r[0].startswith(str(status)) for r in matches), (status, code, matches)
