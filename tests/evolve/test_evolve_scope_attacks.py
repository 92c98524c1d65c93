"""Scope escapes in a solve-evolve run, as the key holder would record them: a changed path
that climbs out of the scope (``..``, an empty or ``.`` part, absolute), a rename from
inside the scope to outside it, another case of the scope folder. Each is a path outside
the editable scope, and replay's ``evolve_scope`` names it; the server's own diff of two
trees lists both ends of a rename, so it cannot record one end only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.protocol import evolve
from holedger.server.candidates import changed_paths

from .writer import H1, SEED, EvolveWriter, failed

SCOPE = ["harness/prompts/"]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}", SigningKey.generate("scope-attack"))
    yield led
    led.close()


@pytest.mark.parametrize(
    "path",
    [
        "harness/prompts/../../corpus/answers.txt",
        "harness/prompts/../__main__.py",
        "harness/prompts/./../x.py",
        "harness/prompts//x.txt",
        "/harness/prompts/x.txt",
        "Harness/prompts/p.txt",
    ],
)
def test_a_path_that_leaves_the_scope_by_its_spelling_is_outside_it(path: str) -> None:
    assert not evolve.in_scope(path, SCOPE)
    assert evolve.outside_scope(["harness/prompts/p.txt", path], SCOPE) == [path]


def test_a_rename_out_of_the_scope_changes_both_paths() -> None:
    before = {"harness/prompts/p.txt": "blob1", "harness/__main__.py": "blob2"}
    after = {"harness/p.txt": "blob1", "harness/__main__.py": "blob2"}  # moved out
    assert changed_paths(before, after) == ["harness/p.txt", "harness/prompts/p.txt"]
    assert evolve.outside_scope(changed_paths(before, after), SCOPE) == ["harness/p.txt"]


@pytest.mark.parametrize(
    "paths",
    [
        ["harness/prompts/../../corpus/answers.txt"],  # climbs out with '..'
        ["harness/prompts/p.txt", "harness/p.txt"],  # a rename out of the scope
    ],
)
def test_a_re_signed_commit_escaping_the_scope_fails_evolve_scope(
    ledger: Ledger, paths: list[str]
) -> None:
    w = EvolveWriter(ledger)
    w.solve(1, SEED, {"dev-0": 0, "dev-1": 1})
    w.commit(H1, SEED, paths)
    w.close_step(1, "committed", SEED, H1)
    for step in (2, 3):
        w.solve(step, H1, {f"dev-{2 * step - 2}": 1, f"dev-{2 * step - 1}": 1})
        w.close_step(step, "unchanged", H1, H1)
    w.finish()
    report = w.replay()
    assert set(failed(report)) == {"evolve_scope"}, failed(report)
    outside = evolve.outside_scope(paths, SCOPE)[0]
    assert f"changes {outside!r}, outside the editable scope" in failed(report)["evolve_scope"]
