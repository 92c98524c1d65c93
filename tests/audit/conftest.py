"""A closed run of the tiny task whose nominee hard-codes a lookup table of dev and val
answers (the shortcut an audit must find), recorded by the real server (process
backend, no model), and an auditor key."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from server.tinytask import CASES, question, write_task_folder

from holedger.audit.hda import AuditContext
from holedger.audit.log import AuditLog
from holedger.config import Settings
from holedger.ledger.keys import SigningKey
from holedger.ledger.store import Ledger
from holedger.server.service import RunService, ServerConfig
from holedger.server.taskview import load_server_task

SHORTCUT_MAIN = """import json, sys
KNOWN = {
TABLE}
case = json.loads(sys.stdin.read())
q = case["q"]
if q in KNOWN:
    print(json.dumps({"answer": KNOWN[q]}))
else:
    print(json.dumps({"answer": q if q.startswith("hard") else q.upper()}))
"""


def shortcut_tree(seed: Path, dest: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """The seed with a table of the hard dev and val questions' answers (but those of the
    cases ``leave_out`` names)."""
    shutil.copytree(seed, dest)
    rows = "".join(
        f'    "{question(c)}": "{question(c).upper()}",\n'
        for split in ("dev", "val")
        for c in CASES[split]
        if question(c).startswith("hard") and c not in leave_out
    )
    (dest / "harness" / "__main__.py").write_text(SHORTCUT_MAIN.replace("TABLE", rows))
    return dest


def tag_hard_cases(task_dir: Path) -> None:
    """Tag the "hard" cases in their input (B6 strata), and the easy test cases "unseen"
    (a type left out of the search splits), and pin the task again."""
    import json

    from holedger.tasks.pinning import pin_task

    for split in ("dev", "val", "test"):
        path = task_dir / "cases" / f"{split}.json"
        cases = json.loads(path.read_text())
        for case in cases:
            if case["input"]["q"].startswith("hard"):
                case["input"]["tags"] = ["hard"]
            elif split == "test":  # a type no search case has: left out of the search
                case["input"]["tags"] = ["unseen"]
        path.write_text(json.dumps(cases, indent=1))
    pin_task(task_dir)


@dataclass
class AuditedRun:
    settings: Settings
    task_dir: Path
    run_id: str
    seed: str
    nominee: str
    shortcut_dir: Path
    auditor_path: Path

    def context(self, ledger: Ledger, auditor: SigningKey | None = None) -> AuditContext:
        return AuditContext(
            self.settings,
            ledger,
            AuditLog(ledger.app.engine),
            auditor or SigningKey.load(self.auditor_path),
            gateway=None,
        )


def service(settings: Settings, ledger: Ledger) -> RunService:
    """The real server on the tiny task (process backend, no gateway)."""
    return RunService(
        settings,
        ledger,
        ServerConfig(gateway=None, task_loader=load_server_task, default_backend="process"),
    )


@pytest.fixture(scope="session")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditedRun]:
    root = tmp_path_factory.mktemp("audit")
    settings = Settings.resolve(root / "home")
    Ledger.init_home(settings)
    task_dir = write_task_folder(root / "task")
    tag_hard_cases(task_dir)
    ledger = Ledger.from_settings(settings)
    server = service(settings, ledger)
    try:
        opened = server.open_run(str(task_dir), optimizer="lookup-search")
        shortcut = shortcut_tree(task_dir / "seed", root / "shortcut")
        nominee = server.commit_candidate(opened.run_id, shortcut).candidate
        for cand in (opened.seed_commit, nominee):
            server.evaluate(opened.run_id, cand, "dev", attempts=2)
            server.evaluate(opened.run_id, cand, "val", attempts=1)
        server.nominate(opened.run_id, nominee)
    finally:
        server.close()
        ledger.close()
    auditor = SigningKey.generate("auditor-a")
    auditor_path = root / "auditor.key"
    auditor.save(auditor_path)
    yield AuditedRun(
        settings, task_dir, opened.run_id, opened.seed_commit, nominee, shortcut, auditor_path
    )


@pytest.fixture
def ledger(audited: AuditedRun) -> Iterator[Ledger]:
    led = Ledger.from_settings(audited.settings)
    yield led
    led.close()
