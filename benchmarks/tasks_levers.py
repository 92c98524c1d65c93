"""Mean verifier score of the officeqa-lite seed, of the seed plus each prepared edit, and
of all edits together, against the offline simulator (K=3, seed 0), per split.

Run from the repository root: ``python benchmarks/tasks_levers.py [--splits dev,val,test]``.
Trials run in this process (see tests/tasks/offline_eval.py), so the figures come in
seconds; the wall time of each row is printed beside it, as a figure, never a threshold.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from holedger.tasks import load_task
from holedger.tasks.edits import load_edits
from tests.tasks.offline_eval import mean_score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--splits", default="dev,val,test")
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    splits = args.splits.split(",")
    task = load_task("officeqa-lite")
    edits = load_edits(task.root)
    scored: dict[str, list[tuple[dict[str, Any], Any]]] = {
        split: [
            (case.input, (lambda c: lambda answer: task.verify(c, answer))(case))
            for case in task.cases(split)
        ]
        for split in splits
    }
    rows: list[tuple[str, list[Any]]] = [("seed", [])]
    rows += [(f"+ {edit.name}", [edit]) for edit in edits]
    rows.append(("all edits", list(edits)))
    print(f"{'harness':34}" + "".join(f"{s:>8}" for s in splits) + f"{'seconds':>10}")
    for label, chosen in rows:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "candidate"
            shutil.copytree(task.seed_dir, tree)
            for edit in chosen:
                edit.apply(tree)
            started = time.perf_counter()
            means: list[Fraction] = [mean_score(tree, scored[s], k=args.k) for s in splits]
            seconds = time.perf_counter() - started
        print(f"{label:34}" + "".join(f"{float(m):8.3f}" for m in means) + f"{seconds:10.1f}")


if __name__ == "__main__":
    main()
