"""Two revisions measured side by side, each with its own code, in one run.

    python benchmarks/compare_revisions.py [BEFORE] [AFTER] [--rounds 2] [--demo-runs 2]
        [--gateway-requests 1500] [--no-demo | --demo-parallel] [--only ledger,gateway,demo]
        [--log FILE] [--json]
    python benchmarks/compare_revisions.py --from-log FILE

BEFORE defaults to the tree before the shared rules moved to ``holedger/protocol/`` (the
parent of that change), AFTER to HEAD. Each revision is checked out as a temporary git
worktree outside the repository (removed at the end) and measured with its own package
and its own benchmark scripts (``PYTHONPATH`` set to that worktree):

* replay rate against raw verify, 1 process and 2 processes, and batched signed append
  against unsigned (``ledger_bench.py --quick --no-pg --million 0``);
* the gateway's CPU per call at 32 clients on an instant upstream, and that against the
  bare floor proxy's in the same run (``gateway_bench.py --levels 32 --no-litellm``);
* the wall time of ``python -m holedger --home NEW demo --json`` (a fresh home, so each
  demo also pins the seed baseline), its CPU time (the demo's process and every process
  it waited for: sandboxes, the optimizer; on a loaded machine the wall time is mostly
  waiting for a core, the CPU time much less so), and how many trials it ran.

The measurements alternate: before, after, before, after, ... for each of them, so both
revisions share the machine's load (the ledger's, then the gateway's, then the demos);
each revision runs ``--rounds`` times, and the spread between two runs of the same
revision is the noise. The table gives per figure the mean
of each revision's runs, after / before, the noise (the larger relative spread, max - min
over mean, of the two revisions' runs) and a verdict: "worse" when after is worse than
before by more than the noise, in the figure's bad direction. The load average is printed
beside every measurement. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

# The tree before the shared rules moved to holedger/protocol/ (the parent of that change).
BEFORE = "64a45647dca3d36d1b68f856cf1f30fcc5493e74"


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool | None  # None: shown, no verdict
    unit: str = ""


METRICS = (
    Metric("replay_1p", "replay / raw verify, 1 process", True),
    Metric("replay_2p", "replay / raw verify, 2 processes", True),
    Metric("append_batched", "batched signed / unsigned append (stock)", True),
    Metric("append_batched_own", "batched signed / unsigned (holedger recorder)", True),
    Metric("gateway_cpu_ms", "gateway CPU per call at 32 clients", False, "ms"),
    Metric("gateway_over_floor", "gateway CPU / floor proxy CPU per call", False),
    Metric("demo_wall_s", "demo wall time (fresh home)", False, "s"),
    Metric("demo_cpu_s", "demo CPU time, all its processes", False, "s"),
    Metric("demo_trials", "demo trials (baseline and run)", None),
)


# ---------------------------------------------------------------------------- pure parts


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def spread(values: list[float]) -> float | None:
    """(max - min) / mean of one revision's runs; None with fewer than two runs."""
    if len(values) < 2:
        return None
    m = mean(values)
    return (max(values) - min(values)) / m if m else None


@dataclass
class Row:
    metric: Metric
    before: float | None
    after: float | None
    ratio: float | None
    noise: float | None
    verdict: str


def judge(metric: Metric, before: list[float], after: list[float]) -> Row:
    """One line of the table from the figures of each revision's runs.

    The noise is the larger of the two revisions' spreads (two runs of the same code);
    the verdict compares after / before with it in the figure's bad direction."""
    b = mean(before) if before else None
    a = mean(after) if after else None
    ratio = a / b if a is not None and b else None
    spreads = [s for s in (spread(before), spread(after)) if s is not None]
    noise = max(spreads) if len(spreads) == 2 else None
    if ratio is None:
        verdict = "not measured"
    elif metric.higher_is_better is None:
        verdict = "(no verdict)"
    elif noise is None:
        verdict = "no noise figure"
    else:
        worse_by = (1 - ratio) if metric.higher_is_better else (ratio - 1)
        if worse_by > noise:
            verdict = "WORSE beyond noise"
        elif -worse_by > noise:
            verdict = "better beyond noise"
        else:
            verdict = "within noise"
    return Row(metric, b, a, ratio, noise, verdict)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    head = ("figure", "before", "after", "after/before", "same-code noise", "verdict")
    lines = [head]
    for r in rows:
        unit = f" {r.metric.unit}" if r.metric.unit else ""
        digits = 0 if r.metric.key == "demo_trials" else (1 if unit == " s" else 2)
        lines.append(
            (
                r.metric.label,
                _fmt(r.before, digits) + (unit if r.before is not None else ""),
                _fmt(r.after, digits) + (unit if r.after is not None else ""),
                _fmt(r.ratio),
                "-" if r.noise is None else f"{100 * r.noise:.0f}%",
                r.verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


_NUM = r"([0-9.]+|inf)"


def parse_ledger(text: str) -> dict[str, float]:
    """The figures of ``ledger_bench.py``'s output (same format before and after)."""
    out: dict[str, float] = {}
    pattern = r"^\s+SQLite\s+(\d+) per tx\s+" + r"\s+".join([_NUM] * 5) + r"\s*$"
    for m in re.finditer(pattern, text, re.M):
        if int(m.group(1)) > 1:  # the batched line, not one event per transaction
            out["append_batched"] = float(m.group(5))
            out["append_batched_own"] = float(m.group(6))
    for key, label in (("replay_1p", r"1 process"), ("replay_2p", r"\d+ processes")):
        found = re.search(
            rf"^\s+{label}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s*$",
            text.split("3. replay", 1)[-1],
            re.M,
        )
        if found:
            out[key] = float(found.group(3))
    return out


def parse_gateway(text: str) -> dict[str, float]:
    """The gateway's and the floor's CPU per call from ``gateway_bench.py``'s table
    (columns p50 p99 req/s errors +p50 +p99 proxy ...; the same before and after)."""
    cpu: dict[str, float] = {}
    for name in ("gateway", "floor"):
        m = re.search(rf"^  {name}\s+([0-9.]+\s.*)$", text, re.M)
        if m:
            fields = m.group(1).split()
            cpu[name] = float(fields[6])
    out: dict[str, float] = {}
    if "gateway" in cpu:
        out["gateway_cpu_ms"] = cpu["gateway"]
        if cpu.get("floor"):
            out["gateway_over_floor"] = cpu["gateway"] / cpu["floor"]
    return out


# ---------------------------------------------------------------------------- running


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@contextmanager
def worktrees(repo: Path, commits: dict[str, str]) -> Iterator[dict[str, Path]]:
    """A detached worktree of each commit in a new temporary folder, removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="holedger-compare-"))
    made: dict[str, Path] = {}
    try:
        for label, commit in commits.items():
            path = tmp / label
            git(repo, "worktree", "add", "--detach", str(path), commit)
            made[label] = path
        yield made
    finally:
        for path in made.values():
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
                capture_output=True,
                check=False,
            )
        git(repo, "worktree", "prune")
        shutil.rmtree(tmp, ignore_errors=True)


def child_env(tree: Path) -> dict[str, str]:
    """This process's environment with only ``tree`` on PYTHONPATH and no holedger
    settings (home, ledger) that would point a measurement elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLEDGER_")}
    env["PYTHONPATH"] = str(tree)
    return env


def check_tree(tree: Path) -> None:
    """The package a child imports is the worktree's own."""
    out = subprocess.run(
        [sys.executable, "-c", "import holedger; print(holedger.__file__)"],
        env=child_env(tree),
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: holedger imported from {out}, not from the worktree")


@dataclass
class Measurement:
    name: str
    label: str
    figures: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    error: str = ""


@dataclass
class ChildRun:
    stdout: str
    wall_s: float
    cpu_s: float  # user + system of the child and every descendant it waited for


LIVE: set[int] = set()  # process groups of the children still running


def stop_children() -> None:
    """Kill what this script started and left running (when it is stopped itself)."""
    for pgid in list(LIVE):
        with suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def run_child(tree: Path, argv: list[str], timeout: float) -> ChildRun:
    """``argv`` in ``tree`` with its own package. Its CPU time comes from its own exit
    (wait4), so children run at the same time are measured apart; on a timeout its whole
    process group (it and what it started) is killed."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, env=child_env(tree), cwd=tree, stdout=out, stderr=err, start_new_session=True
        )
        LIVE.add(proc.pid)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            LIVE.discard(proc.pid)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if expired.is_set():
            with suppress(ProcessLookupError):  # what it started and left behind
                os.killpg(proc.pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(argv, timeout)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {proc.returncode}: {' | '.join(tail)}")
    return ChildRun(stdout, wall, usage.ru_utime + usage.ru_stime)


def measure_ledger(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    script = str(tree / "benchmarks" / "ledger_bench.py")
    argv = [sys.executable, script, "--quick", "--no-pg", "--million", "0"]
    return parse_ledger(run_child(tree, argv, 1800).stdout)


def measure_gateway(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    script = str(tree / "benchmarks" / "gateway_bench.py")
    argv = [sys.executable, script, "--levels", "32", "--no-litellm"]
    argv += ["--requests", str(args.gateway_requests), "--rounds", str(args.gateway_rounds)]
    return parse_gateway(run_child(tree, argv, 1800).stdout)


TRIALS = """
import sys
from pathlib import Path
from holedger.config import Settings
from holedger.ledger.store import Ledger
ledger = Ledger.open(Settings.resolve(Path(sys.argv[1])).ledger_url, None, create_tables=False)
print(sum(1 for info in ledger.runs() for r in ledger.records(info.run_id)
          if r.type == "TrialCompleted"))
ledger.close()
"""


def measure_demo(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="holedger-compare-home-") as tmp:
        home = str(Path(tmp) / "home")
        argv = [sys.executable, "-m", "holedger", "--home", home, "demo", "--json"]
        demo = run_child(tree, argv, args.demo_timeout)
        summary = json.loads(demo.stdout)
        if not summary.get("verified"):
            raise RuntimeError(f"the demo's run did not verify: {summary.get('run_id')}")
        trials = run_child(tree, [sys.executable, "-c", TRIALS, home], 300).stdout
        return {
            "demo_wall_s": demo.wall_s,
            "demo_cpu_s": demo.cpu_s,
            "demo_trials": float(trials.strip()),
        }


MEASURES: dict[str, Callable[[Path, argparse.Namespace], dict[str, float]]] = {
    "ledger": measure_ledger,
    "gateway": measure_gateway,
    "demo": measure_demo,
}


def schedule(rounds: int, demo_runs: int, labels: tuple[str, ...]) -> list[tuple[str, str]]:
    """(measurement, revision) in the order run: each measurement ``rounds`` times for
    every revision in turn (before, after, before, after, ...), the demo ``demo_runs``
    times; the quick measurements first, so a long demo cannot hold them up."""
    order = []
    for name in MEASURES:
        for _ in range(min(rounds, demo_runs) if name == "demo" else rounds):
            order += [(name, label) for label in labels]
    return order


def run_all(
    trees: dict[str, Path], args: argparse.Namespace, say: Callable[[str], None]
) -> list[Measurement]:
    """Every measurement of the schedule, one at a time; with ``--demo-parallel`` the
    demos all at once after the others (each then meets the same load)."""
    lock = threading.Lock()
    done: list[Measurement] = []

    def one(name: str, label: str) -> None:
        m = Measurement(name, label, load_before=os.getloadavg()[0])
        start = time.perf_counter()
        try:
            m.figures = MEASURES[name](trees[label], args)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            m.error = str(exc)[:300]
        m.seconds = time.perf_counter() - start
        m.load_after = os.getloadavg()[0]
        figures = ", ".join(f"{k} {v:.3g}" for k, v in m.figures.items()) or m.error
        with lock:
            say(
                f"  {name:7s} {label:6s} {m.seconds:6.0f} s  load {m.load_before:.1f} -> "
                f"{m.load_after:.1f}  {figures}"
            )
            done.append(m)
            if args.log:
                with open(args.log, "a") as log:
                    log.write(json.dumps(m.__dict__) + "\n")

    order = [
        (name, label)
        for name, label in schedule(args.rounds, args.demo_runs, tuple(trees))
        if not (name == "demo" and args.no_demo) and name in args.only
    ]
    together = [job for job in order if job[0] == "demo"] if args.demo_parallel else []
    for job in order:
        if job not in together:
            one(*job)
    threads = [threading.Thread(target=one, args=job) for job in together]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done


def rows_of(done: list[Measurement]) -> list[Row]:
    def values(label: str, key: str) -> list[float]:
        return [m.figures[key] for m in done if m.label == label and key in m.figures]

    return [
        judge(metric, values("before", metric.key), values("after", metric.key))
        for metric in METRICS
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("before", nargs="?", default=BEFORE)
    parser.add_argument("after", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each revision")
    parser.add_argument("--demo-runs", type=int, default=2, help="demos per revision (at most)")
    parser.add_argument("--no-demo", action="store_true")
    parser.add_argument(
        "--demo-parallel",
        action="store_true",
        help="run the demos of both revisions at the same time (all of them, after the "
        "other measurements): on a machine whose load changes by the minute each demo then "
        "meets the same load",
    )
    parser.add_argument(
        "--only",
        default=",".join(MEASURES),
        type=lambda text: text.split(","),
        help="measurements to make, of %(default)s",
    )
    parser.add_argument("--demo-timeout", type=float, default=1200.0, help="seconds per demo")
    parser.add_argument("--gateway-requests", type=int, default=1500)
    parser.add_argument("--gateway-rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--log", help="append each measurement to this file as a JSON line")
    parser.add_argument(
        "--from-log", help="measure nothing: the table of the measurements in this --log file"
    )
    args = parser.parse_args()
    unknown = [name for name in args.only if name not in MEASURES]
    if unknown:
        parser.error(
            f"--only: unknown measurement {unknown[0]!r}; choose from {', '.join(MEASURES)}"
        )
    if args.from_log:
        try:
            lines = Path(args.from_log).read_text().splitlines()
            done = [Measurement(**json.loads(line)) for line in lines if line.strip()]
        except (OSError, ValueError, TypeError) as exc:
            parser.error(f"--from-log {args.from_log}: {exc}")
        return show(done, {}, args.json)
    repo = Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel"))
    commits = {}
    for label, rev in (("before", args.before), ("after", args.after)):
        try:
            commits[label] = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
        except subprocess.CalledProcessError:
            parser.error(f"{rev!r} is not a commit of this repository")

    def say(text: str) -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    say(
        f"before {commits['before'][:12]}, after {commits['after'][:12]}; "
        f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    # Stopped (SIGTERM or Ctrl-C), it still kills its children and removes its worktrees.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with worktrees(repo, commits) as trees:
        try:
            for tree in trees.values():
                check_tree(tree)
            done = run_all(trees, args, say)
        finally:
            stop_children()
    return show(done, commits, args.json)


def show(done: list[Measurement], commits: dict[str, str], as_json: bool) -> int:
    rows = rows_of(done)
    loads = [x for m in done for x in (m.load_before, m.load_after)]
    if as_json:
        print(
            json.dumps(
                {
                    "commits": commits,
                    "cores": os.cpu_count(),
                    "load": {"min": min(loads, default=None), "max": max(loads, default=None)},
                    "runs": [m.__dict__ for m in done],
                    "table": [
                        {
                            "figure": r.metric.key,
                            "before": r.before,
                            "after": r.after,
                            "ratio": r.ratio,
                            "noise": r.noise,
                            "verdict": r.verdict,
                        }
                        for r in rows
                    ],
                }
            )
        )
    else:
        print()
        print(table(rows))
        if loads:
            print(f"\nload average during the measurements: {min(loads):.1f} to {max(loads):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
