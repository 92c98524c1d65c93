"""Start-to-exit overhead of each sandbox backend: ``python3 -c pass``, median of 20 runs.

Bare python (the same interpreter, as a plain child process) is measured in the same run,
interleaved with the backends (each round starting with the next one), so machine load
affects every column alike. The baseline is ``python -S -c pass``: inside a sandbox
every site-packages directory is hidden, so the host's .pth files (editable installs and
the like, often tens of ms) must not count in the sandbox's favour; ``bare+site`` shows
the host interpreter as it is. A backend's teardown
that runs after the result, off the trial's clock (bwrap removes the cgroup and closes the
sockets on a background thread), is waited for between runs, untimed, so that it never
slows the next runner down. Prints the figures, the overhead over the baseline and the
ratio, next to the targets (bwrap <= 15 ms over bare, docker <= 400 ms). Asserts nothing.

    python benchmarks/sandbox_bench.py [--runs 20] [--backends bwrap,docker,process]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from holedger.sandboxes import BACKEND_NAMES, settle
from holedger.sandboxes.registry import backend as named
from holedger.sandboxes.runtime import host_interpreter
from holedger.sandboxes.spec import Backend, Limits, SandboxSpec

TARGET_OVER_BARE_MS = {"bwrap": 15.0, "docker": 400.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--backends", default=",".join(BACKEND_NAMES))
    args = parser.parse_args()

    exe = str(host_interpreter().executable)
    backends = []
    for name in args.backends.split(","):
        backend = named(name)
        ok, why = backend.available()
        if ok:
            backends.append(backend)
        else:
            print(f"# {name}: skipped ({why})")

    with tempfile.TemporaryDirectory() as code:
        spec = SandboxSpec(
            code_dir=Path(code), argv=["python3", "-c", "pass"], limits=Limits(wall_s=30)
        )
        names = ["bare", "bare+site", *(b.name for b in backends)]
        samples: dict[str, list[float]] = {name: [] for name in names}

        def bare() -> None:
            subprocess.run([exe, "-S", "-c", "pass"], check=True)

        def bare_site() -> None:
            subprocess.run([exe, "-c", "pass"], check=True)

        def trial(backend: Backend) -> Callable[[], object]:
            return lambda: backend.run(spec)

        runners: list[tuple[str, Callable[[], object]]] = [("bare", bare), ("bare+site", bare_site)]
        runners += [(b.name, trial(b)) for b in backends]
        for _ in range(args.warmup):
            for _, fn in runners:
                fn()
                settle()
        for i in range(args.runs):
            # Each round starts with the next runner: the kernel's deferred cleanup of the
            # previous sandbox (namespaces, mounts) slows whatever runs right after it.
            for name, fn in runners[i % len(runners) :] + runners[: i % len(runners)]:
                start = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - start) * 1000)
                settle()

    base = statistics.median(samples["bare"])
    print(f"python3 -c pass, median of {args.runs} runs ({sys.version.split()[0]})")
    print(f"{'backend':<10} {'median ms':>10} {'over bare':>10} {'ratio':>7} {'target':>16}")
    for name, values in samples.items():  # bare = python -S (see the module docstring)
        med = statistics.median(values)
        target = TARGET_OVER_BARE_MS.get(name)
        verdict = ""
        if target is not None:
            verdict = f"<= {target:g} ms: {'met' if med - base <= target else 'MISSED'}"
        print(f"{name:<10} {med:>10.1f} {med - base:>+10.1f} {med / base:>6.2f}x {verdict:>16}")


if __name__ == "__main__":
    main()
