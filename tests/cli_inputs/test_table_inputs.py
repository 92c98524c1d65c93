"""A published results table as spreadsheets and people write them: a byte-order mark,
CRLF line ends, blank lines, stray quotes, numbers that are not plain decimals, a gain in
percent, a release that is not an ordinal or a date. What a spreadsheet writes reads as
what it means; everything else is one line on stderr with a hint, exit 2, no traceback."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli

GOOD = "model,harness,officeqa-lite\nA,oc,0.1\nB,oc,1/3\n"


def _grid(tmp_path: Path, body: bytes, *extra: str) -> tuple[int, str, str]:
    table = tmp_path / "t.csv"
    table.write_bytes(body)
    args = ["--home", str(tmp_path / "h"), "analysis", "grid", "--table", str(table), *extra]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    "body",
    [
        b"\xef\xbb\xbf" + GOOD.encode(),  # a spreadsheet's UTF-8 with a byte-order mark
        GOOD.replace("\n", "\r\n").encode(),
        b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode(),
        b"\n\n" + GOOD.encode(),  # blank lines above the header
    ],
)
def test_a_spreadsheet_table_reads_as_the_plain_one(tmp_path: Path, body: bytes) -> None:
    code, out, err = _grid(tmp_path, body, "--json")
    assert code == 0, err
    cells = {(c["model"], Fraction(c["mean_g_exact"])) for c in json.loads(out)["cells"]}
    assert cells == {("A", Fraction(1, 10)), ("B", Fraction(1, 3))}


BAD = [
    ("model,harness,officeqa-lite\n", "no row below the header"),
    ("\n\n", "empty"),
    ("model,harness,officeqa-lite,\nA,oc,0.1,\n", "column 4 has no name"),
    ('model,harness,officeqa-lite\nA,oc,"0.1\n', "cannot be read as CSV"),
    ("model,harness,officeqa-lite\nA,oc,1_000\n", "'1_000' is not a number"),
    ("model,harness,officeqa-lite\nA,oc,\u0661\n", "is not a number"),  # an Arabic-Indic 1
    ("model,harness,officeqa-lite\nA,oc,Infinity\n", "'Infinity' is not a number"),
    ("model,harness,officeqa-lite\nA,oc,12.5\n", "12.5 is above 1"),
    ("model,harness,officeqa-lite\nA,oc,1e400\n", "1e400 is above 1"),
    ("model,harness,officeqa-lite\nA,oc,-1e400\n", "not a plausible normalized gain"),
    (
        "model,harness,family,release,officeqa-lite\nA,oc,F,v2,0.1\n",
        "row 2, column 'release': 'v2'",
    ),
    ("model,harness,officeqa-lite\nA\x07,oc,0.1\n", "row 2, column 'model'"),
]


@pytest.mark.parametrize(("text", "needle"), BAD)
def test_a_bad_table_is_one_line_with_a_hint(tmp_path: Path, text: str, needle: str) -> None:
    code, out, err = _grid(tmp_path, text.encode())
    assert code == 2, (out, err)
    assert needle in err and "t.csv" in err
    assert "(hint: " in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and out == ""


def test_a_table_in_utf16_is_refused_with_a_hint(tmp_path: Path) -> None:
    code, _, err = _grid(tmp_path, GOOD.encode("utf-16"))
    assert code == 2 and "cannot be read as CSV" in err and "UTF-8" in err


@pytest.mark.parametrize("band", ["s=1e400", "s=2", "s=0_1", "s=nan", " =0.1", "s=-0.1"])
def test_a_band_outside_0_to_1_is_refused(tmp_path: Path, band: str) -> None:
    code, out, err = _grid(tmp_path, b"model,harness,s\nA,oc,0.1\nB,oc,0.3\n", "--band", band)
    assert code == 2, out
    assert "--band" in err and "[0, 1]" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["1e400", "2", "nan", "0_1"])
def test_a_tier_resolution_outside_0_to_1_is_refused(tmp_path: Path, value: str) -> None:
    table = tmp_path / "t.csv"
    table.write_text(GOOD)
    args = ["--home", str(tmp_path / "h"), "analysis", "lss", "--table", str(table)]
    result = CliRunner().invoke(cli, [*args, "--resolution", value])
    assert result.exit_code == 2, result.output
    assert "--resolution" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model,harness,officeqa-lite,officeqa-lite\nA,oc,0.1,0.2\n", "'officeqa-lite' appears"),
        ("model,harness,officeqa-lite\nA,oc,0.1,0.2\n", "row 2: 4 fields"),
        ("model,harness,officeqa-lite\n,oc,0.1\n", "row 2: empty model"),
        ("model,harness,officeqa-lite\nA,oc,0.1\nA,oc,0.2\n", "row 3: duplicate row"),
        ("model,harness,scope,officeqa-lite\nA,oc,NATIVE,0.1\n", "scope 'NATIVE'"),
    ],
)
def test_every_row_error_has_a_hint(tmp_path: Path, text: str, needle: str) -> None:
    code, _, err = _grid(tmp_path, text.encode())
    assert code == 2 and needle in err and "(hint: " in err, err
