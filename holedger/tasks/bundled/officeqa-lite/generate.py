"""Deterministic generator of the officeqa-lite demo task.

Writes, from one seed, the corpus of fictional company reports (seed/corpus/, shipped
with every candidate), the cases with their expected answers (cases/<split>.json, read
only by the trusted process); run as a script it also re-pins the split manifest and
the digests in task.toml (``holedger.tasks.pinning``). The output is byte-identical for
the same seed.
"""

from __future__ import annotations

import hashlib
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

SEED = "officeqa-lite-v1"
N_COMPANIES = 36
SPLIT_SHARES = {"dev": 1, "val": 2, "test": 2}  # fifths of every question kind
KIND_COUNTS = {
    "lookup": 35,
    "sum": 20,
    "difference": 20,
    "pct_change": 15,
    "cross_difference": 15,
    "cross_sum": 15,
}
METRICS = ("Revenue", "Operating costs", "Marketing spend")
PERIODS = tuple(f"Q{q} {y}" for y in (2022, 2023) for q in range(1, 5))

FIRST = (
    "Amber",
    "Boreal",
    "Cobalt",
    "Dunmore",
    "Elder",
    "Fenwick",
    "Granite",
    "Harbor",
    "Iris",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Marlow",
    "Northgate",
    "Orchard",
    "Pelican",
    "Quarry",
    "Redwood",
    "Saltmarsh",
    "Tamarack",
    "Umber",
    "Vantage",
    "Willow",
    "Yarrow",
)
SECOND = (
    "Logistics",
    "Foods",
    "Robotics",
    "Textiles",
    "Energy",
    "Pharma",
    "Analytics",
    "Shipping",
    "Ceramics",
    "Optics",
    "Brewing",
    "Software",
)
CITIES = ("Port Calder", "Ashby", "New Tarn", "Westmere", "Holloway", "Brightwater", "Caskfield")
SENTENCES = (
    "{name} is a fictional company headquartered in {city}.",
    "It was founded in {founded} and serves customers in {regions} regions.",
    "The board approved a new five-year plan during the year under review.",
    "Management reports all amounts in thousands of US dollars, unaudited.",
    "The company opened a second site near {city} and expanded its sales team.",
    "Seasonal demand usually peaks in the third quarter for this business.",
    "A one-off restructuring charge is included in operating costs.",
    "Marketing spend covers trade fairs, online campaigns and sponsorships.",
)


class Rng:
    """A portable PRNG: SHA-256 of the seed and a counter."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self.counter = 0

    def below(self, n: int) -> int:
        self.counter += 1
        digest = hashlib.sha256(f"{self.seed}:{self.counter}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % n

    def between(self, low: int, high: int) -> int:
        return low + self.below(high - low + 1)

    def shuffle(self, items: list[Any]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def make_companies(rng: Rng) -> list[dict[str, Any]]:
    names = [f"{a} {b}" for a in FIRST for b in SECOND]
    rng.shuffle(names)
    return [make_company(rng, name) for name in sorted(names[:N_COMPANIES])]


def make_company(rng: Rng, name: str) -> dict[str, Any]:
    revenue = rng.between(800, 6000)
    table: dict[str, dict[str, int]] = {}
    cost_ratio = rng.between(60, 95)
    marketing_ratio = rng.between(4, 12)
    for period in PERIODS:
        revenue = max(300, revenue * (100 + rng.between(-9, 12)) // 100)
        costs = revenue * (cost_ratio + rng.between(-4, 4)) // 100
        marketing = revenue * (marketing_ratio + rng.between(-2, 2)) // 100
        table[period] = {"Revenue": revenue, "Operating costs": costs, "Marketing spend": marketing}
    n_sentences = rng.between(1, 5)
    picks = [0, *sorted({1 + rng.below(len(SENTENCES) - 1) for _ in range(n_sentences)})]
    words = {
        "name": name,
        "city": CITIES[rng.below(len(CITIES))],
        "founded": 1950 + rng.below(70),
        "regions": 2 + rng.below(9),
    }
    narrative = " ".join(SENTENCES[i].format(**words) for i in picks)
    return {
        "name": name,
        "table": table,
        "narrative": narrative,
        "employees": rng.between(40, 4000),
    }


def render_document(company: dict[str, Any]) -> str:
    lines = [f"# {company['name']}: Annual Report 2023", "", company["narrative"], ""]
    lines.append("Quarterly results (USD thousands)")
    lines.append("| Quarter | " + " | ".join(METRICS) + " |")
    lines.append("|---" * (len(METRICS) + 1) + "|")
    for period in PERIODS:
        cells = " | ".join(f"{company['table'][period][m]:,}" for m in METRICS)
        lines.append(f"| {period} | {cells} |")
    lines += ["", f"Employees at the end of 2023: {company['employees']:,}.", ""]
    return "\n".join(lines)


def _pct(old: int, new: int) -> Decimal:
    value = (Decimal(new) - Decimal(old)) / Decimal(old) * 100
    return value.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)


def make_question(rng: Rng, kind: str, companies: list[dict[str, Any]]) -> dict[str, Any]:
    first = companies[rng.below(len(companies))]
    second = first
    while second is first:
        second = companies[rng.below(len(companies))]
    metric = METRICS[rng.below(len(METRICS))]
    m = metric.lower()
    c1, c2 = first["name"], second["name"]
    p1 = PERIODS[rng.below(len(PERIODS))]
    p2 = p1
    while p2 == p1:
        p2 = PERIODS[rng.below(len(PERIODS))]
    if PERIODS.index(p2) < PERIODS.index(p1):
        p1, p2 = p2, p1
    t1 = first["table"]
    tolerance = "0"
    if kind == "lookup":
        text = f"What was the {m} of {c1} in {p1}? Give the amount in USD thousands."
        value = Decimal(t1[p1][metric])
    elif kind == "sum":
        year = p1[3:]
        text = f"What was the total {m} of {c1} over the four quarters of {year}, in USD thousands?"
        value = Decimal(sum(t1[f"Q{q} {year}"][metric] for q in range(1, 5)))
    elif kind == "difference":
        text = (
            f"By how much did the {m} of {c1} change from {p1} to {p2}, in USD thousands? "
            "Give a negative number if it fell."
        )
        value = Decimal(t1[p2][metric] - t1[p1][metric])
    elif kind == "pct_change":
        text = (
            f"What was the percentage change in the {m} of {c1} from {p1} to {p2}? "
            "Round to one decimal place."
        )
        value = _pct(t1[p1][metric], t1[p2][metric])
        tolerance = "0.1"
    elif kind == "cross_difference":
        text = (
            f"How much higher was the {m} of {c1} than that of {c2} in {p1}, in USD "
            "thousands? Give a negative number if it was lower."
        )
        value = Decimal(t1[p1][metric] - second["table"][p1][metric])
    else:
        text = f"What was the combined {m} of {c1} and {c2} in {p1}, in USD thousands?"
        value = Decimal(t1[p1][metric] + second["table"][p1][metric])
    return {
        "input": {"question": text},
        "expected": {"kind": kind, "value": str(value), "tolerance": tolerance},
    }


def generate(root: Path, seed: str = SEED) -> None:
    """Write seed/corpus/ and cases/ under ``root`` (the task folder)."""
    rng = Rng(seed)
    companies = make_companies(rng)
    corpus = root / "seed" / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for old in corpus.glob("*.txt"):
        old.unlink()
    for company in companies:
        (corpus / f"{slug(company['name'])}.txt").write_text(render_document(company))
    by_split: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLIT_SHARES}
    seen: set[str] = set()
    for kind, count in KIND_COUNTS.items():
        questions: list[dict[str, Any]] = []
        while len(questions) < count:
            question = make_question(rng, kind, companies)
            if question["input"]["question"] not in seen:
                seen.add(question["input"]["question"])
                questions.append(question)
        # Stratified: every split gets the same share of every question kind.
        start = 0
        for split, share in SPLIT_SHARES.items():
            size = count * share // sum(SPLIT_SHARES.values())
            by_split[split].extend(questions[start : start + size])
            start += size
    cases_dir = root / "cases"
    cases_dir.mkdir(exist_ok=True)
    for split, questions in by_split.items():
        rng.shuffle(questions)
        cases = [
            {"id": f"oql-{split}-{offset + 1:03d}", **question}
            for offset, question in enumerate(questions)
        ]
        text = json.dumps(cases, indent=1, sort_keys=True) + "\n"
        (cases_dir / f"{split}.json").write_text(text)


if __name__ == "__main__":
    from holedger.tasks.pinning import pin_task

    here = Path(__file__).resolve().parent
    generate(here)
    pin_task(here)
