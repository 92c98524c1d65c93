"""The tamper matrix of the ledger tests, applied to bundle files: every case detected.

Each attack edits a genuine bundle the way an attacker holding only the file would, and
rebuilds it with a consistent end entry, so the container itself gives nothing away.
Verification runs the integrity checks (other checks off, as the ledger tamper matrix
does) plus the bundle's own checks, and must name what was changed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest

from holedger.bundles.export import export_bundle
from holedger.bundles.format import git_object_id
from holedger.bundles.verify import verify_bundle
from holedger.errors import BundleError
from holedger.ledger.fastpath import parse_record
from holedger.ledger.keys import PublicKey, SigningKey
from holedger.ledger.note import parse_note, sign_note
from holedger.ledger.records import sign_event
from holedger.replay.report import ReplayReport
from holedger.schemas.canonical import canonical_json

from .bundlefile import entries_of, records, replace_records, resign_run, rewrite
from .conftest import SampleRun


@pytest.fixture(scope="module")
def genuine(sample: SampleRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("genuine") / "run.hlb"
    export_bundle(sample.ledger, sample.run_id, out, repo_path=sample.repo)
    return out


def check(path: Path, **kwargs: object) -> ReplayReport:
    return verify_bundle(path, checks=(), **kwargs)  # type: ignore[arg-type]


def assert_named(report: ReplayReport, check_name: str, seq: int | None = None) -> None:
    assert not report.verified
    assert check_name in report.failed_checks(), report.checks
    if seq is not None:
        named = [(f.check, f.seq) for f in report.failures]
        assert (check_name, seq) in named, named


def flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x01
    return bytes(b)


def test_genuine_bundle_verifies(genuine: Path) -> None:
    assert check(genuine).verified


@pytest.mark.parametrize("where", ["payload", "signature"])
def test_one_flipped_byte_in_every_record_is_named(
    genuine: Path, tmp_path: Path, where: str
) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    for seq, raw in enumerate(recs):
        if where == "payload":
            start = raw.index(b'"payload":{') + len(b'"payload":{')
            pos = (start + raw.index(b',"prev_hash":')) // 2
        else:
            pos = raw.rindex(b',"sig":"') + len(b',"sig":"') + 10
        mutated = [*recs[:seq], flip(raw, pos), *recs[seq + 1 :]]
        path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, mutated))
        report = check(path)
        assert not report.verified, (seq, where)
        assert any(f.seq == seq for f in report.failures), (seq, report.failures)


def test_random_flips_anywhere_in_records_never_verify(genuine: Path, tmp_path: Path) -> None:
    rng = random.Random(7)
    entries = entries_of(genuine)
    recs = records(entries)
    for seq, raw in enumerate(recs):
        mutated = list(recs)
        mutated[seq] = flip(raw, rng.randrange(len(raw)))
        path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, mutated))
        assert not check(path).verified, seq


def test_deleted_middle_record_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, recs[:5] + recs[6:]))
    assert_named(check(path), "sequence", 6)


def test_two_swapped_records_are_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    recs[3], recs[4] = recs[4], recs[3]
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, recs))
    assert_named(check(path), "sequence", 4)
    assert_named(check(path), "chain")


def test_record_from_another_run_is_named(sample: SampleRun, genuine: Path, tmp_path: Path) -> None:
    from .conftest import record_sample

    other = record_sample(sample.ledger, sample.settings, candidates=1, pad=2)
    other_path = tmp_path / "other.hlb"
    export_bundle(sample.ledger, other.run_id, other_path)
    entries = entries_of(genuine)
    recs = records(entries)
    recs[2] = records(entries_of(other_path))[2]
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, recs))
    assert_named(check(path), "run", 2)


def _forge(raw: bytes, key: SigningKey, **changes: object) -> bytes:
    rec = parse_record(raw)
    env = dict(rec.envelope)
    env.update(changes)
    forged = sign_event(
        key,
        run_id=env["run_id"],
        seq=env["seq"],
        event_type=env["type"],
        role=env["role"],
        prev_hash=env["prev_hash"],
        payload=env["payload"],
        time=env["time"],
    )
    return forged.raw


def test_forged_record_signed_by_an_outsider_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    outsider = SigningKey.generate("holedger-operator")
    payload = dict(parse_record(recs[7]).payload)
    payload["detail"] = "nothing happened"
    recs[7] = _forge(recs[7], outsider, payload=payload)
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, recs))
    assert_named(check(path), "signatures", 7)


def _with_keys(entries: list[tuple[int, bytes]], key: SigningKey) -> list[tuple[int, bytes]]:
    out = []
    for kind, data in entries:
        if kind == 0x02:
            role = json.loads(data)["role"]
            data = canonical_json({"role": role, "vkey": key.public.vkey()})
        out.append((kind, data))
    return out


def test_whole_run_resigned_is_caught_by_a_pinned_key_or_a_published_checkpoint(
    sample: SampleRun, genuine: Path, tmp_path: Path
) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    attacker = SigningKey.generate("holedger-operator")
    forged = _with_keys(replace_records(entries, resign_run(recs, attacker)), attacker)
    path = rewrite(genuine, tmp_path / "t.hlb", forged)
    assert check(path).verified  # self-consistent: nothing pinned, nothing published
    assert_named(check(path, trusted_keys=[sample.key.public]), "keys", 0)
    published = str(parse_record(recs[-1]).payload["note"])  # the genuine final checkpoint
    assert_named(check(path, external_checkpoints=[published]), "published_checkpoints")


def test_truncated_tail_is_named_and_a_published_checkpoint_pins_the_length(
    genuine: Path, tmp_path: Path
) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    cut = recs[:-2]  # RunClosed and the final Checkpoint removed
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, cut))
    assert_named(check(path), "closed")
    # Truncate to the last intermediate checkpoint and forge nothing: still not closed.
    last_cp = max(i for i, r in enumerate(recs[:-2]) if parse_record(r).type == "Checkpoint")
    path = rewrite(genuine, tmp_path / "t2.hlb", replace_records(entries, recs[: last_cp + 1]))
    assert_named(check(path), "closed")
    published = str(parse_record(recs[-1]).payload["note"])
    report = check(path, external_checkpoints=[published])
    assert_named(report, "published_checkpoints")
    assert any("not in the log" in f.reason for f in report.failures)


def test_runclosed_removed_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    path = rewrite(genuine, tmp_path / "t.hlb", replace_records(entries, recs[:-2] + recs[-1:]))
    report = check(path)
    assert_named(report, "sequence", len(recs) - 1)
    assert_named(report, "closed")


def test_replaced_blob_content_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    blob_at = next(i for i, (k, _) in enumerate(entries) if k == 0x04)
    kind, data = entries[blob_at]
    entries[blob_at] = (kind, data[:32] + b"replaced evidence")
    report = check(rewrite(genuine, tmp_path / "t.hlb", entries))
    assert_named(report, "blobs")
    assert any("altered" in f.reason for f in report.failures)


def test_removed_blob_is_named_missing(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    blob_at = next(i for i, (k, _) in enumerate(entries) if k == 0x04)
    del entries[blob_at]
    report = check(rewrite(genuine, tmp_path / "t.hlb", entries))
    assert_named(report, "blobs")
    assert any("missing" in f.reason for f in report.failures)


def test_blob_turned_into_a_redaction_is_refused_or_visible(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    blob_at = next(i for i, (k, _) in enumerate(entries) if k == 0x04)
    digest = entries[blob_at][1][:32]
    del entries[blob_at]
    last_blob = max(i for i, (k, _) in enumerate(entries) if k == 0x04)
    entries.insert(last_blob + 1, (0x05, digest))
    with pytest.raises(BundleError, match="not redacted"):
        check(rewrite(genuine, tmp_path / "t.hlb", entries))
    # Also flipping the manifest's flag: the report then says the bundle is redacted.
    manifest = json.loads(entries[0][1])
    manifest["redacted"] = True
    entries[0] = (0x01, canonical_json(manifest))
    report = check(rewrite(genuine, tmp_path / "t2.hlb", entries))
    assert report.sections["redacted"] == {"blobs": 1}
    assert report.sections["bundle"]["redacted"] is True


def test_a_manifest_flag_flipped_to_redacted_does_not_make_the_report_say_so(
    genuine: Path, tmp_path: Path
) -> None:
    """The manifest is not signed: its flag alone, flipped to true on a bundle that holds
    every blob, changes nothing the report says; every blob is still checked."""
    entries = entries_of(genuine)
    manifest = json.loads(entries[0][1])
    assert manifest["redacted"] is False
    manifest["redacted"] = True
    entries[0] = (0x01, canonical_json(manifest))
    report = check(rewrite(genuine, tmp_path / "flag.hlb", entries))
    assert report.verified, report.failures
    assert report.sections["bundle"]["redacted"] is False
    assert "redacted" not in report.sections
    assert check(genuine).sections["bundle"]["redacted"] is False


def _git_entries(entries: list[tuple[int, bytes]]) -> list[int]:
    return [i for i, (k, _) in enumerate(entries) if k == 0x06]


def test_git_object_with_altered_bytes_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    i = _git_entries(entries)[0]
    kind, data = entries[i]
    entries[i] = (kind, data + b"x")
    report = check(rewrite(genuine, tmp_path / "t.hlb", entries))
    assert_named(report, "git")
    assert any("does not hash to its id" in f.reason for f in report.failures)


def test_candidate_code_swapped_for_other_code_is_named(
    sample: SampleRun, genuine: Path, tmp_path: Path
) -> None:
    """The attacker replaces a candidate's file with other content (valid git objects)."""
    entries = entries_of(genuine)
    for i in _git_entries(entries):
        kind, data = entries[i]
        if data[0] == 3 and b"VERSION = 2" in data[21:]:
            body = b"VERSION = 2  # and something else\n"
            entries[i] = (kind, bytes([3]) + git_object_id(3, body) + body)
    report = check(rewrite(genuine, tmp_path / "t.hlb", entries))
    assert_named(report, "git")
    assert any("incomplete" in f.reason for f in report.failures)


def test_removed_candidate_commit_is_named(
    sample: SampleRun, genuine: Path, tmp_path: Path
) -> None:
    entries = entries_of(genuine)
    target = bytes.fromhex(sample.commits[1])
    entries = [(k, d) for k, d in entries if not (k == 0x06 and d[1:21] == target)]
    entries = [(k, d) for k, d in entries if not (k == 0x07 and d[:20] == target)]
    report = check(rewrite(genuine, tmp_path / "t.hlb", entries))
    assert_named(report, "git")
    assert any("not in the bundled history" in f.reason for f in report.failures)


def test_replaced_key_list_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = _with_keys(entries_of(genuine), SigningKey.generate("holedger-operator"))
    assert_named(check(rewrite(genuine, tmp_path / "t.hlb", entries)), "bundle_keys")


def test_checkpoint_note_signed_by_another_key_is_named(genuine: Path, tmp_path: Path) -> None:
    entries = entries_of(genuine)
    recs = records(entries)
    note = str(parse_record(recs[-1]).payload["note"])
    text = parse_note(note).text
    forged = sign_note(text, SigningKey.generate("holedger-operator"))
    end = len(entries) - 1
    entries.insert(end, (0x08, forged.encode()))
    assert_named(check(rewrite(genuine, tmp_path / "t.hlb", entries)), "published_checkpoints")


@pytest.mark.parametrize("cut", [1, 5, 100, 1000])
def test_truncated_file_is_a_bundle_error(genuine: Path, tmp_path: Path, cut: int) -> None:
    data = genuine.read_bytes()
    path = tmp_path / "cut.hlb"
    path.write_bytes(data[:-cut])
    with pytest.raises(BundleError):
        check(path)


def test_pinned_key_list_reflects_declared_keys(sample: SampleRun, genuine: Path) -> None:
    report = check(genuine, trusted_keys=[sample.key.public])
    assert report.verified
    key = PublicKey(sample.key.name, base64.b64decode(sample.key.public.b64))
    assert report.sections["trust"]["keys"] == [key.vkey()]
    assert hashlib.sha256(genuine.read_bytes()).hexdigest() == report.sections["bundle"]["sha256"]
