"""prove / verify-proof, checkpoint show / cosign / witness-key, attest: end to end."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from holedger.cli import cli
from holedger.ledger.attest import attest
from holedger.ledger.fastpath import parse_record
from holedger.ledger.note import parse_note
from holedger.ledger.tlog import parse_tlog_proof
from holedger.schemas.events import SafetyViolation

from .conftest import SampleRun, sha, terms


def run(sample: SampleRun, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--home", str(sample.settings.home), *args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def vkey(sample: SampleRun) -> str:
    return sample.key.public.vkey()


def test_inclusion_proof_for_every_event_under_the_final_checkpoint(
    sample: SampleRun, vkey: str, tmp_path: Path
) -> None:
    code, text = run(sample, "checkpoint", "show", sample.run_id, "--json")
    assert code == 0, text
    size = json.loads(text)["size"]
    for seq in range(size):
        out = tmp_path / f"{seq}.tlog-proof"
        code, text = run(sample, "prove", sample.run_id, "--seq", str(seq), "-o", str(out))
        assert code == 0, text
        assert text.startswith(f"wrote {out}: inclusion proof of seq {seq} to tree size {size}")
        assert out.read_text().startswith("c2sp.org/tlog-proof@v1\nextra ")
        code, text = run(sample, "verify-proof", str(out), "--trusted-key", vkey, "--json")
        assert code == 0, text
        result = json.loads(text)
        assert (result["seq"], result["tree_size"]) == (seq, size)
        assert result["event_signature"] == "verified"
    code, text = run(sample, "prove", sample.run_id, "--seq", str(size))
    assert code == 2 and "not covered" in text


def _proof(sample: SampleRun, tmp_path: Path, seq: int) -> str:
    out = tmp_path / "p.tlog-proof"
    assert run(sample, "prove", sample.run_id, "--seq", str(seq), "-o", str(out))[0] == 0
    return out.read_text()


def test_tampered_inclusion_proofs_fail(sample: SampleRun, vkey: str, tmp_path: Path) -> None:
    text = _proof(sample, tmp_path, 5)
    proof = parse_tlog_proof(text)
    other = parse_tlog_proof(_proof(sample, tmp_path, 6))
    first_hash = base64.b64encode(proof.hashes[0]).decode()
    flipped = base64.b64encode(bytes([proof.hashes[0][0] ^ 1]) + proof.hashes[0][1:]).decode()
    cases = {
        "flipped hash": text.replace(first_hash, flipped),
        "wrong index": text.replace("\nindex 5\n", "\nindex 4\n"),
        "other event": text.replace(
            base64.b64encode(proof.extra or b"").decode(),
            base64.b64encode(other.extra or b"").decode(),
        ),
        "missing hash": text.replace(first_hash + "\n", ""),
        "bigger tree": text.replace(f"\n{proof.checkpoint.split(chr(10))[1]}\n", "\n999\n", 1),
    }
    for name, bad in cases.items():
        path = tmp_path / "bad.tlog-proof"
        path.write_text(bad)
        code, out = run(sample, "verify-proof", str(path), "--trusted-key", vkey, "--json")
        assert code == 1, name
        assert json.loads(out)["verified"] is False, name
    stranger = "example.com/x+" + "0" * 8 + "+" + base64.b64encode(b"\x01" + b"\x02" * 32).decode()
    path = tmp_path / "good.tlog-proof"
    path.write_text(text)
    code, out = run(sample, "verify-proof", str(path), "--trusted-key", stranger)
    assert code == 2  # a malformed key is a usage error, not a verdict
    # So is a file that is no proof at all (as verify says of a file that is no bundle);
    # a proof whose header line is damaged is not a proof either.
    for name, bad in {"text": "hello\n", "header": text.replace("@v1\n", "@v2\n", 1)}.items():
        path.write_text(bad)
        code, out = run(sample, "verify-proof", str(path), "--trusted-key", vkey)
        assert code == 2, name
        assert "is not a proof" in out and "holedger prove" in out, name


def test_consistency_proof_between_two_checkpoints(
    sample: SampleRun, vkey: str, tmp_path: Path
) -> None:
    # A run that we grow: checkpoint, publish, append, close, prove consistency.
    ledger = sample.ledger
    run_id = ledger.open_run(terms(), task_digest=sha("t"), optimizer="growing")
    for i in range(9):
        ledger.append(
            run_id,
            "SafetyViolation",
            SafetyViolation(category="timeout", detail=f"slow {i}"),
            "sandbox",
        )
    old = tmp_path / "old.note"
    assert run(sample, "checkpoint", "show", run_id, "-o", str(old))[0] == 0
    for i in range(20):
        ledger.append(
            run_id, "SafetyViolation", SafetyViolation(category="timeout", detail=f"{i}"), "sandbox"
        )
    ledger.close_run(run_id)
    new = tmp_path / "new.note"
    assert run(sample, "checkpoint", "show", run_id, "-o", str(new))[0] == 0
    proof = tmp_path / "c.proof"
    code, text = run(sample, "prove", run_id, "--from-checkpoint", str(old), "-o", str(proof))
    assert code == 0, text
    assert text.startswith(f"wrote {proof}: consistency proof from size "), text
    code, text = run(sample, "verify-proof", str(proof), "--trusted-key", vkey)
    assert code == 2 and "needs --old-checkpoint" in text and "checkpoint show" in text
    args = ["verify-proof", str(proof), "--trusted-key", vkey, "--old-checkpoint"]
    code, text = run(sample, *args, str(old), "--json")
    assert code == 0, text
    result = json.loads(text)
    assert result["old_size"] < result["new_size"]
    # An old checkpoint of another log, or a proof with a flipped hash, fails.
    other = tmp_path / "other.note"
    assert run(sample, "checkpoint", "show", sample.run_id, "-o", str(other))[0] == 0
    assert run(sample, *args, str(other))[0] == 1
    lines = proof.read_text().split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    proof.write_text("\n".join(lines))
    assert run(sample, *args, str(old))[0] == 1

    # A witness that cosigned the old checkpoint cosigns the new one only with the proof.
    key = tmp_path / "w.key"
    assert run(sample, "checkpoint", "witness-key", "witness.example/w1", "-o", str(key))[0] == 0
    cosign = ["checkpoint", "cosign", str(new), "--key", str(key), "--log-key", vkey]
    code, text = run(sample, *cosign, "--previous", str(old))
    assert code == 2 and "--proof" in text
    assert run(sample, *cosign, "--previous", str(old), "--proof", str(proof))[0] == 1
    good = tmp_path / "c2.proof"
    assert run(sample, "prove", run_id, "--from-checkpoint", str(old), "-o", str(good))[0] == 0
    code, text = run(sample, *cosign, "--previous", str(old), "--proof", str(good), "--time", "7")
    assert code == 0, text
    assert parse_note(text).signatures[-1].name == "witness.example/w1"


def test_witness_cosignature_and_policy_on_bundle_verify(
    sample: SampleRun, vkey: str, tmp_path: Path
) -> None:
    note = tmp_path / "final.note"
    assert run(sample, "checkpoint", "show", sample.run_id, "-o", str(note))[0] == 0
    wkeys, wvkeys = [], []
    for i in (1, 2):
        key = tmp_path / f"w{i}.key"
        code, text = run(sample, "checkpoint", "witness-key", f"w{i}.example", "-o", str(key))
        assert code == 0
        wkeys.append(key)
        wvkeys.append(text.strip())
    cosigned = tmp_path / "cosigned.note"
    cosign = ["checkpoint", "cosign", str(note), "--key", str(wkeys[0]), "--log-key", vkey]
    assert run(sample, *cosign, "-o", str(cosigned))[0] == 0
    stranger_log = tmp_path / "stranger.note"
    stranger_log.write_text(note.read_text().replace("\u2014 holedger-operator", "\u2014 other"))
    bad = ["checkpoint", "cosign", str(stranger_log), "--key", str(wkeys[0]), "--log-key", vkey]
    assert run(sample, *bad)[0] == 1  # the witness refuses a note the log did not sign

    plain, witnessed = tmp_path / "plain.hlb", tmp_path / "witnessed.hlb"
    assert run(sample, "export", sample.run_id, "-o", str(plain))[0] == 0
    code, text = run(
        sample, "export", sample.run_id, "-o", str(witnessed), "--checkpoint", str(cosigned)
    )
    assert code == 0, text
    assert run(sample, "verify", str(witnessed), "--witness", wvkeys[0])[0] == 0
    code, text = run(sample, "verify", str(plain), "--witness", wvkeys[0], "--json")
    assert code == 1
    [failed] = [c for c in json.loads(text)["checks"] if c["name"] == "witnesses"]
    assert not failed["ok"] and failed["detail"] == (
        "no checkpoint note for the final checkpoint meets the witness quorum (1 of the 1 "
        "witness given): the best carries 0 cosignatures of the policy's witnesses; a "
        "bundle's own notes carry none: give the cosigned note with --checkpoint"
    )
    # Two witnesses, both needed: the cosigned note, given, carries one of them.
    two = ["--witness", wvkeys[0], "--witness", wvkeys[1], "--quorum", "2"]
    code, text = run(sample, "verify", str(plain), "--checkpoint", str(cosigned), *two, "--json")
    assert code == 1
    [failed] = [c for c in json.loads(text)["checks"] if c["name"] == "witnesses"]
    assert failed["detail"] == (
        "no checkpoint note for the final checkpoint meets the witness quorum (2 of the 2 "
        "witnesses given): the best carries 1 cosignature of the policy's witnesses"
    )
    # Policy: the operator key and one of two witnesses; then both (not met).
    for quorum, expected in (("any", 0), ("all", 1)):
        policy = tmp_path / f"{quorum}.policy"
        policy.write_text(
            f"log {vkey}\nwitness W1 {wvkeys[0]}\nwitness W2 {wvkeys[1]}\n"
            f"group g {quorum} W1 W2\nquorum g\n"
        )
        code, text = run(sample, "verify", str(witnessed), "--policy", str(policy))
        assert code == expected, (quorum, text)
    # An inclusion proof carries the latest note, which no witness cosigned: a verifier
    # demanding a witness is told to ask for one proved against the cosigned note.
    latest, cosigned_proof = tmp_path / "latest.proof", tmp_path / "cosigned.proof"
    assert run(sample, "prove", sample.run_id, "--seq", "2", "-o", str(latest))[0] == 0
    code, text = run(
        sample, "verify-proof", str(latest), "--trusted-key", vkey, "--witness", wvkeys[0]
    )
    assert code == 1 and "do not meet the witness quorum (1 of the 1 witness given)" in text
    assert "holedger prove RUN --checkpoint COSIGNED_NOTE" in text
    args = ["prove", sample.run_id, "--seq", "2", "--checkpoint", str(cosigned)]
    assert run(sample, *args, "-o", str(cosigned_proof))[0] == 0
    verify = ["verify-proof", str(cosigned_proof), "--trusted-key", vkey]
    code, text = run(sample, *verify, "--witness", wvkeys[0], "--json")
    assert code == 0, text
    result = json.loads(text)
    assert result["witnesses"] == ["w1.example"] and result["seq"] == 2
    assert result["summary"].endswith("; witness quorum met (cosigned by w1.example)")
    code, text = run(sample, *verify, "--witness", wvkeys[0], "--witness", wvkeys[1])
    assert code == 1 and "(1) do not meet the witness quorum (2 of the 2 witnesses given)" in text
    # a note that is not one of the run's checkpoints is refused, nothing written
    other = tmp_path / "other.proof"
    code, text = run(
        sample,
        "prove",
        sample.run_id,
        "--seq",
        "2",
        "--checkpoint",
        str(stranger_log),
        "-o",
        str(other),
    )
    assert code == 2 and "checkpoint note" in text and not other.exists()
    # The same cosigned note given as a published checkpoint pins the bundle too.
    code, text = run(sample, "verify", str(plain), "--checkpoint", str(cosigned), "--json")
    assert code == 0, text
    assert json.loads(text)["checkpoint_notes"][0]["witnesses"] == []


def test_a_cosignature_counts_only_for_its_own_witness_key(
    sample: SampleRun, vkey: str, tmp_path: Path
) -> None:
    """Attacks on the quorum count: two witness keys with the same name, the note
    cosigned by one of them, must not meet a quorum needing both (a name does not identify
    a key); one key given twice is refused, not counted as two witnesses."""
    note = tmp_path / "final.note"
    assert run(sample, "checkpoint", "show", sample.run_id, "-o", str(note))[0] == 0
    keys, vkeys = [], []
    for i in (1, 2):
        key = tmp_path / f"w{i}.key"
        code, text = run(sample, "checkpoint", "witness-key", "witness.example", "-o", str(key))
        assert code == 0, text
        keys.append(key)
        vkeys.append(text.strip())
    assert vkeys[0] != vkeys[1]
    cosigned = tmp_path / "cosigned.note"
    cosign = ["checkpoint", "cosign", str(note), "--key", str(keys[0]), "--log-key", vkey]
    assert run(sample, *cosign, "-o", str(cosigned))[0] == 0
    proof = tmp_path / "cosigned.proof"
    prove = ["prove", sample.run_id, "--seq", "2", "--checkpoint", str(cosigned)]
    assert run(sample, *prove, "-o", str(proof))[0] == 0
    verify = ["verify-proof", str(proof), "--trusted-key", vkey]
    both = ["--witness", vkeys[0], "--witness", vkeys[1]]
    code, text = run(sample, *verify, *both)
    assert code == 1 and "(2 of the 2 witnesses given)" in text, text
    assert run(sample, *verify, "--witness", vkeys[0])[0] == 0
    code, text = run(sample, *verify, "--witness", vkeys[1])
    assert code == 1, text  # the other key of that name cosigned nothing
    plain = tmp_path / "plain.hlb"
    assert run(sample, "export", sample.run_id, "-o", str(plain))[0] == 0
    code, text = run(sample, "verify", str(plain), "--checkpoint", str(cosigned), *both, "--json")
    assert code == 1
    [check] = [c for c in json.loads(text)["checks"] if c["name"] == "witnesses"]
    assert not check["ok"] and "the best carries 1 cosignature" in check["detail"]
    # The same policy as a file: two names, two keys of one key name, both needed.
    policy = tmp_path / "both.policy"
    policy.write_text(
        f"log {vkey}\nwitness W1 {vkeys[0]}\nwitness W2 {vkeys[1]}\ngroup g all W1 W2\nquorum g\n"
    )
    code, text = run(
        sample, "verify", str(plain), "--checkpoint", str(cosigned), "--policy", str(policy)
    )
    assert code == 1, text
    # A file holding the vkey works as the vkey does; a missing file is named.
    pub = tmp_path / "w1.pub"
    pub.write_text(f"# witness one\n{vkeys[0]}\n")
    assert run(sample, *verify, "--witness", str(pub))[0] == 0
    code, text = run(sample, *verify, "--witness", str(tmp_path / "nope.pub"))
    assert code == 2 and f"no witness key file at {tmp_path / 'nope.pub'}" in text, text
    # One key twice is not two witnesses.
    twice = ["--witness", vkeys[0], "--witness", vkeys[0], "--quorum", "2"]
    code, text = run(sample, *verify, *twice)
    assert code == 2 and "--witness number 2 repeats a key given before" in text, text


def test_attestation_round_trip_and_independent_dsse_check(
    sample: SampleRun, vkey: str, tmp_path: Path
) -> None:
    bundle, other = tmp_path / "run.hlb", tmp_path / "other.hlb"
    assert run(sample, "export", sample.run_id, "-o", str(bundle))[0] == 0
    assert run(sample, "export", sample.run_id, "-o", str(other), "--redact")[0] == 0
    att = tmp_path / "result.intoto.json"
    code, text = run(sample, "attest", sample.run_id, "-o", str(att), "--bundle", str(bundle))
    assert code == 0, text
    code, text = run(
        sample,
        "verify-attestation",
        str(att),
        "--trusted-key",
        vkey,
        "--bundle",
        str(bundle),
        "--json",
    )
    assert code == 0, text
    statement = json.loads(text)["statement"]
    pred = statement["predicate"]
    assert pred["run_id"] == sample.run_id and pred["verdict"] == "verified"
    # Replayed with the attesting key pinned, so that warning is not among its warnings.
    assert isinstance(pred["warnings"], list) and "keys_pinned" not in pred["warnings"]
    assert pred["task_id"] == "bundle-task" and pred["events"] > 20
    last = parse_record([r for _, r in sample.ledger.raw_records(sample.run_id)][-1])
    assert statement["subject"][0]["digest"]["sha256"] == last.payload["root"]
    args = ["verify-attestation", str(att), "--trusted-key", vkey, "--bundle", str(other)]
    assert run(sample, *args)[0] == 1

    # Any DSSE implementation: PAE by the spec's definition, Ed25519 over it.
    env = json.loads(att.read_text())
    payload = base64.b64decode(env["payload"])
    ptype = env["payloadType"].encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype, len(payload), payload)
    sig = base64.b64decode(env["signatures"][0]["sig"])
    Ed25519PublicKey.from_public_bytes(sample.key.public.raw).verify(sig, pae)
    with pytest.raises(InvalidSignature):
        Ed25519PublicKey.from_public_bytes(sample.key.public.raw).verify(sig, pae + b" ")
    assert env["signatures"][0]["keyid"] == sample.key.key_id_hex

    env["payload"] = base64.b64encode(payload.replace(b'"verified"', b'"failed"')).decode()
    att.write_text(json.dumps(env))
    assert run(sample, "verify-attestation", str(att), "--trusted-key", vkey)[0] == 1

    # Validly signed, but attesting a run that failed replay: not a passing result, so a
    # script that checks the exit status alone does not take it for one.
    failed = {**pred, "verdict": "failed", "failed_checks": ["chain", "scores"]}
    subjects = [(s["name"], s["digest"]["sha256"]) for s in statement["subject"]]
    att.write_text(json.dumps(attest(subjects, failed, sample.key)))
    code, out = run(sample, "verify-attestation", str(att), "--trusted-key", vkey)
    assert code == 1
    assert out.startswith("RUN FAILED the signature verifies, but it attests that run")
    assert "failed checks: chain, scores" in out
    code, out = run(sample, "verify-attestation", str(att), "--trusted-key", vkey, "--json")
    assert code == 1
    reported = json.loads(out)
    assert reported["verified"] is True and reported["run_verified"] is False
    assert reported["statement"]["predicate"]["verdict"] == "failed"
    # A file that is no envelope at all is bad usage (exit 2), as for verify and
    # verify-proof; a damaged envelope (above) is a failed verification (exit 1).
    for name, text in {
        "text": "hello\n",
        "other JSON": '{"value": 238.9}',
        "no signatures": json.dumps({"payloadType": "x", "payload": ""}),
        "deep": "[" * 100_000 + "]" * 100_000,
    }.items():
        att.write_text(text)
        code, out = run(sample, "verify-attestation", str(att), "--trusted-key", vkey)
        assert code == 2 and "is not a DSSE envelope" in out and "holedger attest" in out, name


@pytest.mark.parametrize(
    "args",
    [
        ["export", "RUN"],
        ["prove", "RUN", "--seq", "0"],
        ["attest", "RUN"],
        ["checkpoint", "show", "RUN"],
    ],
    ids=lambda a: a[0] if a[0] != "checkpoint" else "checkpoint-show",
)
def test_outputs_go_into_new_folders_and_bad_paths_are_one_line_errors(
    sample: SampleRun, tmp_path: Path, args: list[str]
) -> None:
    args = [sample.run_id if a == "RUN" else a for a in args]
    fresh = tmp_path / "new" / "folder" / "out"
    code, text = run(sample, *args, "-o", str(fresh))
    assert code == 0, text
    assert fresh.stat().st_size > 0
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for bad in (tmp_path, blocker / "under-a-file"):
        code, text = run(sample, *args, "-o", str(bad))
        assert code == 2, text
        assert text.startswith("holedger: error:") and text.count("\n") == 1, text
        assert "hint:" in text and "Traceback" not in text


def test_a_reviewer_holding_only_files_gets_errors_that_point_the_way(
    sample: SampleRun, vkey: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mistakes of a third party with handed-over files: each is one line with a hint
    saying what to give instead."""
    bundle = tmp_path / "run.hlb"
    assert run(sample, "export", sample.run_id, "-o", str(bundle))[0] == 0
    pub = tmp_path / "operator.pub"
    pub.write_text(vkey + "\n")
    wkey = tmp_path / "w.key"
    assert run(sample, "checkpoint", "witness-key", "w.example", "-o", str(wkey))[0] == 0
    note = tmp_path / "final.note"
    assert run(sample, "checkpoint", "show", sample.run_id, "-o", str(note))[0] == 0
    witness_vkey = run(
        sample, "checkpoint", "witness-key", "w2.example", "-o", str(tmp_path / "w2")
    )[1].split()[-1]
    truncated = tmp_path / "cut.hlb"
    truncated.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
    policy = tmp_path / "policy"
    policy.write_text("logg " + vkey + "\n")
    cases = {
        "a bundle given to replay": (
            ["replay", str(bundle)],
            f"verify a bundle with 'holedger verify {bundle}'",
        ),
        "a quorum without witnesses": (
            ["verify", str(bundle), "--quorum", "1"],
            "name each witness with --witness VKEY",
        ),
        "a quorum beyond the witnesses": (
            ["verify", str(bundle), "--witness", witness_vkey, "--quorum", "2"],
            "give as many --witness keys as the quorum needs",
        ),
        "a witness key as a trusted key": (
            ["verify", str(bundle), "--trusted-key", witness_vkey],
            "a witness key goes where one is asked for, such as 'verify --witness'",
        ),
        "a verifier key to sign with": (
            ["checkpoint", "cosign", str(note), "--key", str(pub), "--log-key", vkey],
            "is not a holedger private key file",
        ),
        "a truncated bundle": (["verify", str(truncated)], "truncated or damaged"),
        "a bundle as a checkpoint": (
            ["verify", str(bundle), "--checkpoint", str(bundle)],
            "give the checkpoint file itself",
        ),
        "a policy line that is none": (
            ["verify", str(bundle), "--policy", str(policy)],
            "lines are 'log VKEY [URL]'",
        ),
    }
    for name, (args, expected) in cases.items():
        code, out = run(sample, *args)
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == 2, (name, out)
        assert len(lines) == 1 and expected in lines[0], (name, out)
    # A file that happens to be named as a run's id prefix is no bundle given to replay.
    monkeypatch.chdir(tmp_path)
    prefix = sample.run_id[:8]
    (tmp_path / prefix).write_text("notes\n")
    assert run(sample, "replay", prefix)[0] in (0, 1)


def test_export_refuses_a_checkpoint_note_that_is_not_the_runs(
    sample: SampleRun, tmp_path: Path
) -> None:
    """A note carried in a bundle must be one of the run's checkpoints, signed by its
    server key: a broken or foreign note is refused before anything is written, instead
    of making every verifier of the bundle fail."""
    note = tmp_path / "final.note"
    assert run(sample, "checkpoint", "show", sample.run_id, "-o", str(note))[0] == 0
    text = note.read_text()
    body, _, signatures = text.partition("\n\n")
    lines = body.split("\n")
    broken = tmp_path / "broken.note"
    broken.write_text(
        "\n".join([lines[0], str(int(lines[1]) + 1), *lines[2:]]) + "\n\n" + signatures
    )
    out = tmp_path / "run.hlb"
    for bad, expected in ((broken, "checkpoint note"), (note, "")):
        code, output = run(
            sample, "export", sample.run_id, "-o", str(out), "--checkpoint", str(bad)
        )
        if bad is note:
            assert code == 0, output  # the run's own note is carried
            continue
        assert code == 2 and expected in output and "holedger checkpoint show" in output, output
        assert not out.exists()
