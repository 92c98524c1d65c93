"""The optimizer descriptor is signed into RunOpened; runs without it still read."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_protocol.runs import E_H0, TASK_DIGEST, K, terms

from holedger.cli import cli
from holedger.errors import UsageError
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.schemas.events import OptimizerDescriptor, RunOpened, SeedBaseline
from holedger.server.descriptor_options import descriptor_from


def _open(ledger: Ledger, descriptor: OptimizerDescriptor | None) -> RunOpened:
    run_id = ledger.open_run(
        terms(),
        task_digest=TASK_DIGEST,
        seed_baseline=SeedBaseline(e_h0=E_H0, k=K),
        descriptor=descriptor,
    )
    (first,) = [r for r in ledger.records(run_id) if r.type == "RunOpened"]
    payload = first.typed_payload()
    assert isinstance(payload, RunOpened)
    return payload


def test_descriptor_is_signed_and_read_back(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    d = descriptor_from("gpt-x", "gpt", "2026-05-01", "codex", "native", 2)
    assert d is not None
    opened = _open(ledger, d)
    assert opened.descriptor == d
    assert opened.descriptor.harness_scope == "native"
    assert opened.descriptor.replicate == 2


def test_a_run_without_descriptor_reads_with_fields_unknown(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'l.db'}", SigningKey.generate("t"))
    assert _open(ledger, None).descriptor is None
    # a payload written before the field existed (no "descriptor" member at all) validates
    old = _open(ledger, None).model_dump(mode="json")
    del old["descriptor"]
    assert RunOpened.model_validate(old, strict=True).descriptor is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("m", None, None, None, None, None), "--harness"),
        ((None, None, None, "h", None, None), "--model"),
        (("m", None, "last week", "h", None, None), "--release"),
        (("m", None, None, "h", None, 0), "--replicate"),
    ],
)
def test_bad_descriptor_options_are_named(args: tuple, needle: str) -> None:
    with pytest.raises(UsageError) as err:
        descriptor_from(*args)
    assert needle in str(err.value)


def test_run_open_refuses_a_half_descriptor_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["--home", str(tmp_path / "h"), "run", "open", "--task", "x", "--model", "m"]
    )
    assert result.exit_code == 2
    assert "--harness" in result.output
    assert "Traceback" not in result.output


def test_replay_shows_the_descriptor_or_says_it_is_unknown(tmp_path: Path) -> None:
    from replay_protocol.runs import RunWriter, honest_finish, honest_search

    from holedger.config import Settings

    home = tmp_path / "home"
    runner = CliRunner()
    assert runner.invoke(cli, ["--home", str(home), "init"]).exit_code == 0
    ledger = Ledger.from_settings(Settings.resolve(home))
    d = OptimizerDescriptor(
        model="m1", family="fam", release="3", harness="h1", harness_scope="native"
    )
    described = RunWriter(ledger, terms(seed_commit="a" * 40), descriptor=d)
    labelled = RunWriter(ledger, terms(seed_commit="a" * 40))
    for writer in (described, labelled):
        honest_search(writer, "a" * 40, "b" * 40)
        honest_finish(writer, "b" * 40)
    out = runner.invoke(cli, ["--home", str(home), "replay", described.run_id]).output
    assert (
        "optimizer descriptor: model m1, family fam, release 3, harness h1 (native), "
        "replicate 1" in out
    )
    out = runner.invoke(cli, ["--home", str(home), "replay", labelled.run_id]).output
    assert "optimizer descriptor: unknown (the run records only its label)" in out
