"""docs/GATEWAY.md's denials table names every error the gateway answers with: each
status, type and code the gateway's source spells is a row of the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import holedger.gateway.app

GATEWAY_MD = Path(__file__).resolve().parents[2] / "docs" / "GATEWAY.md"
GATEWAY_DIR = Path(holedger.gateway.app.__file__).parent


def _code_text(code: ast.expr) -> str:
    if isinstance(code, ast.Name):  # a token state decided above: token_*
        return "token_*"
    if isinstance(code, ast.JoinedStr):
        head = code.values[0]
        assert isinstance(head, ast.Constant)
        return f"{head.value}*"
    assert isinstance(code, ast.Constant), ast.dump(code)
    return str(code.value)


def _errors() -> set[tuple[int | None, str, str]]:
    """(status or None, type, code) of every denial and error body in the gateway's
    modules (the app, the wire formats, the routing); a code built at run time
    (f"token_{state}") is its constant part and '*'."""
    found: set[tuple[int | None, str, str]] = set()
    for path in sorted(GATEWAY_DIR.rglob("*.py")):
        if path.name.startswith("sim"):
            continue  # the simulator is an upstream, not the gateway
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            args = node.args
            name = node.func.id if isinstance(node.func, ast.Name) else None
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name in ("_Denial", "Denial") and len(args) >= 3:
                status, kind, code = args[0], args[1], args[2]
            elif name == "invalid":
                given = [k.value for k in node.keywords if k.arg == "code"]
                code = given[0] if given else ast.Constant("invalid_request")
                status, kind = ast.Constant(400), ast.Constant("invalid_request_error")
            elif name == "error_body" and len(args) >= 3 and isinstance(args[1], ast.Constant):
                status, kind, code = None, args[1], args[2]  # not _deny's (a Denial's)
            elif attr in ("error_body", "stream_error") and len(args) >= 3:
                if not isinstance(args[1], ast.Constant):
                    continue  # _deny's, which passes a Denial's
                status, kind, code = args[0], args[1], args[2]
            elif attr == "error_event":
                code = args[1] if len(args) >= 2 else ast.Constant("upstream_stream_cut")
                status, kind = None, ast.Constant("upstream_error")
            else:
                continue
            if isinstance(code, ast.Name) and code.id == "code":
                continue  # a format's own helper passing its caller's code through
            assert isinstance(kind, ast.Constant)
            number = status.value if isinstance(status, ast.Constant) else None
            found.add((number, str(kind.value), _code_text(code)))
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
    assert {code for _, _, code in errors} >= {
        "unknown_run",
        "upstream_stream_cut",
        "token_*",
        "tool_not_allowed",
        "upstream_bad_usage",
    }
    rows = _rows()
    for status, kind, code in sorted(errors, key=str):
        matches = [r for r in rows if r[1] == kind and r[2] == code]
        assert matches, f"GATEWAY.md's denials table has no row for {kind} {code}"
        if status is not None:
            assert any(r[0].startswith(str(status)) for r in matches), (status, code, matches)
