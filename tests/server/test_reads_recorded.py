"""Every read the optimizer makes through the API becomes a signed OptimizerRead event,
written in batches off the request path and flushed before RunClosed; replay checks them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from holedger.gateway.serve import AppServer
from holedger.ledger.records import utc_now
from holedger.schemas.events import OptimizerRead, ReadItem
from holedger.server.api import create_api_app
from holedger.server.lifecycle import abort_run
from holedger.server.reads import ReadRecorder
from holedger.server.service import RunService

from .helpers import assert_replay_verifies


@pytest.fixture(scope="module")
def recorder(service: RunService) -> Iterator[ReadRecorder]:
    # An interval far longer than the test: only the close hook (or a full batch) writes.
    rec = ReadRecorder(service.ledger, batch=4, interval_s=3600)
    yield rec
    rec.close()


@pytest.fixture(scope="module")
def api(
    service: RunService, recorder: ReadRecorder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppServer]:
    sock = tmp_path_factory.mktemp("api") / "api.sock"
    server = AppServer(create_api_app(service, reads=recorder), host="127.0.0.1", port=0, uds=sock)
    server.start()
    yield server
    server.stop()


def _reads(service: RunService, run: str) -> list[tuple[int, ReadItem]]:
    out = []
    for rec in service.ledger.records(run):
        if rec.type == "OptimizerRead":
            out += [(rec.seq, item) for item in OptimizerRead.model_validate(rec.payload).reads]
    return out


def _wait_for(service: RunService, run: str, n: int) -> list[tuple[int, ReadItem]]:
    """The run's recorded reads once there are ``n`` (the writer thread writes them)."""
    for _ in range(400):
        reads = _reads(service, run)
        if len(reads) >= n:
            return reads
        time.sleep(0.025)
    return _reads(service, run)


def test_reads_are_recorded_in_batches_and_flushed_before_the_close(
    api: AppServer, service: RunService, recorder: ReadRecorder
) -> None:
    opened = service.open_run("tiny", optimizer="reader")
    run = opened.run_id
    headers = {"authorization": f"Bearer {opened.optimizer_token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", headers=headers) as http:
        assert http.get(f"/v1/runs/{run}").status_code == 200
        assert http.get(f"/v1/runs/{run}/budget").status_code == 200
        tree = http.get(f"/v1/runs/{run}/candidates/seed/tree?contents=1").json()
        seed = tree["candidate"]
        assert _reads(service, run) == []  # three reads queued, none written yet
        assert recorder.pending(run) == 3
        path = tree["files"][0]["path"]
        assert http.get(f"/v1/runs/{run}/candidates/seed/files/{path}").status_code == 200
        written = _wait_for(service, run, 4)  # the fourth read filled a batch of four
        assert [r.kind for _, r in written] == ["run", "budget", "tree", "file"]
        ev = http.post(
            f"/v1/runs/{run}/evaluations",
            json={"candidate": "seed", "split": "dev", "case_ids": ["dev-0"], "attempts": 1},
        ).json()
        digest = ev["projection"]["cases"]["dev-0"]["trials"][0]["answer_digest"]
        assert http.get(f"/v1/runs/{run}/blobs/{digest}").status_code == 200
        missing = http.get(f"/v1/runs/{run}/blobs/{'0' * 64}")
        assert missing.status_code == 404  # refused: nothing was read, nothing recorded
        listed = http.get(f"/v1/runs/{run}/evaluations").json()["evaluations"]
        assert [e["request_id"] for e in listed] == [ev["request_id"]]
        again = http.get(f"/v1/runs/{run}/evaluations/{ev['request_id']}").json()
        assert again["projection"] == ev["projection"]
        assert again["projection_digest"] == ev["projection_digest"]
        assert http.get(f"/v1/runs/{run}/evaluations/nope").status_code == 404
        assert recorder.pending(run) == 3
        done = http.post(f"/v1/runs/{run}/nomination", json={"candidate": "seed"})
        assert done.status_code == 200, done.text
    records = list(service.ledger.records(run))
    reads = _reads(service, run)
    closed_at = next(r.seq for r in records if r.type == "RunClosed")
    kinds = ["run", "budget", "tree", "file", "blob", "evaluations", "projection"]
    assert [r.kind for _, r in reads] == kinds
    assert reads[6][1].request_id == ev["request_id"]
    assert all(seq < closed_at for seq, _ in reads)
    tree_read, file_read, blob_read = reads[2][1], reads[3][1], reads[4][1]
    assert (tree_read.candidate, tree_read.contents) == (seed, True)
    assert (file_read.candidate, file_read.path) == (seed, path)
    assert (blob_read.digest, blob_read.role) == (digest, "answer")
    projected = next(r.seq for r in records if r.type == "DisclosureProjected")
    assert projected <= blob_read.after_seq < reads[4][0]
    report = assert_replay_verifies(service.ledger, run)
    assert report.sections["reads"]["by_kind"] == dict.fromkeys(sorted(kinds), 1)


def test_a_read_of_a_closed_run_is_dropped_not_appended_after_runclosed(
    service: RunService, recorder: ReadRecorder
) -> None:
    opened = service.open_run("tiny", optimizer="reader")
    abort_run(service, opened.run_id, "test")
    item = ReadItem(kind="run", after_seq=0, time=utc_now())
    recorder.record(opened.run_id, item)
    recorder.flush_run(opened.run_id)
    assert recorder.pending(opened.run_id) == 0
    assert _reads(service, opened.run_id) == []
    assert list(service.ledger.records(opened.run_id))[-1].type in ("RunClosed", "Checkpoint")
