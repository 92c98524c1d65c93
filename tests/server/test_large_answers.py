"""A harness whose dev answers are large: the run stays exportable and verifiable.

Each answer here is about 700 kB and a request runs 24 trials, so inlining every answer
would make one DisclosureProjected record larger than a bundle record may be (16 MiB).
The rules show such answers by digest; the optimizer fetches them as blobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from holedger.bundles.export import export_bundle
from holedger.bundles.format import KIND_RECORD, LIMITS
from holedger.bundles.verify import verify_bundle
from holedger.errors import NotFoundError
from holedger.server.service import RunService
from holedger.server.taskview import ServerTask

from .conftest import _home, _service
from .helpers import candidate_with_main
from .tinytask import CASES, make_task, write_seed

ANSWER_CHARS = 700_000

BIG_MAIN = f"""import json, sys
case = json.loads(sys.stdin.read())
q = case["q"]
print(json.dumps({{"answer": q.upper(), "notes": q[-1] * {ANSWER_CHARS}}}))
"""


@pytest.fixture
def big_service(tmp_path: Path) -> Iterator[RunService]:
    seed = write_seed(tmp_path)
    (seed / "harness" / "__main__.py").write_text(BIG_MAIN)
    task = make_task(tmp_path / "task", ref="big", seed=seed, k=1)
    svc = _service(_home(tmp_path), task)
    yield svc
    svc.close()
    svc.ledger.close()


def test_large_dev_answers_keep_the_run_exportable(big_service: RunService, tmp_path: Path) -> None:
    service = big_service
    run_id = service.open_run("big").run_id
    dev = service.evaluate(run_id, "seed", "dev", CASES["dev"], 4)
    trials = [t for case in dev.projection["cases"].values() for t in case["trials"]]
    assert len(trials) == 24
    # Each answer is over the inline cap: all are shown by digest, and all score 1.
    assert all(t["answer_in_blob"] is True and t["answer"] is None for t in trials)
    assert dev.projection["cases"]["dev-1"]["mean"] == "1"
    # The optimizer fetches a withheld answer by its digest.
    fetched = json.loads(service.disclosed_blob(run_id, trials[0]["answer_digest"]))
    assert len(fetched["notes"]) == ANSWER_CHARS
    # What the answers weigh in all is more than one bundle record may hold.
    answer_bytes = sum(len(service.ledger.get_blob(t["answer_digest"])) for t in trials)
    assert answer_bytes > LIMITS[KIND_RECORD]
    service.nominate(run_id, "seed")

    out = tmp_path / "run.hlb"
    export_bundle(service.ledger, run_id, out, repo_path=service.settings.run_repo(run_id))
    report = verify_bundle(out)
    assert report.verified, report.failures
    # Redacted, the answers are unknown to the verifier; withholding them still agrees.
    redacted = tmp_path / "redacted.hlb"
    export_bundle(
        service.ledger, run_id, redacted, redact=True, repo_path=service.settings.run_repo(run_id)
    )
    report = verify_bundle(redacted)
    assert report.verified, report.failures


def test_a_digest_inside_an_answer_opens_no_blob(
    fresh_service: RunService, tiny: ServerTask
) -> None:
    """A blob is fetchable when a projection names it in a digest field, not in an answer.

    The store is shared by every run on the ledger: a harness that prints the digest of a
    blob it guessed must not turn the blob endpoint into a reader (or an existence test).
    """
    service = fresh_service
    secret = service.ledger.put_blob(b"a body of another run")
    run_id = service.open_run("tiny").run_id
    main = f'import json\nprint(json.dumps({{"answer": "{secret}"}}))\n'
    candidate = candidate_with_main(service, run_id, tiny, main)
    dev = service.evaluate(run_id, candidate, "dev", ["dev-1"], 1)
    (trial,) = dev.projection["cases"]["dev-1"]["trials"]
    assert trial["answer"] == {"answer": secret}
    assert json.loads(service.disclosed_blob(run_id, trial["answer_digest"])) == trial["answer"]
    with pytest.raises(NotFoundError):
        service.disclosed_blob(run_id, secret)
