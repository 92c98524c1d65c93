"""`holedger replay`: verdict, named checks, first failures, exit codes 0/1/2, --json.

Driven through click's CliRunner, and once through the installed ``holedger`` console
script in a real subprocess.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from descriptors import holding_descriptors

from holedger.cli import cli
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from replay.task_run import closed_task_run

INTEGRITY_CHECKS = {
    "records",
    "run",
    "keys",
    "signatures",
    "sequence",
    "chain",
    "schema",
    "blobs",
    "checkpoints",
    "closed",
}


@pytest.fixture()
def home(tmp_path: Path) -> tuple[Path, str]:
    """An initialised home holding one closed run."""
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), "init", "--json"])
    assert result.exit_code == 0, result.output
    ledger = Ledger.from_settings(Settings.resolve(home))
    run_id = closed_task_run(ledger)
    ledger.close()
    return home, run_id


def replay(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), "replay", *args])


def _flip_payload_byte(home: Path, run_id: str, seq: int) -> None:
    """Edit the stored record directly, as an attacker with the database file would."""
    conn = sqlite3.connect(home / "ledger.db")
    with conn:
        (state,) = conn.execute(
            "SELECT state FROM holedger_events WHERE originator_id = ? AND originator_version = ?",
            (uuid.UUID(run_id).bytes, seq + 1),
        ).fetchone()
        at = bytes(state).index(b'"reason":"') + len(b'"reason":"')
        tampered = bytearray(state)
        tampered[at] ^= 0x01
        conn.execute(
            "UPDATE holedger_events SET state = ? WHERE originator_id = ? "
            "AND originator_version = ?",
            (bytes(tampered), uuid.UUID(run_id).bytes, seq + 1),
        )
    conn.close()


def test_verified_run_exits_0_with_verdict_and_checks(home: tuple[Path, str]) -> None:
    path, run_id = home
    result = replay(path, run_id)
    assert result.exit_code == 0, result.output
    assert f"run {run_id}: VERIFIED (3 events)" in result.output
    for check in INTEGRITY_CHECKS:
        assert check in result.output
    assert "taken on trust" in result.output  # no key pinned: it says so
    assert "keys: the run's own, not pinned" in result.output


def test_an_unpinned_verdict_carries_a_warning_and_the_run_is_named(
    home: tuple[Path, str],
) -> None:
    """Without --trusted-key the verdict holds for the keys the run declares, which a
    log re-signed whole with another key would declare too: a warning says so (in the
    JSON warnings, for scripts), and pinning the operator's key removes it. Both name the
    task and optimizer the verdict is about."""
    path, run_id = home
    data = json.loads(replay(path, run_id, "--json").output)
    assert data["verified"] is True and data["warnings"] == ["keys_pinned"]
    assert data["run"]["task_id"] and data["run"]["optimizer"]
    vkey = (path / "keys" / "operator.pub").read_text().strip()
    pinned = replay(path, run_id, "--trusted-key", vkey, "--json")
    assert pinned.exit_code == 0 and json.loads(pinned.output)["warnings"] == []
    text = replay(path, run_id, "--trusted-key", vkey).output
    assert "not pinned" not in text
    run = data["run"]
    assert (
        f"task {run['task_id']} (digest {run['task_digest']}), optimizer {run['optimizer']}" in text
    )


def test_json_report_has_the_documented_members(home: tuple[Path, str]) -> None:
    path, run_id = home
    result = replay(path, run_id[:8], "--json")  # a unique prefix is enough
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"run_id", "verified", "events", "checks", "failures"} <= set(data)
    assert data["run_id"] == run_id and data["verified"] is True and data["events"] == 3
    assert data["failures"] == []
    assert INTEGRITY_CHECKS <= {c["name"] for c in data["checks"]}
    assert all(set(c) >= {"name", "ok", "detail"} for c in data["checks"])


def test_tampered_run_exits_1_naming_seq_type_and_reason(home: tuple[Path, str]) -> None:
    path, run_id = home
    _flip_payload_byte(path, run_id, 1)  # RunClosed's reason
    result = replay(path, run_id, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["verified"] is False
    first = data["failures"][0]
    assert (first["seq"], first["type"], first["check"]) == (1, "RunClosed", "signatures")
    assert "signature does not verify" in first["reason"]
    human = replay(path, run_id)
    assert human.exit_code == 1
    assert "FAILED" in human.output and "first failures" in human.output
    assert "signature does not verify" in human.output


def test_workers_option_gives_the_same_report(home: tuple[Path, str]) -> None:
    path, run_id = home
    one = json.loads(replay(path, run_id, "--json").output)
    two = replay(path, run_id, "--json", "--workers", "2")
    assert two.exit_code == 0, two.output
    assert json.loads(two.output) == one
    assert replay(path, run_id, "--workers", "0").exit_code == 2


def test_workers_replay_when_the_process_holds_over_1024_descriptors(
    home: tuple[Path, str],
) -> None:
    # select() refuses descriptors numbered 1024 and up; the workers' pipes get such
    # numbers in a process that holds many (a server, a test run)
    with holding_descriptors():
        path, run_id = home
        result = replay(path, run_id, "--json", "--workers", "2")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["verified"] is True


def test_pinned_keys(home: tuple[Path, str]) -> None:
    path, run_id = home
    vkey = (path / "keys" / "operator.pub").read_text().strip()
    assert replay(path, run_id, "--trusted-key", vkey).exit_code == 0
    keyring = path / "keyring.txt"
    keyring.write_text(f"# the operator\n{vkey}\n")
    assert replay(path, run_id, "--trusted-key", str(keyring)).exit_code == 0
    other = SigningKey.generate("holedger-operator").public.vkey()
    result = replay(path, run_id, "--trusted-key", other, "--json")
    assert result.exit_code == 1
    failure = json.loads(result.output)["failures"][0]
    assert (failure["seq"], failure["check"]) == (0, "keys")


@pytest.mark.parametrize(
    "args",
    [
        ["00000000-0000-4000-8000-000000000000"],
        ["zz"],
        ["RUN", "--trusted-key", "not-a-key+1234+AAAA"],
        ["RUN", "--trusted-key", "missing.pub"],
        # neither a key nor a keyring: an empty value, a folder, a keyring without a key
        # (which would pin nothing and so trust whatever keys the log declares)
        ["RUN", "--trusted-key", ""],
        ["RUN", "--trusted-key", "FOLDER"],
        ["RUN", "--trusted-key", "EMPTY"],
        ["not-a-run-id"],
    ],
)
def test_bad_usage_or_unknown_run_exits_2(home: tuple[Path, str], args: list[str]) -> None:
    path, run_id = home
    empty = path / "empty.pub"
    empty.write_text("# only a comment\n\n")
    stand_in = {"RUN": run_id, "FOLDER": str(path), "EMPTY": str(empty)}
    args = [stand_in.get(a, a) for a in args]
    result = replay(path, *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("holedger: error:")
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "(hint: " in result.output


def test_an_error_under_json_is_also_a_json_document_on_stdout(
    home: tuple[Path, str],
) -> None:
    """A script reading --json output gets one document on an error too (the one-line
    message stays on stderr); without --json, stdout stays empty."""
    path, _ = home
    junk = path / "junk.hlb"
    junk.write_bytes(b"not a bundle")
    for args, kind in (
        (["--home", str(path), "replay", "not-a-run-id", "--json"], "usage"),
        (
            ["--home", str(path), "replay", "00000000-0000-4000-8000-000000000000", "--json"],
            "not_found",
        ),
        (["verify", str(junk), "--json"], "bundle"),
        (["--home", str(path), "eval", "x", "seed", "--split", "test", "--json"], "usage"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        error = json.loads(result.stdout)["error"]
        assert error["type"] == kind and error["exit_code"] == 2, error
        assert error["message"] and error["hint"]
        assert result.stderr == f"holedger: error: {error['message']} (hint: {error['hint']})\n"
        plain = CliRunner().invoke(cli, [a for a in args if a != "--json"])
        assert plain.exit_code == 2 and plain.stdout == "" and plain.stderr == result.stderr


def test_replay_without_a_ledger_exits_2(tmp_path: Path) -> None:
    result = replay(tmp_path / "nowhere", "00000000-0000-4000-8000-000000000000")
    assert result.exit_code == 2, result.output
    assert "holedger init" in result.output


def test_console_script_in_a_subprocess(home: tuple[Path, str]) -> None:
    path, run_id = home
    script = shutil.which("holedger") or str(Path(sys.executable).parent / "holedger")
    if not Path(script).exists():
        pytest.skip("the holedger console script is not installed (pip install -e .)")
    env = dict(os.environ, HOLEDGER_HOME=str(path))
    env.pop("HOLEDGER_LEDGER", None)
    ok = subprocess.run(
        [script, "replay", run_id, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verified"] is True
    _flip_payload_byte(path, run_id, 1)
    bad = subprocess.run(
        [script, "replay", run_id], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout
    missing = subprocess.run(
        [script, "replay", "0000ffff"], capture_output=True, text=True, env=env, timeout=120
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("holedger: error:")


def test_python_dash_m_holedger_is_the_same_command(home: tuple[Path, str]) -> None:
    path, run_id = home
    env = dict(os.environ, HOLEDGER_HOME=str(path))
    env.pop("HOLEDGER_LEDGER", None)
    ok = subprocess.run(
        [sys.executable, "-m", "holedger", "replay", run_id, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verified"] is True
    missing = subprocess.run(
        [sys.executable, "-m", "holedger", "replay"], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 2 and missing.stderr.startswith("holedger: error:")


@pytest.mark.parametrize("args", [["replay", "RUN"], ["replay", "RUN", "--json"], ["run", "list"]])
def test_a_reader_that_closes_the_pipe_is_no_failure(
    home: tuple[Path, str], args: list[str]
) -> None:
    """`holedger replay RUN | head -1`: when the reader goes away, holedger stops quietly
    with SIGPIPE's status (141), never 1 (which would read as "verification failed")."""
    path, run_id = home
    env = dict(os.environ, HOLEDGER_HOME=str(path))
    env.pop("HOLEDGER_LEDGER", None)
    argv = [sys.executable, "-m", "holedger.cli", *(run_id if a == "RUN" else a for a in args)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # no reader before the first write: every write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert err == b""


def test_output_to_a_pipe_keeps_keys_digests_and_paths_whole(
    home: tuple[Path, str], tmp_path: Path
) -> None:
    """Output that is not a terminal is not wrapped at 80 columns: the key replay asks
    to pin, the bundle's sha256, the signer's key and a long path each come out whole
    on one line of the pipe, as they would be copied from a log."""
    path, run_id = home
    vkey = SigningKey.load(Settings.resolve(path).key_path).public.vkey()
    folder = tmp_path / ("a-folder-with-a-name-long-enough-to-push-any-path-past-80-" * 2)
    folder.mkdir()
    bundle, attestation = folder / "run.hlb", folder / "result.intoto.json"
    env = dict(os.environ, HOLEDGER_HOME=str(path))
    for name in ("HOLEDGER_LEDGER", "COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)

    def lines(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "holedger.cli", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    replayed = lines("replay", run_id)
    assert any(vkey in line and "pin with --trusted-key" in line for line in replayed)
    exported = lines("export", run_id, "-o", str(bundle))
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert any(digest in line and str(bundle) in line for line in exported), exported
    attested = lines("attest", run_id, "-o", str(attestation), "--bundle", str(bundle))
    assert any(vkey in line and str(attestation) in line for line in attested), attested


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["replay"], "Missing argument 'RUN'."),
        (["replay", "--bogus", "x"], "No such option '--bogus'."),
        (["--bogus"], "No such option '--bogus'."),
        (["nosuchcommand"], "No such command 'nosuchcommand'."),
        (["replay", "--workers", "zero", "x"], "Invalid value for '--workers'"),
        (["eval", "0000", "seed"], "Missing option '--split'. Choose from: dev, val, test "),
    ],
)
def test_usage_errors_are_one_line_with_a_hint(tmp_path: Path, args: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), *args], prog_name="holedger")
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"holedger: error: {says}"), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "\t" not in result.output, result.output
    assert "(hint: see 'holedger" in result.output and "--help')" in result.output


@pytest.mark.parametrize("option", ["--home", "--ledger"])
def test_a_global_option_after_the_command_is_explained(tmp_path: Path, option: str) -> None:
    result = CliRunner().invoke(cli, ["run", "list", option, str(tmp_path)], prog_name="holedger")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"holedger: error: No such option '{option}'. (hint: {option} is an option of "
        f"holedger itself: put it before the command, e.g. 'holedger {option} ... run list')"
    )


def test_help_and_version_still_exit_0(tmp_path: Path) -> None:
    for args in (["--help"], ["replay", "--help"], ["--version"]):
        result = CliRunner().invoke(cli, ["--home", str(tmp_path), *args], prog_name="holedger")
        assert result.exit_code == 0, (args, result.output)
        assert result.output.strip()


def test_the_key_taken_on_trust_is_printed_whole(home: tuple[Path, str]) -> None:
    """At 80 columns the key's vkey is longer than the detail column: it goes on over the
    next lines, so it can be read and pinned, and is never cut short."""
    path, run_id = home
    vkey = SigningKey.load(Settings.resolve(path).key_path).public.vkey()
    result = replay(path, run_id)
    assert result.exit_code == 0, result.output
    cells = "".join(result.output.replace("│", "").split())
    assert vkey in cells
    assert "…" not in result.output


def test_run_list_keeps_ids_and_opening_times_whole(
    home: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, run_id = home
    for width in ("80", "120"):
        monkeypatch.setenv("COLUMNS", width)
        result = CliRunner().invoke(cli, ["--home", str(path), "run", "list"])
        assert result.exit_code == 0, result.output
        assert run_id in result.output, result.output
        assert re.search(r"\b20\d\d-\d\d-\d\d \d\d:\d\d\b", result.output), result.output
        assert max(len(line) for line in result.output.splitlines()) <= int(width)


def test_run_show_names_the_keys_the_run_declares(home: tuple[Path, str]) -> None:
    path, run_id = home
    as_json = CliRunner().invoke(cli, ["--home", str(path), "run", "show", run_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    keys = json.loads(as_json.output)["keys"]
    text = CliRunner().invoke(cli, ["--home", str(path), "run", "show", run_id])
    assert text.exit_code == 0, text.output
    shown = CliRunner().invoke(cli, ["--home", str(path), "keys", "show"]).output.strip()
    # The same form as 'keys show', the one --trusted-key takes.
    assert keys["server"]["vkey"] == shown
    for role, key in keys.items():
        assert (
            key["vkey"]
            == f"{key['name']}+{key['key_id'][:8]}+"
            + base64.b64encode(b"\x01" + base64.b64decode(key["public_key"])).decode()
        )
        assert f"key {role}  {key['vkey']}" in text.output.splitlines(), text.output


@pytest.mark.parametrize(
    ("count", "says"), [(0, "0 violations ("), (1, "1 violation ("), (2, "2 violations (")]
)
def test_the_safety_line_counts_in_the_number_it_needs(
    capsys: pytest.CaptureFixture[str], count: int, says: str
) -> None:
    from holedger.replay.commands import print_report
    from holedger.replay.report import ReplayReport

    report = ReplayReport(
        run_id="r",
        verified=True,
        events=1,
        checks=[],
        failures=[],
        sections={"safety": {"violations": count, "by_category": {"timeout": count}}},
    )
    print_report(report)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("safety:")]
    assert line.startswith(f"safety: {says}"), line
