"""Loading a task folder, checking every pinned digest, and scoring answers.

``load_task(name_or_path)`` finds a bundled task by name or a folder holding
``task.toml``, checks the verifier source, the cases against the manifest, the manifest
against the spec and the seed tree against its digest, and returns a :class:`LoadedTask`.
Nothing is trusted that has not been re-hashed.

The cases, the manifest and the verifier are for the trusted process only: a sandbox
receives a case's ``input`` on stdin and the seed (or candidate) tree, never these files
(``LoadedTask.private_paths`` lists them for sandbox backends that mask paths).
"""

from __future__ import annotations

import json
import sys
import tomllib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from holedger.errors import NotFoundError, UsageError, VerificationError
from holedger.schemas.events import BudgetVector, DisclosurePolicy, TaskTerms
from holedger.schemas.task import SPLITS, ManifestCase, SplitManifest, TaskSpec
from holedger.schemas.types import Split
from holedger.tasks import digests

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
TASK_FILE = "task.toml"


@dataclass(frozen=True)
class Case:
    """One case: ``input`` goes to the harness; ``expected`` only to the verifier."""

    id: str
    input: dict[str, Any]
    expected: Any

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "input": self.input, "expected": self.expected}


@dataclass(frozen=True)
class Check:
    """One recomputed digest: what was checked, whether it matched, and the detail."""

    name: str
    ok: bool
    detail: str


def bundled_tasks() -> list[str]:
    """Names of the tasks shipped with holedger."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / TASK_FILE).is_file())


def find_task(name_or_path: str | Path) -> Path:
    """The folder of a bundled task name, or a folder path holding task.toml."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if (path / TASK_FILE).is_file():
        return path.resolve()
    if path.is_file() and path.name == TASK_FILE:
        return path.parent.resolve()
    if "/" not in text and (BUNDLED_DIR / text / TASK_FILE).is_file():
        return BUNDLED_DIR / text
    names = ", ".join(bundled_tasks()) or "none"
    raise NotFoundError(
        f"no task {text!r}: not a bundled task and not a folder with {TASK_FILE}",
        hint=f"bundled tasks: {names}",
    )


def read_spec(root: Path) -> TaskSpec:
    """Parse ``task.toml`` of the folder ``root``."""
    path = root / TASK_FILE
    try:
        data = tomllib.loads(read_task_file(path, "spec").decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(
            f"{path} is not readable TOML: {exc}", hint="fix the file, or restore it"
        ) from exc
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(
            f"{path}: {where}: {first['msg']}",
            hint="see docs/FORMAT.md, 'Task and manifest digests'",
        ) from exc


def _inside(root: Path, rel: str, what: str) -> Path:
    path = (root / rel).resolve()
    if root.resolve() not in path.parents and path != root.resolve():
        raise UsageError(f"{what} path {rel!r} leaves the task folder")
    return path


def read_task_file(path: Path, what: str) -> bytes:
    """The bytes of one file of a task folder; a missing or unreadable one is one error
    naming the file (exit 2)."""
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise NotFoundError(
            f"the task's {what} {path} is missing",
            hint="restore it from the task's source, or point task.toml at the right file",
        ) from exc
    except OSError as exc:
        raise UsageError(
            f"cannot read the task's {what} {path}: {exc.strerror or exc}",
            hint="check that the file exists, is a regular file and is readable",
        ) from exc


def read_cases(root: Path, spec: TaskSpec, split: Split) -> list[Case]:
    """The cases of one split as stored (not yet checked against the manifest)."""
    path = _inside(root, f"{spec.splits.cases_dir}/{split}.json", "cases")
    hint = "fix the file (a JSON array of {id, input, expected}), or restore it"
    try:
        raw = json.loads(read_task_file(path, f"{split} cases file").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})", hint=hint) from exc
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            hint=hint,
        ) from exc
    except ValueError as exc:  # e.g. a number too long to parse
        raise UsageError(f"{path}: not valid JSON ({exc})", hint=hint) from exc
    if not isinstance(raw, list):
        raise UsageError(
            f"{path}: the {split} cases must be a JSON array, not {type(raw).__name__}",
            hint=hint,
        )
    cases = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise UsageError(f"{path}: case #{index} has no string id", hint=hint)
        if not isinstance(item.get("input"), dict) or set(item) != {"id", "input", "expected"}:
            raise UsageError(
                f"{path}: case {item['id']!r} must have exactly id, input (an object) and expected",
                hint=hint,
            )
        cases.append(Case(item["id"], item["input"], item["expected"]))
    return cases


def build_manifest(task_id: str, cases: dict[Split, list[Case]]) -> SplitManifest:
    """The split manifest of these cases (digests as in docs/FORMAT.md)."""
    splits: dict[Split, list[ManifestCase]] = {}
    split_digests: dict[Split, str] = {}
    for split in SPLITS:
        entries = sorted(
            (ManifestCase(id=c.id, digest=digests.case_digest(c.record())) for c in cases[split]),
            key=lambda e: e.id,
        )
        splits[split] = entries
        split_digests[split] = digests.split_digest((e.id, e.digest) for e in entries)
    return SplitManifest(
        task_id=task_id,
        splits=splits,
        split_digests=split_digests,
        manifest_digest=digests.manifest_digest(split_digests),
    )


def check_manifest(manifest: SplitManifest) -> list[Check]:
    """Recompute a manifest's split and manifest digests; check ids unique and disjoint."""
    checks: list[Check] = []
    seen: dict[str, str] = {}
    for split in SPLITS:
        ids = manifest.ids(split)
        for case_id in ids:
            if case_id in seen:
                where = (
                    "twice in " + split
                    if seen[case_id] == split
                    else (f"in both {seen[case_id]} and {split}")
                )
                checks.append(Check(f"case {case_id}", False, f"case {case_id} is {where}"))
            seen[case_id] = split
        recomputed = digests.split_digest((c.id, c.digest) for c in manifest.splits[split])
        ok = recomputed == manifest.split_digests[split]
        detail = f"{len(ids)} cases, digest {recomputed[:16]}"
        if not ok:
            detail = (
                f"split digest of {split} is {recomputed[:16]}, "
                f"manifest says {manifest.split_digests[split][:16]}"
            )
        checks.append(Check(f"split digest {split}", ok, detail))
    recomputed = digests.manifest_digest(manifest.split_digests)
    ok = recomputed == manifest.manifest_digest
    checks.append(
        Check(
            "manifest digest",
            ok,
            recomputed[:16]
            if ok
            else f"manifest digest is {recomputed[:16]}, file says {manifest.manifest_digest[:16]}",
        )
    )
    return checks


def read_manifest(path: Path) -> SplitManifest:
    data = read_task_file(path, "split manifest")
    try:
        return SplitManifest.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise UsageError(
            f"split manifest {path} is malformed: {where}: {first['msg']}",
            hint="restore it, or make it again (holedger.tasks.pinning)",
        ) from exc


def check_task(root: Path, spec: TaskSpec | None = None) -> list[Check]:
    """Recompute every digest of the task folder ``root`` and compare with the pins."""
    spec = spec or read_spec(root)
    checks: list[Check] = []

    source = read_task_file(_inside(root, spec.verifier.path, "verifier"), "verifier")
    got = digests.sha256_hex(source)
    checks.append(
        Check(
            "verifier source",
            got == spec.verifier.digest,
            f"{spec.verifier.path} hashes to {got[:16]}"
            + (
                ""
                if got == spec.verifier.digest
                else f", task.toml pins {spec.verifier.digest[:16]}"
            ),
        )
    )

    manifest = read_manifest(_inside(root, spec.splits.manifest, "manifest"))
    checks.extend(check_manifest(manifest))
    if manifest.task_id != spec.id:
        checks.append(Check("manifest task", False, f"manifest is for task {manifest.task_id}"))
    for split in SPLITS:
        listed = {c.id: c.digest for c in manifest.splits[split]}
        stored = read_cases(root, spec, split)
        problems = []
        ids = [c.id for c in stored]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            problems.append(f"case {dup} appears twice in {split} cases")
        for case in stored:
            if case.id not in listed:
                problems.append(f"case {case.id} is in {split} cases but not in the manifest")
            elif digests.case_digest(case.record()) != listed[case.id]:
                problems.append(f"case {case.id} ({split}) does not match its manifest digest")
        for missing in sorted(set(listed) - set(ids)):
            problems.append(f"case {missing} of the {split} manifest is missing from the cases")
        checks.append(
            Check(
                f"cases {split}",
                not problems,
                problems[0] if problems else f"{len(stored)} case digests match",
            )
        )
        pinned = spec.splits.split_digests[split]
        ok = manifest.split_digests[split] == pinned and spec.splits.sizes[split] == len(listed)
        checks.append(
            Check(
                f"pinned split {split}",
                ok,
                f"{len(listed)} cases"
                if ok
                else f"{split} in the manifest ({len(listed)} cases, "
                f"{manifest.split_digests[split][:16]}) differs from task.toml "
                f"({spec.splits.sizes[split]} cases, {pinned[:16]})",
            )
        )
    ok = manifest.manifest_digest == spec.splits.manifest_digest
    checks.append(
        Check(
            "pinned manifest digest",
            ok,
            spec.splits.manifest_digest[:16]
            if ok
            else f"manifest digest {manifest.manifest_digest[:16]} differs from task.toml "
            f"{spec.splits.manifest_digest[:16]}",
        )
    )

    seed_dir = _inside(root, spec.seed.path, "seed")
    if not seed_dir.is_dir():
        raise NotFoundError(
            f"the task's seed folder {seed_dir} is missing or not a directory",
            hint="restore it from the task's source, or point [seed] path at it",
        )
    try:
        got = digests.tree_digest(seed_dir)
    except OSError as exc:
        raise UsageError(
            f"cannot read the task's seed file {exc.filename or seed_dir}: {exc.strerror or exc}",
            hint="check that every file of the seed is readable",
        ) from exc
    ok = got == spec.seed.tree_digest
    checks.append(
        Check(
            "seed tree",
            ok,
            f"{spec.seed.path}/ hashes to {got[:16]}"
            + ("" if ok else f", task.toml pins {spec.seed.tree_digest[:16]}"),
        )
    )
    commit = seed_commit(seed_dir)
    ok = commit == spec.seed.commit
    checks.append(
        Check(
            "seed commit",
            ok,
            commit[:16]
            if ok
            else f"seed commits to {commit[:16]}, task.toml pins {spec.seed.commit[:16]}",
        )
    )
    return checks


def seed_commit(seed_dir: Path) -> str:
    """The seed's git commit id, as every run commits it (:mod:`.harness_tree`)."""
    from holedger.tasks.harness_tree import seed_commit_id

    return seed_commit_id(seed_dir)


def _first_failure(checks: list[Check]) -> Check | None:
    return next((c for c in checks if not c.ok), None)


def _load_verifier(root: Path, spec: TaskSpec) -> Callable[..., Any]:
    path = _inside(root, spec.verifier.path, "verifier")
    source = read_task_file(path, "verifier")
    got = digests.sha256_hex(source)
    if got != spec.verifier.digest:
        raise VerificationError(
            f"verifier {spec.verifier.path} of task {spec.id} hashes to {got[:16]}, "
            f"not the pinned {spec.verifier.digest[:16]}",
            hint="the verifier changed; restore it or re-pin the task",
        )
    # Execute exactly the bytes that were hashed, not whatever the file holds later.
    name = f"holedger_verifier_{spec.id.replace('-', '_').replace('.', '_')}_{got[:12]}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        sys.modules.pop(name, None)
    function = getattr(module, spec.verifier.function, None)
    if not callable(function):
        raise VerificationError(f"verifier {spec.verifier.path} has no {spec.verifier.function}")
    result: Callable[..., Any] = function
    return result


def parse_answer(answer: Any) -> Any:
    """A harness answer as JSON: bytes or text are parsed (numbers exactly), else kept."""
    if isinstance(answer, bytes | bytearray):
        try:
            answer = bytes(answer).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(answer, str):
        lines = answer.strip().splitlines()
        if not lines:
            return None
        try:
            return json.loads(lines[-1], parse_float=Decimal)
        except ValueError:
            return None
    return answer


@dataclass
class LoadedTask:
    """A task whose every digest has been checked, ready for the trusted process."""

    spec: TaskSpec
    root: Path
    checks: list[Check] = field(default_factory=list)
    _cases: dict[str, list[Case]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def seed_dir(self) -> Path:
        return _inside(self.root, self.spec.seed.path, "seed")

    @property
    def entrypoint(self) -> list[str]:
        return list(self.spec.entrypoint)

    @property
    def immutable_paths(self) -> list[str]:
        return list(self.spec.immutable_paths)

    @property
    def budget(self) -> BudgetVector:
        return self.spec.budget

    @property
    def disclosure(self) -> DisclosurePolicy:
        return self.spec.disclosure

    @property
    def min_aggregate_cases(self) -> int:
        return self.spec.disclosure.min_aggregate_cases

    @property
    def case_timeout_s(self) -> int:
        return self.spec.case_timeout_s

    @property
    def k(self) -> int:
        return self.spec.k

    @property
    def resolution_band(self) -> Fraction:
        return self.spec.resolution_band

    @property
    def models(self) -> list[str]:
        return list(self.spec.models)

    @property
    def digest(self) -> str:
        return digests.task_digest(self.spec)

    @property
    def private_paths(self) -> list[Path]:
        """Files only the trusted process may read (cases, manifest, verifier)."""
        return [
            self.root / self.spec.splits.cases_dir,
            self.root / self.spec.splits.manifest,
            self.root / self.spec.verifier.path,
        ]

    def terms(self) -> TaskTerms:
        return self.spec.terms()

    def cases(self, name: str) -> list[Case]:
        """The cases of split ``name`` (dev, val or test), in manifest order (sorted by id)."""
        split = next((s for s in SPLITS if s == name), None)
        if split is None:
            raise UsageError(f"unknown split {name!r}", hint="dev, val or test")
        if split not in self._cases:
            stored = {c.id: c for c in read_cases(self.root, self.spec, split)}
            self._cases[split] = [stored[i] for i in sorted(stored)]
        return list(self._cases[split])

    def case(self, case_id: str) -> Case:
        for split in SPLITS:
            for case in self.cases(split):
                if case.id == case_id:
                    return case
        raise NotFoundError(f"task {self.id} has no case {case_id}")

    @cached_property
    def _verifier(self) -> Callable[..., Any]:
        return _load_verifier(self.root, self.spec)

    def verify(self, case: Case, answer_json: Any) -> Fraction:
        """Score a harness answer (parsed JSON, or its stdout text) for ``case`` in [0, 1]."""
        answer = parse_answer(answer_json)
        try:
            raw = self._verifier(case.input, case.expected, answer)
        except Exception:  # a verifier that fails on an answer scores it 0
            return Fraction(0)
        if isinstance(raw, bool) or not isinstance(raw, Fraction | int):
            raise VerificationError(
                f"verifier of task {self.id} returned {type(raw).__name__}, not a Fraction"
            )
        score = Fraction(raw)
        if not 0 <= score <= 1:
            raise VerificationError(f"verifier of task {self.id} returned {score}, not in [0, 1]")
        return score


def load_task(name_or_path: str | Path) -> LoadedTask:
    """Find, check and load a task; any digest mismatch raises VerificationError naming it."""
    root = find_task(name_or_path)
    spec = read_spec(root)
    checks = check_task(root, spec)
    failure = _first_failure(checks)
    if failure is not None:
        raise VerificationError(
            f"task {spec.id}: {failure.name}: {failure.detail}",
            hint=f"run 'holedger tasks verify {spec.id}' for every check",
        )
    return LoadedTask(spec, root, checks)


def verify_task(name_or_path: str | Path) -> tuple[TaskSpec, list[Check]]:
    """Every check of a task, without raising on a mismatch (for ``holedger tasks verify``)."""
    root = find_task(name_or_path)
    spec = read_spec(root)
    return spec, check_task(root, spec)


def task_digest(spec: TaskSpec | LoadedTask) -> str:
    """SHA-256 of the canonical JSON of the whole task spec."""
    if isinstance(spec, LoadedTask):
        spec = spec.spec
    return digests.task_digest(spec)
