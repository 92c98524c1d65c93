"""The optimizer HTTP API on a real uvicorn server, spoken to with a real HTTP client."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from holedger.config import Settings
from holedger.gateway.serve import AppServer
from holedger.server.api import create_api_app
from holedger.server.candidates import read_directory
from holedger.server.service import OpenedRun, RunService
from holedger.server.taskview import ServerTask

from .helpers import assert_replay_verifies
from .tinytask import CASES, PERFECT_MAIN, question


@pytest.fixture(scope="module")
def api(service: RunService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    sock = tmp_path_factory.mktemp("api") / "api.sock"
    server = AppServer(create_api_app(service), host="127.0.0.1", port=0, uds=sock)
    server.start()
    yield server
    server.stop()


def _client(api: AppServer, token: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{api.port}", headers=headers, timeout=120)


def _seed_files(task: ServerTask) -> dict[str, str]:
    return {p: e.data.decode() for p, e in read_directory(task.seed_dir).items()}


def test_an_optimizer_runs_a_whole_search_over_http(
    api: AppServer, service: RunService, tiny: ServerTask
) -> None:
    opened = service.open_run("tiny", optimizer="http-optimizer")
    run = opened.run_id
    with _client(api, opened.optimizer_token) as http:
        info = http.get(f"/v1/runs/{run}").json()
        assert info["task_id"] == tiny.terms.task_id
        assert info["dev"]["case_ids"] == CASES["dev"]
        assert info["dev"]["inputs"]["dev-1"] == {"q": question("dev-1")}
        assert info["val"] == {"case_ids": CASES["val"]}
        assert info["budget_remaining"]["dev"] == {"calls": 100, "case_passes": "4"}
        text = str(info)
        assert "test-" not in text and "EASY" not in text  # no test ids, no answers

        files = _seed_files(tiny)
        files["harness/__main__.py"] = PERFECT_MAIN
        made = http.post(f"/v1/runs/{run}/candidates", json={"files": files})
        assert made.status_code == 201, made.text
        candidate = made.json()["candidate"]
        assert made.json()["changed_paths"] == ["harness/__main__.py"]

        ev = http.post(
            f"/v1/runs/{run}/evaluations",
            json={"candidate": candidate[:8], "split": "dev", "case_ids": ["dev-0"], "attempts": 1},
        )
        assert ev.status_code == 200, ev.text
        trial = ev.json()["projection"]["cases"]["dev-0"]["trials"][0]
        assert trial["score"] == "1" and trial["answer"] == {"answer": "HARD DEV 0"}
        assert ev.json()["budget_used"]["dev"] == {"calls": 1, "case_passes": "1/6"}
        blob = http.get(f"/v1/runs/{run}/blobs/{trial['answer_digest']}")
        assert blob.status_code == 200 and b"HARD DEV 0" in blob.content

        val = http.post(
            f"/v1/runs/{run}/evaluations",
            json={"candidate": "seed", "split": "val", "case_ids": CASES["val"][:6]},
        )
        assert val.json()["projection"] == {"cases": 6, "trials": 6, "mean": "2/3"}
        # The answer is the recorded projection and the bookkeeping, nothing more.
        assert (
            set(val.json())
            == set(ev.json())
            == {
                "request_id",
                "candidate",
                "split",
                "policy",
                "projection",
                "projection_digest",
                "cost",
                "budget_used",
            }
        )

        early = http.post(
            f"/v1/runs/{run}/evaluations",
            json={"candidate": "seed", "split": "test", "attempts": tiny.terms.k},
        )
        assert early.status_code == 409 and "test split" in early.json()["error"]["message"]

        nominated = http.post(f"/v1/runs/{run}/nomination", json={"candidate": candidate})
        assert nominated.status_code == 200, nominated.text
        assert nominated.json() == {"run_id": run, "nominated": candidate, "state": "closed"}
        again = http.post(f"/v1/runs/{run}/nomination", json={"candidate": "seed"})
        assert again.status_code == 409
    assert_replay_verifies(service.ledger, run)


def test_tar_uploads_and_unsafe_archives(
    api: AppServer, service: RunService, tiny: ServerTask
) -> None:
    opened = service.open_run("tiny")
    run = opened.run_id

    def archive(extra: tarfile.TarInfo | None = None) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path, text in _seed_files(tiny).items():
                data = text.encode() + (b"# v2\n" if path.endswith("__main__.py") else b"")
                info = tarfile.TarInfo(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if extra is not None:
                tar.addfile(extra, io.BytesIO(b""))
        return buf.getvalue()

    events = lambda: sum(1 for _ in service.ledger.records(run))  # noqa: E731
    with _client(api, opened.optimizer_token) as http:
        ok = http.post(
            f"/v1/runs/{run}/candidates",
            content=archive(),
            headers={"content-type": "application/gzip"},
        )
        assert ok.status_code == 201, ok.text
        before = events()
        link = tarfile.TarInfo("harness/x.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        bad = http.post(
            f"/v1/runs/{run}/candidates",
            content=archive(link),
            headers={"content-type": "application/gzip"},
        )
        assert bad.status_code == 409 and "link" in bad.json()["error"]["message"]
        escape = http.post(
            f"/v1/runs/{run}/candidates",
            json={"files": {"harness/__main__.py": "pass", "../../evil.py": "x"}},
        )
        assert escape.status_code == 409
        b64 = base64.b64encode(b"\0" * 10).decode()
        immutable = http.post(
            f"/v1/runs/{run}/candidates",
            json={"files": {**_seed_files(tiny), "rules/policy.txt": {"base64": b64}}},
        )
        assert immutable.status_code == 409 and "immutable" in immutable.text
        huge = http.post(
            f"/v1/runs/{run}/candidates",
            content=b"\0" * ((16 << 20) + 10),
            headers={"content-type": "application/gzip"},
        )
        assert huge.status_code == 413
        assert events() == before


def test_missing_wrong_and_foreign_tokens_are_refused(
    api: AppServer, service: RunService, home: Settings
) -> None:
    mine = service.open_run("tiny")
    other = service.open_run("tiny")
    run = mine.run_id
    for token in (None, "hlg_not-a-real-token", "Basic abc"):
        with _client(api, token) as http:
            response = http.get(f"/v1/runs/{run}")
            assert response.status_code == 401
    with _client(api, other.optimizer_token) as http:
        foreign = http.get(f"/v1/runs/{run}")
        assert foreign.status_code == 403
        assert (
            http.post(f"/v1/runs/{run}/nomination", json={"candidate": "seed"}).status_code == 403
        )
    violations = [
        r.payload
        for r in service.ledger.records(other.run_id)
        if r.type == "SafetyViolation" and r.payload["category"] == "foreign_token"
    ]
    assert len(violations) == 2
    assert not service.state(run).nominated
    # A revoked token is dead.
    from holedger.gateway.tokens import TokenRegistry

    TokenRegistry(service.ledger.app.engine).revoke(mine.optimizer_token)
    with _client(api, mine.optimizer_token) as http:
        assert http.get(f"/v1/runs/{run}").status_code == 401


def test_blobs_not_disclosed_to_the_run_are_refused(api: AppServer, service: RunService) -> None:
    opened = service.open_run("tiny")
    run = opened.run_id
    with _client(api, opened.optimizer_token) as http:
        http.post(
            f"/v1/runs/{run}/evaluations",
            json={"candidate": "seed", "split": "val", "case_ids": CASES["val"][:5]},
        )
        hidden = [
            r.payload["trace_digest"]
            for r in service.ledger.records(run)
            if r.type == "TrialCompleted"
        ]
        assert hidden
        for digest in hidden:
            assert http.get(f"/v1/runs/{run}/blobs/{digest}").status_code == 404
        assert http.get(f"/v1/runs/{run}/blobs/not-a-digest").status_code == 400


def test_the_api_is_served_on_a_unix_socket(api: AppServer, service: RunService) -> None:
    opened = service.open_run("tiny")
    sock = next(u for u in api.urls if u.startswith("unix:")).removeprefix("unix:")
    transport = httpx.HTTPTransport(uds=sock)
    with httpx.Client(
        transport=transport,
        base_url="http://api",
        headers={"authorization": f"Bearer {opened.optimizer_token}"},
    ) as http:
        assert http.get(f"/v1/runs/{opened.run_id}").json()["run_id"] == opened.run_id
    assert Path(sock).exists()


def test_malformed_requests_are_refused_without_a_record(
    api: AppServer, service: RunService
) -> None:
    opened = service.open_run("tiny")
    run = opened.run_id
    before = sum(1 for _ in service.ledger.records(run))
    with _client(api, opened.optimizer_token) as http:
        url = f"/v1/runs/{run}/evaluations"
        bad = [
            {"candidate": "seed", "split": "dev", "attempts": 0},
            {"candidate": "seed", "split": "dev", "attempts": True},
            {"candidate": "seed", "split": "train"},
            {"candidate": "seed", "split": "dev", "case_ids": "dev-1"},
            {"candidate": "seed", "split": "dev", "case_ids": ["no-such-case"]},
            {"candidate": "nope", "split": "dev"},
            {"split": "dev"},
            {"candidate": "seed", "split": "dev", "attempts": 2**60},
        ]
        for body in bad:
            response = http.post(url, json=body)
            assert response.status_code in (400, 404), (body, response.text)
            assert "error" in response.json()
        for content in (b"{not json", b"[" * 100_000 + b"]" * 100_000):
            raw = http.post(url, content=content, headers={"content-type": "application/json"})
            assert raw.status_code == 400, raw.text
        surrogate = b'{"candidate": "seed", "split": "dev", "case_ids": ["\\ud800"]}'
        raw = http.post(url, content=surrogate, headers={"content-type": "application/json"})
        assert raw.status_code == 404 and "ud800" in raw.json()["error"]["message"], raw.text
        text = http.post(
            f"/v1/runs/{run}/candidates", content=b"x", headers={"content-type": "text/plain"}
        )
        assert text.status_code == 415
    assert sum(1 for _ in service.ledger.records(run)) == before


@pytest.fixture
def fresh_api(fresh_service: RunService) -> Iterator[tuple[AppServer, OpenedRun]]:
    """The API of a service of its own (these tests stop it), and a run opened on it."""
    opened = fresh_service.open_run("tiny", baseline=False)
    server = AppServer(create_api_app(fresh_service), host="127.0.0.1", port=0)
    server.start()
    yield server, opened
    server.stop()


def test_a_stopping_server_answers_503_and_records_nothing(
    fresh_service: RunService, fresh_api: tuple[AppServer, OpenedRun]
) -> None:
    server, opened = fresh_api
    fresh_service.drain()
    events = len(list(fresh_service.ledger.records(opened.run_id)))
    with _client(server, opened.optimizer_token) as http:
        ev = http.post(
            f"/v1/runs/{opened.run_id}/evaluations",
            json={"candidate": "seed", "split": "dev", "case_ids": ["dev-1"]},
        )
        assert ev.status_code == 503, ev.text
        assert ev.headers["retry-after"] == "30"
        assert ev.json()["error"]["type"] == "unavailable"
        assert http.get(f"/v1/runs/{opened.run_id}").status_code == 200  # reads go on
    assert len(list(fresh_service.ledger.records(opened.run_id))) == events


def test_a_nomination_under_way_answers_503_at_once(
    fresh_service: RunService, fresh_home: Settings, fresh_api: tuple[AppServer, OpenedRun]
) -> None:
    """API threads are shared by every run: a retried nomination must not wait in one."""
    import fcntl

    server, opened = fresh_api
    lock = fresh_home.runs_dir / f"{opened.run_id}.nominate.lock"
    with open(lock, "a+") as held, _client(server, opened.optimizer_token) as http:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a nomination under way holds it
        busy = http.post(f"/v1/runs/{opened.run_id}/nomination", json={"candidate": "seed"})
        assert busy.status_code == 503, busy.text
        assert "already under way" in busy.json()["error"]["message"]
    assert "CandidateNominated" not in {r.type for r in fresh_service.ledger.records(opened.run_id)}
