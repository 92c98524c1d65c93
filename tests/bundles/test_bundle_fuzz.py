"""Fuzzing the bundle reader: malformed input gives one BundleError, never a crash.

Hypothesis feeds a few thousand inputs: random bytes, random entry streams in the
documented layout, and mutations of a genuine bundle (flipped bytes, cut or inserted
bytes, rewritten length fields). Any exception other than BundleError fails the test,
and so does any file left behind: the reader's only writes go into a private temporary
folder (pointed at an empty directory here) that is gone when verification ends.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holedger.bundles.export import export_bundle
from holedger.bundles.format import open_bundle
from holedger.bundles.verify import verify_bundle
from holedger.errors import BundleError

from .bundlefile import read_entries, write_entries
from .conftest import SampleRun


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        derandomize=True,
    )


@pytest.fixture(scope="module")
def genuine_bytes(sample: SampleRun, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("fuzz") / "run.hlb"
    export_bundle(sample.ledger, sample.run_id, out, repo_path=sample.repo)
    return out.read_bytes()


@pytest.fixture()
def sandbox(tmp_path: Path) -> Iterator[Path]:
    """A working folder and an empty private temp folder, both checked after each input."""
    work = tmp_path / "work"
    temp = tmp_path / "temp"
    work.mkdir()
    temp.mkdir()
    old_cwd, old_temp = Path.cwd(), tempfile.tempdir
    os.chdir(work)
    tempfile.tempdir = str(temp)
    try:
        yield work
    finally:
        os.chdir(old_cwd)
        tempfile.tempdir = old_temp


def _feed(work: Path, data: bytes, full: bool) -> None:
    path = work / "input.hlb"
    path.write_bytes(data)
    try:
        if full:
            verify_bundle(path, checks=())
        else:
            with open_bundle(path) as bundle:
                list(bundle.records())
    except BundleError as exc:
        assert exc.one_line() and "\n" not in exc.message
    assert sorted(p.name for p in work.iterdir()) == ["input.hlb"]
    assert list(Path(tempfile.gettempdir()).iterdir()) == []
    parent_files = sorted(p.name for p in work.parent.iterdir())
    assert parent_files == ["temp", "work"]


@fuzz(1000)
@given(data=st.binary(max_size=512))
def test_random_bytes(sandbox: Path, data: bytes) -> None:
    _feed(sandbox, data, full=False)


@fuzz(600)
@given(data=st.binary(max_size=256))
def test_random_bytes_after_a_valid_header(sandbox: Path, data: bytes) -> None:
    _feed(sandbox, b"HLBUNDLE\x00\x01" + data, full=True)


ENTRY = st.tuples(
    st.sampled_from([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0xFF]),
    st.binary(max_size=64),
)


@fuzz(600)
@given(entries=st.lists(ENTRY, max_size=12), lie=st.integers(0, 2**32 - 1))
def test_random_entry_streams(sandbox: Path, entries: list[tuple[int, bytes]], lie: int) -> None:
    manifest = b'{"format":"holedger-run-bundle","redacted":false,"run_id":"x","version":1}'
    data = write_entries(1, [(0x01, manifest), *sorted(entries, key=lambda e: e[0])])
    _feed(sandbox, data, full=True)
    # The same stream with one length field claiming up to 4 GiB.
    if len(data) > 20:
        _feed(sandbox, data[:10] + struct.pack(">BI", data[10], lie) + data[15:], full=False)


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.integers(1, 4000)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("length"), st.integers(0, 200), st.integers(0, 2**32 - 1)),
)


def _mutate(data: bytes, mutations: list[tuple[object, ...]]) -> bytes:
    buf = bytearray(data)
    for op, a, b in mutations:
        assert isinstance(a, int)
        if not buf:
            break
        pos = a % len(buf)
        if op == "flip":
            assert isinstance(b, int)
            buf[pos] ^= 1 << b
        elif op == "cut":
            assert isinstance(b, int)
            del buf[pos : pos + b]
        elif op == "insert":
            assert isinstance(b, bytes)
            buf[pos:pos] = b
        else:  # rewrite the length field of the a-th entry
            assert isinstance(b, int)
            offset, index = 10, 0
            while offset + 5 <= len(buf) and index < a:
                (length,) = struct.unpack(">I", buf[offset + 1 : offset + 5])
                offset += 5 + length
                index += 1
            if offset + 5 <= len(buf):
                buf[offset + 1 : offset + 5] = struct.pack(">I", b)
    return bytes(buf)


@fuzz(700)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_genuine_bundle(
    sandbox: Path, genuine_bytes: bytes, mutations: list[tuple[object, ...]]
) -> None:
    _feed(sandbox, _mutate(genuine_bytes, mutations), full=True)


@fuzz(150)
@given(data=st.data())
def test_entries_of_a_genuine_bundle_reordered_or_dropped(
    sandbox: Path, genuine_bytes: bytes, data: st.DataObject
) -> None:
    version, entries = read_entries(genuine_bytes)
    picked = data.draw(st.lists(st.sampled_from(range(len(entries))), max_size=len(entries)))
    _feed(sandbox, write_entries(version, [entries[i] for i in picked]), full=True)


def test_a_huge_declared_length_is_refused_before_reading(sandbox: Path) -> None:
    manifest = b'{"format":"holedger-run-bundle","redacted":false,"run_id":"x","version":1}'
    data = b"HLBUNDLE\x00\x01" + struct.pack(">BI", 0x01, len(manifest)) + manifest
    data += struct.pack(">BI", 0x03, 2**32 - 1)
    path = sandbox / "input.hlb"
    path.write_bytes(data)
    with pytest.raises(BundleError, match=r"out of bounds|past the end"):
        open_bundle(path)


def test_ref_names_cannot_point_outside(sandbox: Path, genuine_bytes: bytes) -> None:
    version, entries = read_entries(genuine_bytes)
    ref = next(i for i, (k, _) in enumerate(entries) if k == 0x07)
    entries[ref] = (0x07, entries[ref][1][:20] + b"refs/candidates/../../../escape")
    path = sandbox / "input.hlb"
    path.write_bytes(write_entries(version, entries))
    report = verify_bundle(path, checks=())
    assert "git" in report.failed_checks()
    assert not (sandbox.parent / "escape").exists() and not Path("escape").exists()


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@fuzz(100)
@given(data=st.data())
def test_attacker_signed_payloads_through_every_projection(
    sandbox: Path, genuine_bytes: bytes, data: st.DataObject
) -> None:
    """Validly signed (by the attacker's own declared key) but odd payloads: every
    projection sees them; the verdict may be anything, but only a report or a
    BundleError may come out."""
    from holedger.ledger.fastpath import parse_record
    from holedger.ledger.keys import SigningKey
    from holedger.schemas.canonical import canonical_json

    from .bundlefile import records, replace_records, resign_run

    version, entries = read_entries(genuine_bytes)
    recs = records(entries)
    seq = data.draw(st.integers(1, len(recs) - 1))
    rec = parse_record(recs[seq])
    env = dict(rec.envelope)
    payload = dict(rec.payload)
    if payload:
        field = data.draw(st.sampled_from(sorted(payload)))
        payload[field] = data.draw(JSON_VALUE)
    env["payload"] = payload
    env["sig"] = rec.envelope.get("sig", "")
    raw = dict(env)
    raw["sig"] = "A" * 86 + "=="
    recs[seq] = canonical_json(raw)
    forged = resign_run(recs, SigningKey.generate("attacker"))
    path = sandbox / "input.hlb"
    path.write_bytes(write_entries(version, replace_records(entries, forged)))
    try:
        verify_bundle(path)
    except BundleError:
        pass
    path.unlink()
    _feed(sandbox, b"", full=False)
