"""The text of `holedger analysis capabilities`: per grid, the pass rates with Base and
harness-benefit per agent and harness-updating per evolver, then the derived
comparisons, the regression cells and the readings the numbers rest on."""

from __future__ import annotations

from typing import Any

import click

from holedger.numbers import decimal
from holedger.output import console, plain, table


def _q(value: Any, signed: bool = False) -> str:
    if value is None:
        return "-"
    text = decimal(value)
    return f"+{text}" if signed and not text.startswith("-") else text


def _grid(out: Any, g: dict[str, Any]) -> None:
    agents = [b["agent"] for b in g["base"]]
    evolvers = g["evolvers"]
    j = {(c["agent"], c["evolver"]): c["j"] for c in g["cells"]}
    base = {b["agent"]: b["base"] for b in g["base"]}
    ben = {b["agent"]: b for b in g["benefit"]}
    anchors = g["anchors"]
    mark_a = set(anchors["agents"])
    mark_e = set(anchors["evolvers"])
    rows = []
    for f in agents:
        best = ben[f]
        rows.append(
            [
                f + (" *" if f in mark_a else ""),
                _q(base[f]),
                *(_q(j.get((f, e))) for e in evolvers),
                _q(best["benefit"], signed=True),
            ]
        )
    ups = {u["evolver"]: u["updating"] for u in g["updating"]}
    rows.append(["updating (mean)", "", *(_q(ups[e], signed=True) for e in evolvers), ""])
    heads = ["agent", "NONE", *(e + (" *" if e in mark_e else "") for e in evolvers)]
    title = f"{g['benchmark']} ({g['source']}): pass rate J; benefit and updating as gains"
    out.print(table(title, [*heads, "benefit (max)"], rows))
    how = "complete rows and columns" if anchors["chosen"] == "default" else "given"
    out.print(
        plain(
            f"anchors ({how}, marked *): agents {', '.join(anchors['agents']) or 'none'}; "
            f"evolvers {', '.join(anchors['evolvers']) or 'none'}"
        ),
        soft_wrap=True,
    )
    if not anchors["agents"] or not anchors["evolvers"]:
        out.print(
            plain(
                "no anchor agents or evolvers: updating and benefit need them "
                "(hint: name them with --anchor-agent and --anchor-evolver)"
            ),
            soft_wrap=True,
        )
    unbased = [f for f in g["agents"] if f not in base]
    if unbased:
        out.print(plain(f"no NONE base, so in no measure: {', '.join(unbased)}"), soft_wrap=True)
    spread = g["evolver_spread"]
    if spread["spread"] is not None:
        out.print(
            plain(
                f"evolver spread: {_q(spread['spread'])} (top {', '.join(spread['top'])}; "
                f"bottom {', '.join(spread['bottom'])})"
            ),
            soft_wrap=True,
        )
        parts = [f"{d['agent']} {_q(d['delta'], True)}" for d in spread["breakdown"]["deltas"]]
        out.print(plain(f"breakdown of {spread['breakdown']['evolver']}: {'; '.join(parts)}"))
    wb = g["within_between"]
    if wb["between"] is not None:
        within = "; ".join(f"{w['agent']} {_q(w['range'])}" for w in wb["within"])
        out.print(
            plain(
                f"within-agent range over evolvers: {within}; between anchors' Base: "
                f"{_q(wb['between'])}"
            ),
            soft_wrap=True,
        )
    ext = g["extreme_pairing"]
    if ext is not None:
        out.print(
            plain(
                f"extreme pairing: J({ext['strongest']}, {ext['worst_evolver']}) "
                f"{_q(ext['j_strongest_worst'])} - J({ext['weakest']}, {ext['best_evolver']}) "
                f"{_q(ext['j_weakest_best'])} = {_q(ext['difference'], True)}"
            ),
            soft_wrap=True,
        )
    head = "; ".join(
        f"{h['agent']} {_q(h['headroom'])} / {_q(h['benefit'], True)}" for h in g["headroom"]
    )
    out.print(plain(f"headroom 1 - Base / benefit: {head}"), soft_wrap=True)
    reg = g["regressions"]
    below = ", ".join(f"{c['agent']} x {c['evolver']}" for c in reg["regression_cells"])
    ties = ", ".join(f"{c['agent']} x {c['evolver']}" for c in reg["tie_cells"])
    out.print(
        plain(
            f"regression cells (strictly below NONE): {reg['regressions']} of {reg['cells']}"
            f"{': ' + below if below else ''}; ties with NONE: {reg['ties']}"
            f"{': ' + ties if ties else ''}"
        ),
        soft_wrap=True,
    )
    for reading in g["readings"]:
        out.print(plain(f"reading: {reading}"), soft_wrap=True)


def render(doc: dict[str, Any]) -> None:
    """Print the document `analysis capabilities --json` would give, as text."""
    if doc.get("unverified_notice"):
        click.echo(doc["unverified_notice"])
    out = console()
    if not doc["grids"]:
        click.echo(f"no scored runs (hint: 'holedger demo' scores one); {doc['note']}")
        return
    out.print(plain(f"source: {doc['source_detail']}"), soft_wrap=True)
    for g in doc["grids"]:
        _grid(out, g)
    across = doc["across_benchmarks"]
    if len(doc["grids"]) > 1:
        winners = ", ".join(across["wins_every_benchmark"]) or "none"
        out.print(plain(f"an evolver on top of every benchmark: {winners}"))
    for item in doc["agents_left_out"]:
        out.print(plain(f"left out: {item['agent']}: {item['why']}"), soft_wrap=True)
    if doc["note"] != doc.get("unverified_notice"):
        out.print(plain(doc["note"]), soft_wrap=True)
