"""The pure parts of benchmarks/compare_revisions.py: the verdict against the noise of two
runs of the same code, the table, the parsing of each benchmark's output and the order of
the runs, on figures worked by hand (no time is measured here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_revisions.py"
spec = importlib.util.spec_from_file_location("compare_revisions", SCRIPT)
assert spec is not None and spec.loader is not None
cr = importlib.util.module_from_spec(spec)
sys.modules["compare_revisions"] = cr
spec.loader.exec_module(cr)

METRIC = {m.key: m for m in cr.METRICS}


def test_higher_is_better_worse_beyond_noise() -> None:
    # before 0.90, 0.80: mean 0.85, spread 0.10 / 0.85 = 0.1176
    # after 0.70, 0.72: mean 0.71, spread 0.02 / 0.71 = 0.0282; noise = 0.1176
    # after / before = 0.71 / 0.85 = 0.8353: worse by 0.1647 > 0.1176
    row = cr.judge(METRIC["replay_1p"], [0.90, 0.80], [0.70, 0.72])
    assert row.before == pytest.approx(0.85)
    assert row.after == pytest.approx(0.71)
    assert row.ratio == pytest.approx(0.71 / 0.85)
    assert row.noise == pytest.approx(0.10 / 0.85)
    assert row.verdict == "WORSE beyond noise"


def test_higher_is_better_within_noise() -> None:
    # before 0.90, 0.70: mean 0.80, spread 0.25; after 0.70, 0.72: ratio 0.8875,
    # worse by 0.1125 < 0.25
    row = cr.judge(METRIC["append_batched"], [0.90, 0.70], [0.70, 0.72])
    assert row.noise == pytest.approx(0.25)
    assert row.ratio == pytest.approx(0.8875)
    assert row.verdict == "within noise"


def test_lower_is_better_within_and_beyond_noise() -> None:
    # before 0.50, 0.60: mean 0.55, spread 0.10 / 0.55 = 0.1818; after 0.60, 0.62: mean
    # 0.61, ratio 1.1091, worse by 0.1091 < 0.1818
    row = cr.judge(METRIC["gateway_cpu_ms"], [0.50, 0.60], [0.60, 0.62])
    assert row.ratio == pytest.approx(0.61 / 0.55)
    assert row.noise == pytest.approx(0.10 / 0.55)
    assert row.verdict == "within noise"
    # after 0.70, 0.72: mean 0.71, ratio 1.2909, worse by 0.2909 > 0.1818
    assert cr.judge(METRIC["gateway_cpu_ms"], [0.50, 0.60], [0.70, 0.72]).verdict == (
        "WORSE beyond noise"
    )


def test_better_beyond_noise() -> None:
    # before 120, 130 s: mean 125, spread 0.08; after 100, 104: mean 102, spread 0.0392;
    # ratio 0.816, better by 0.184 > 0.08
    row = cr.judge(METRIC["demo_wall_s"], [120.0, 130.0], [100.0, 104.0])
    assert row.ratio == pytest.approx(0.816)
    assert row.noise == pytest.approx(0.08)
    assert row.verdict == "better beyond noise"


def test_without_two_runs_of_each_there_is_no_noise_and_no_verdict() -> None:
    row = cr.judge(METRIC["demo_wall_s"], [120.0], [100.0, 104.0])
    assert row.noise is None
    assert row.verdict == "no noise figure"
    assert cr.judge(METRIC["demo_wall_s"], [120.0, 121.0], []).verdict == "not measured"
    assert cr.judge(METRIC["demo_trials"], [432.0, 432.0], [432.0, 432.0]).verdict == (
        "(no verdict)"
    )


def test_table_shows_each_figure_its_ratio_and_noise() -> None:
    rows = [
        cr.judge(METRIC["replay_1p"], [0.90, 0.80], [0.70, 0.72]),
        cr.judge(METRIC["demo_wall_s"], [120.0, 130.0], [100.0, 104.0]),
    ]
    lines = cr.table(rows).splitlines()
    assert lines[0].split()[:3] == ["figure", "before", "after"]
    replay = lines[2]
    assert replay.startswith("replay / raw verify, 1 process")
    assert replay.split()[-7:] == ["0.85", "0.71", "0.84", "12%", "WORSE", "beyond", "noise"]
    demo = lines[3]
    assert demo.split()[-9:] == [
        "125.0",
        "s",
        "102.0",
        "s",
        "0.82",
        "8%",
        "better",
        "beyond",
        "noise",
    ]


LEDGER_OUT = """\
holedger ledger benchmark  (cores: 2, workers: 2)

1. Ed25519 verify (cryptography), 600-byte messages
   1 process           3012 /s
   2 processes         5500 /s

2. appends (events/s)      signed   unsigned: stock  holedger recorder   signed/stock  signed/holedger recorder
   SQLite     1 per tx      410              520               600           0.79                      0.68
   SQLite     100 per tx   2100             2900              5600           0.72                      0.38

3. replay verification of a 4000-event run (SQLite, integrity checks), 3 rounds;
   raw = the run's own signatures verified alone, measured just before and after each replay in as many processes
                    replay/s   raw verify/s   ratio: median   min    max   (target >= 0.85)
   1 process          2700           3000            0.90   0.85   0.93
   2 processes        4600           5400            0.85   0.80   0.88
"""  # noqa: E501


def test_parse_ledger_reads_the_batched_append_and_replay_ratios() -> None:
    assert cr.parse_ledger(LEDGER_OUT) == {
        "append_batched": 0.72,
        "append_batched_own": 0.38,
        "replay_1p": 0.90,
        "replay_2p": 0.85,
    }


GATEWAY_OUT = """\
chat (/v1/chat/completions): 32 concurrent client(s), upstream answers after 0 ms, non-streaming; latency in ms
  path           p50      p99   req/s errors    +p50    +p99  proxy writer upstrm client  busy
  direct        9.10    20.00    3000     60                              0.20   0.15   99%
  gateway      20.00    45.00    1200     48   10.90   25.00   0.60   0.25   0.21   0.16   99%
  floor        12.00    30.00    2100     55    2.90   10.00   0.15          0.20   0.15   99%
  gateway events waiting when a round ended: at most 40; written 12 ms later on average
  gateway added p50 10.90 ms, p99 25.00 ms: over 2/10 ms
"""  # noqa: E501


def test_parse_gateway_reads_cpu_per_call_and_its_ratio_to_the_floor() -> None:
    figures = cr.parse_gateway(GATEWAY_OUT)
    assert figures["gateway_cpu_ms"] == 0.60
    assert figures["gateway_over_floor"] == pytest.approx(4.0)


def test_runs_alternate_revisions_and_demo_only_in_its_rounds() -> None:
    order = cr.schedule(2, 1, ("before", "after"))
    assert order == [
        ("ledger", "before"),
        ("ledger", "after"),
        ("ledger", "before"),
        ("ledger", "after"),
        ("gateway", "before"),
        ("gateway", "after"),
        ("gateway", "before"),
        ("gateway", "after"),
        ("demo", "before"),
        ("demo", "after"),
    ]


def test_a_child_sees_only_its_tree_and_no_holedger_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOLEDGER_HOME", "/elsewhere")
    monkeypatch.setenv("PYTHONPATH", "/another/tree")
    code = "import json, os; print(json.dumps([os.environ.get('PYTHONPATH'), "
    code += "sorted(k for k in os.environ if k.startswith('HOLEDGER_')), os.getcwd()]))"
    run = cr.run_child(tmp_path, [sys.executable, "-c", code], 60)
    assert json.loads(run.stdout) == [str(tmp_path), [], str(tmp_path)]


def test_a_child_that_fails_is_one_error_with_its_last_lines(tmp_path: Path) -> None:
    code = "import sys; print('first'); print('the last words', file=sys.stderr); sys.exit(3)"
    with pytest.raises(RuntimeError, match="exit 3: the last words"):
        cr.run_child(tmp_path, [sys.executable, "-c", code], 60)


def test_a_child_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        cr.run_child(tmp_path, [sys.executable, "-c", code], 10)
    grandchild = int(pidfile.read_text())
    for _ in range(100):
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
