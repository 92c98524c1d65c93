"""How long the HDA significance gate takes: a paired bootstrap with B = 10,000 resamples
over 200 cases (3 attempts each), the audit's default. Prints seconds; asserts nothing.

    python benchmarks/hda_gate_bench.py [--cases 200] [--resamples 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time
from fractions import Fraction

from holedger.audit.stats import paired_bootstrap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(1)
    cand, base = {}, {}
    for i in range(args.cases):
        p = rng.random()
        cand[f"case-{i:04d}"] = Fraction(sum(rng.random() < min(1, p + 0.05) for _ in range(3)), 3)
        base[f"case-{i:04d}"] = Fraction(sum(rng.random() < p for _ in range(3)), 3)
    times = []
    for seed in range(args.repeat):
        start = time.perf_counter()
        gate = paired_bootstrap(cand, base, resamples=args.resamples, seed=seed)
        times.append(time.perf_counter() - start)
    print(
        f"paired bootstrap, {args.cases} cases, B = {args.resamples}: "
        f"best {min(times):.3f} s, worst {max(times):.3f} s over {args.repeat} runs "
        f"(dS = {float(gate.delta):.4f}, p = {float(gate.p_value):.4f})"
    )


if __name__ == "__main__":
    main()
