"""The checks only a bundle has: its git objects rebuild every candidate (GitCheck), and its
key list, checkpoint notes and witness cosignatures match the log (BundleChecks)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from holedger.bundles.format import CANDIDATE_REF_PREFIX, RunBundle
from holedger.errors import VerificationError
from holedger.ledger.keys import PublicKey
from holedger.ledger.note import verify_checkpoint
from holedger.ledger.records import Record
from holedger.ledger.tlog import TlogPolicy
from holedger.protocol.runs import origin_of
from holedger.replay.report import counted
from holedger.schemas.events import CandidateCommitted, Checkpoint, Model, RunOpened


class GitCheck:
    """Re-checks each CandidateCommitted event against the bundled git objects.

    The bundled objects were re-hashed and written into a private temporary repository
    (:func:`_candidate_repo`): every object's id must be the SHA-1 git gives its bytes,
    and each candidate's commit must exist, point at the recorded tree and parent, and
    have its whole tree present.
    """

    name = "git"

    def __init__(self, bundle: RunBundle, repo: Path | None, unhashed: list[str]) -> None:
        self.bundle = bundle
        self.repo = repo
        self.unhashed = unhashed
        self.events: list[tuple[int, CandidateCommitted]] = []

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, CandidateCommitted):
            self.events.append((rec.seq, payload))

    def finish(self, out: Any) -> None:
        bundle = self.bundle
        if self.repo is None:
            detail = "candidate history not in the bundle: commit ids not re-checked"
            out.declare("git", detail)
            out.warn(
                "git_history",
                False,
                "the bundle holds no candidate history: the candidates' code (the nominated "
                "one's included) and the scan for hard-coded test answers cannot be checked; "
                "ask for a bundle with it",
            )
            out.section("git", {"included": False, "candidates": len(self.events)})
            return
        out.declare("git", "every candidate commit id, tree and parent re-checked")
        checked = self._check(out)
        out.section(
            "git",
            {"included": True, "objects": len(bundle.git_spans), "candidates_checked": checked},
        )

    def _check(self, out: Any) -> int:
        import pygit2

        if self.unhashed:
            oid = self.unhashed[0]
            out.fail(None, None, f"git object {oid[:12]} does not hash to its id", check="git")
            return 0
        repo = pygit2.Repository(str(self.repo))
        checked = 0
        for seq, cand in self.events:
            problem = _candidate_problem(repo, cand)
            if problem:
                out.fail(seq, "CandidateCommitted", problem, check="git")
            else:
                checked += 1
        for ref, oid in self.bundle.refs.items():
            if ref != CANDIDATE_REF_PREFIX + oid:
                out.fail(None, None, f"git ref {ref} points at {oid[:12]}", check="git")
        return checked


def _candidate_problem(repo: Any, cand: CandidateCommitted) -> str | None:
    import pygit2

    try:
        commit = repo[cand.candidate]
    except (KeyError, ValueError):
        return f"commit {cand.candidate[:12]} is not in the bundled history"
    if not isinstance(commit, pygit2.Commit):
        return f"{cand.candidate[:12]} is not a commit"
    if str(commit.tree_id) != cand.tree:
        return f"commit {cand.candidate[:12]} has another tree than the recorded one"
    parents = [str(p) for p in commit.parent_ids]
    if (cand.parent is None and parents) or (cand.parent is not None and parents != [cand.parent]):
        return f"commit {cand.candidate[:12]} parents differ from the recorded parent"
    missing = _missing_in_tree(repo, commit.tree_id)
    if missing:
        return f"commit {cand.candidate[:12]} tree is incomplete ({missing[:12]} missing)"
    return None


def _missing_in_tree(repo: Any, tree_id: Any) -> str | None:
    stack = [tree_id]
    seen: set[str] = set()
    while stack:
        oid = stack.pop()
        key = str(oid)
        if key in seen:
            continue
        seen.add(key)
        if oid not in repo.odb:
            return key
        obj = repo[oid]
        if obj.type_str == "tree":
            for entry in obj:
                if entry.filemode == 0o160000:  # submodule: not part of the history
                    continue
                stack.append(entry.id)
    return None


class BundleChecks:
    """Checks that only a bundle has: its key list, its checkpoint notes, witnesses.

    Runs as the last projection, so it sees the (size, root) of every Checkpoint event
    that passed integrity. Every checkpoint note (bundled, or published elsewhere and
    given to ``verify``) must be signed by the run's server key, name this run's origin
    and equal one of those checkpoints: a log rewritten or truncated after the note was
    published fails here. With a witness policy, a note for the final checkpoint must
    carry cosignatures that meet its quorum.
    """

    name = "bundle"

    def __init__(
        self,
        bundle: RunBundle,
        opened: RunOpened,
        external: Sequence[str],
        policy: TlogPolicy | None,
    ) -> None:
        self.bundle = bundle
        self.opened = opened
        self.external = list(external)
        self.policy = policy
        self.roots: dict[int, str] = {}

    def apply(self, rec: Record, payload: Model) -> None:
        if isinstance(payload, Checkpoint):
            self.roots[payload.size] = payload.root

    def finish(self, out: Any) -> None:
        declared = {role: declared_key(info) for role, info in self.opened.keys.items()}
        out.declare("bundle_keys", "the bundle's key list equals RunOpened's keys")
        if {r: (k.name, k.raw) for r, k in self.bundle.keys.items()} != {
            r: (k.name, k.raw) for r, k in declared.items()
        }:
            out.fail(None, None, "bundle key list differs from RunOpened", check="bundle_keys")
        notes = [("bundled", n) for n in self.bundle.checkpoints]
        notes += [("external", n) for n in self.external]
        server = declared.get("server")
        if notes:
            out.declare("published_checkpoints", "every checkpoint note matches the log")
        final_size = max(self.roots) if self.roots else -1
        witnessed: list[dict[str, Any]] = []
        quorum_met = False
        for source, note in notes:
            entry = self._check_note(out, source, note, server, final_size)
            if entry is not None:
                witnessed.append(entry)
                quorum_met = quorum_met or bool(entry["final"] and entry["quorum"])
        if self.policy is not None:
            out.declare("witnesses", "the final checkpoint meets the witness policy")
            if not quorum_met:
                finals = [e for e in witnessed if e["final"]]
                best = max((len(e["witnesses"]) for e in finals), default=0)
                external = any(e["source"] == "external" for e in finals)
                out.fail(
                    None,
                    None,
                    f"no checkpoint note for the final checkpoint meets the witness quorum "
                    f"({quorum_text(self.policy)}): the best carries "
                    f"{counted(best, 'cosignature')} of the policy's witnesses"
                    + (
                        ""
                        if external
                        else "; a bundle's own notes carry none: give the cosigned note "
                        "with --checkpoint"
                    ),
                    check="witnesses",
                )
        if notes or self.policy is not None:
            out.section("checkpoint_notes", witnessed)
        out.section(
            "bundle",
            {
                "path": self.bundle.path.name,
                "format_version": self.bundle.version,
                "sha256": self.bundle.digest,
                "bytes": self.bundle.size,
                # What the bundle holds, not what its (unsigned) manifest says: a flag
                # flipped to true on a whole bundle does not make its report say redacted.
                "redacted": bool(self.bundle.redacted_digests),
            },
        )

    def _check_note(
        self, out: Any, source: str, note: str, server: PublicKey | None, final_size: int
    ) -> dict[str, Any] | None:
        check = "published_checkpoints"
        if server is None:
            out.fail(None, None, f"{source} checkpoint: no server key declared", check=check)
            return None
        policy = self.policy
        log_keys = policy.logs if policy is not None and policy.logs else [server]
        witnesses = list(policy.witnesses.values()) if policy is not None else []
        try:
            verified = verify_checkpoint(
                note, log_keys, witnesses=witnesses, origin=origin_of(self.bundle.run_id)
            )
        except VerificationError as exc:
            out.fail(None, None, f"{source} checkpoint note: {exc.message}", check=check)
            return None
        cp = verified.checkpoint
        root = self.roots.get(cp.size)
        if root is None:
            out.fail(
                None,
                None,
                f"{source} checkpoint of size {cp.size} is not in the log (truncated or rewritten)",
                check=check,
            )
            return None
        if root != cp.root.hex():
            out.fail(
                None,
                None,
                f"{source} checkpoint of size {cp.size} has another root: the log was rewritten",
                check=check,
            )
            return None
        names = policy.witness_names_for(verified.cosigners) if policy is not None else set()
        return {
            "source": source,
            "size": cp.size,
            "final": cp.size == final_size,
            "witnesses": sorted(verified.witnesses),
            "quorum": policy.satisfied(names) if policy is not None else None,
        }


def quorum_text(policy: TlogPolicy) -> str:
    """The quorum for people: "2 of the 3 witnesses given", or the policy's own name."""
    group = policy.groups.get(policy.quorum)
    if (
        group is not None
        and policy.quorum == "witnesses"
        and set(group.members) == set(policy.witnesses)
    ):  # made from --witness and --quorum
        return (
            f"{group.threshold} of the {counted(len(group.members), 'witness', 'witnesses')} given"
        )
    return f"the policy's quorum {policy.quorum!r}"


def declared_key(info: Any) -> PublicKey:
    return PublicKey.declared(str(info.name), str(info.public_key))
