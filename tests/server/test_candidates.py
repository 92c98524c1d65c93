"""Candidate commits: reproducible seed, and every unsafe tree refused with nothing recorded."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pygit2
import pytest

from holedger.errors import HoledgerError, PolicyError, UsageError
from holedger.server.candidates import (
    CandidateRefused,
    FileEntry,
    TreeLimits,
    clean_path,
    read_directory,
    read_file_map,
    read_tar,
    seed_commit_id,
)
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .tinytask import PERFECT_MAIN, write_seed


def _events(service: RunService, run_id: str) -> int:
    return sum(1 for _ in service.ledger.records(run_id))


def _refs(service: RunService, run_id: str) -> list[str]:
    repo = pygit2.Repository(str(service.settings.run_repo(run_id)))
    return sorted(r for r in repo.references if r.startswith("refs/candidates/"))


def test_seed_commit_id_is_reproducible_from_the_tree_alone(tmp_path: Path) -> None:
    first = write_seed(tmp_path / "a")
    second = write_seed(tmp_path / "b")
    os.utime(second / "harness" / "__main__.py", (1, 1))
    assert seed_commit_id(first) == seed_commit_id(second)
    (second / "harness" / "extra.py").write_text("x = 1\n")
    assert seed_commit_id(first) != seed_commit_id(second)


def test_seed_is_commit_zero_and_matches_the_pinned_id(
    service: RunService, tiny: ServerTask
) -> None:
    opened = service.open_run("tiny")
    state = service.state(opened.run_id)
    seed = state.candidates[tiny.terms.seed_commit]
    assert seed.index == 0 and seed.parent is None
    assert opened.seed_commit == tiny.terms.seed_commit


def test_a_good_candidate_is_committed_with_its_changed_paths(
    service: RunService, tiny: ServerTask
) -> None:
    run_id = service.open_run("tiny").run_id
    files = read_directory(tiny.seed_dir)
    files["harness/__main__.py"] = FileEntry(PERFECT_MAIN.encode())
    files["harness/notes.md"] = FileEntry(b"notes\n")
    result = service.commit_candidate(run_id, files)
    assert result.index == 1 and result.created
    assert result.parent == tiny.terms.seed_commit
    assert result.changed_paths == ["harness/__main__.py", "harness/notes.md"]
    again = service.commit_candidate(run_id, files)
    assert not again.created and again.candidate == result.candidate
    assert f"refs/candidates/{result.candidate}" in _refs(service, run_id)


@pytest.mark.parametrize(
    "bad_path",
    ["../escape.py", "/etc/passwd", "harness/../../x.py", "a//b.py", "./x.py", ".git/config"],
)
def test_escaping_paths_in_a_file_map_are_refused(bad_path: str) -> None:
    with pytest.raises(CandidateRefused):
        read_file_map({"harness/__main__.py": "print(1)", bad_path: "x"})


def _assert_refused_and_nothing_recorded(
    service: RunService, run_id: str, source: object, error: type[HoledgerError] = PolicyError
) -> str:
    before_events = _events(service, run_id)
    before_refs = _refs(service, run_id)
    with pytest.raises(error) as info:
        service.commit_candidate(run_id, source)  # type: ignore[arg-type]
    assert _events(service, run_id) == before_events
    assert _refs(service, run_id) == before_refs
    return str(info.value)


def test_symlinks_are_refused_inside_or_outside(
    service: RunService, tiny: ServerTask, tmp_path: Path
) -> None:
    run_id = service.open_run("tiny").run_id
    for n, target in enumerate(("/etc/passwd", "__main__.py")):
        folder = tmp_path / f"cand-{n}"
        write_seed(folder)
        (folder / "seed" / "harness" / "link.py").symlink_to(target)
        message = _assert_refused_and_nothing_recorded(service, run_id, folder / "seed")
        assert "symbolic link" in message


def test_tar_with_links_or_traversal_is_refused() -> None:
    def tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            ok = tarfile.TarInfo("harness/__main__.py")
            ok.size = 5
            tar.addfile(ok, io.BytesIO(b"pass\n"))
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        return buf.getvalue()

    sym = tarfile.TarInfo("harness/evil.py")
    sym.type = tarfile.SYMTYPE
    sym.linkname = "/etc/shadow"
    hard = tarfile.TarInfo("harness/hard.py")
    hard.type = tarfile.LNKTYPE
    hard.linkname = "harness/__main__.py"
    dotdot = tarfile.TarInfo("../../outside.py")
    absolute = tarfile.TarInfo("/srv/abs.py")
    fifo = tarfile.TarInfo("harness/pipe")
    fifo.type = tarfile.FIFOTYPE
    for member in (sym, hard, dotdot, absolute, fifo):
        with pytest.raises(CandidateRefused):
            read_tar(tar_with(member, b"x" if member.isfile() else b""))
    with pytest.raises(UsageError):
        read_tar(b"not a tar at all")


def test_oversize_trees_are_refused() -> None:
    limits = TreeLimits(max_files=10, max_file_bytes=1000, max_total_bytes=3000)
    many = {f"harness/f{i}.py": "x" for i in range(11)}
    with pytest.raises(CandidateRefused, match="more than 10 files"):
        read_file_map({"harness/__main__.py": "pass", **many}, limits)
    with pytest.raises(CandidateRefused, match="1000 byte limit"):
        read_file_map({"harness/__main__.py": "x" * 1001}, limits)
    with pytest.raises(CandidateRefused, match="3000 byte limit"):
        read_file_map({f"harness/m{i}.py": "x" * 900 for i in range(4)}, limits)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        big = tarfile.TarInfo("harness/__main__.py")
        big.size = 5000
        tar.addfile(big, io.BytesIO(b"#" * 5000))
    with pytest.raises(CandidateRefused, match="1000 byte limit"):
        read_tar(buf.getvalue(), limits)


def test_oversize_directory_is_refused_with_nothing_recorded(
    service: RunService, tmp_path: Path
) -> None:
    run_id = service.open_run("tiny").run_id
    service.tree_limits = TreeLimits(max_files=5)
    folder = write_seed(tmp_path / "big")
    for i in range(5):
        (folder / "harness" / f"m{i}.py").write_text("x = 1\n")
    message = _assert_refused_and_nothing_recorded(service, run_id, folder)
    assert "more than 5 files" in message


def test_missing_entrypoint_is_refused(service: RunService, tiny: ServerTask) -> None:
    run_id = service.open_run("tiny").run_id
    files = read_directory(tiny.seed_dir)
    del files["harness/__main__.py"]
    message = _assert_refused_and_nothing_recorded(service, run_id, files)
    assert "entrypoint" in message


@pytest.mark.parametrize("change", ["edit", "add", "delete"])
def test_immutable_paths_cannot_change(service: RunService, tiny: ServerTask, change: str) -> None:
    run_id = service.open_run("tiny").run_id
    files = read_directory(tiny.seed_dir)
    if change == "edit":
        files["rules/policy.txt"] = FileEntry(b"anything goes\n")
    elif change == "add":
        files["rules/extra.txt"] = FileEntry(b"more\n")
    else:
        del files["rules/policy.txt"]
    message = _assert_refused_and_nothing_recorded(service, run_id, files)
    assert "immutable" in message and "rules/" in message


@pytest.mark.parametrize(
    "name", ["harness/\x1b[2J.py", "harness/evil\u202eyp.py", "harness/a\u200bb.py", "x\n.py"]
)
def test_paths_with_control_or_format_characters_are_refused(name: str) -> None:
    from holedger.untrusted import is_safe

    with pytest.raises(CandidateRefused, match="control or format character") as refused:
        clean_path(name)
    assert is_safe(refused.value.one_line())
