"""The example optimizer: greedy search over prepared candidate edits, through the HTTP API.

This program runs inside its own sandbox, where holedger itself is not installed: it uses
only the Python standard library and talks to the trusted server's optimizer API (and
nothing else; it never sees the ledger, the keys or the held-out split). Its plan:

1. read the run (dev case ids and inputs, val case ids, budget) and the seed harness's
   files (``GET .../candidates/seed/tree?contents=1``);
2. evaluate the seed harness on a fixed dev subset;
3. for each prepared edit in order: apply it on top of the best tree so far, commit the
   files it changes as a candidate on top of that tree (``{"changes", "parent"}``),
   evaluate it on the same dev subset, and keep it when its dev mean is not below the best
   so far (the edits are meant to stack);
4. read the remaining budget (``GET .../budget``), then evaluate the final tree and the
   best earlier kept candidate on val, where only the aggregate mean is disclosed;
5. nominate the candidate with the best val mean (the server then scores it on the
   held-out test split, which this program never sees).

Every response it receives is written as one JSON line on stdout (its log of what it
saw); progress for people goes to stderr. Configuration comes from the environment:
HOLEDGER_API_URL (the optimizer API's base URL) and HOLEDGER_API_TOKEN (the run-scoped
optimizer token), and from the command line (the folder of prepared edits, its own plan).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Api:
    """A small JSON-over-HTTP client for the optimizer API; logs every response."""

    def __init__(self, base_url: str, token: str, log: Any) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.token = token
        self.log = log

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 900,
        logged: Any = None,
    ) -> Any:
        """The parsed answer; the log gets it whole, or ``logged(answer)`` when given (a
        tree's file contents are logged as paths and sizes only)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"authorization": f"Bearer {self.token}", "accept": "application/json"}
        if data is not None:
            headers["content-type"] = "application/json"
        for attempt in range(5):
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                conn.request(method, self.prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
            except (ConnectionError, http.client.HTTPException, TimeoutError) as exc:
                # A POST that may have reached the server is not repeated: it could spend
                # budget twice. Only a refused connection (nothing sent) is retried.
                retry = method == "GET" or isinstance(exc, ConnectionRefusedError)
                if attempt == 4 or not retry:
                    raise
                say(f"connection problem ({exc}); retrying")
                time.sleep(0.2 * (attempt + 1))
                continue
            finally:
                conn.close()
            try:
                parsed: Any = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            shown = logged(parsed) if logged is not None and status < 400 else parsed
            self.log.write(
                json.dumps(
                    {"method": method, "path": path, "status": status, "body": shown},
                    sort_keys=True,
                )
                + "\n"
            )
            self.log.flush()
            if status >= 400:
                raise ApiError(status, parsed)
            return parsed
        raise RuntimeError("unreachable")


def say(text: str) -> None:
    print(f"optimizer: {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- edits


@dataclass
class Edit:
    name: str
    description: str
    lever: str
    replacements: list[tuple[str, str, str]]
    files: dict[str, str]

    def apply(self, tree: dict[str, str]) -> dict[str, str] | None:
        """The tree with this edit applied, or None when it does not apply cleanly."""
        out = dict(tree)
        for path, old, new in self.replacements:
            text = out.get(path)
            if text is None or text.count(old) != 1:
                return None
            out[path] = text.replace(old, new)
        out.update(self.files)
        return out


def load_edits(folder: Path, shortcuts: bool = False) -> list[Edit]:
    """``NN-name/edit.toml`` files: description, lever, [[replace]] {path, old, new}.
    An edit marked ``overfitting = true`` (a shortcut kept for audits to find) is left
    out unless ``shortcuts``."""
    edits = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        spec_file = sub / "edit.toml"
        if not spec_file.is_file():
            continue
        spec = tomllib.loads(spec_file.read_text(encoding="utf-8"))
        if spec.get("overfitting") is True and not shortcuts:
            continue
        repl = [(b["path"], b["old"], b["new"]) for b in spec.get("replace", [])]
        files = {}
        files_dir = sub / "files"
        if files_dir.is_dir():
            for source in sorted(files_dir.rglob("*")):
                if source.is_file():
                    files[source.relative_to(files_dir).as_posix()] = source.read_text("utf-8")
        edits.append(
            Edit(
                sub.name, str(spec.get("description", "")), str(spec.get("lever", "?")), repl, files
            )
        )
    return edits


def text_files(listing: dict[str, Any]) -> dict[str, str]:
    """The text files of a tree as ``GET .../candidates/C/tree?contents=1`` lists them
    (files that are not UTF-8 come as base64; no edit touches them, and a commit of
    changes keeps them as they are)."""
    return {f["path"]: f["text"] for f in listing["files"] if "text" in f}


def without_contents(listing: Any) -> Any:
    """A tree listing as the log keeps it: each file's path, size and flags, no content."""
    if not isinstance(listing, dict) or not isinstance(listing.get("files"), list):
        return listing
    keep = ("path", "size", "executable", "immutable")
    files = [{k: f.get(k) for k in keep} for f in listing["files"] if isinstance(f, dict)]
    return {**listing, "files": files}


def changes_between(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """What turns ``before`` into ``after``: changed or new files, and None for removed."""
    changes: dict[str, str | None] = {p: t for p, t in after.items() if before.get(p) != t}
    changes.update({p: None for p in before if p not in after})
    return changes


# --------------------------------------------------------------------------- search


@dataclass
class Candidate:
    commit: str
    label: str
    tree: dict[str, str]
    dev: Fraction | None = None
    val: Fraction | None = None
    history: list[str] = field(default_factory=list)


def frac(value: Any) -> Fraction:
    return Fraction(str(value))


def dev_mean(projection: dict[str, Any]) -> Fraction:
    """The mean over cases of the per-case dev means a projection discloses."""
    body = projection.get("projection", projection)
    cases = body.get("cases")
    if not isinstance(cases, dict) or not cases:
        raise ValueError(f"no per-case results in projection {body}")
    means = [frac(item["mean"]) for item in cases.values()]
    return sum(means, Fraction(0)) / len(means)


def val_mean(projection: dict[str, Any]) -> Fraction:
    body = projection.get("projection", projection)
    return frac(body["mean"])


def dev_key(cand: Candidate) -> Fraction:
    return cand.dev if cand.dev is not None else Fraction(-1)


class Optimizer:
    def __init__(
        self,
        api: Api,
        edits: list[Edit],
        *,
        dev_cases: int = 6,
        val_cases: int = 12,
        finalists: int = 2,
        strategy: str = "greedy",
    ) -> None:
        self.api = api
        self.edits = edits
        self.dev_cases = dev_cases
        self.val_cases = val_cases
        self.finalists = finalists
        self.strategy = strategy

    def run_info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.api.call("GET", "")
        return info

    def seed_tree(self) -> dict[str, str]:
        listing = self.api.call("GET", "/candidates/seed/tree?contents=1", logged=without_contents)
        immutable = [f["path"] for f in listing["files"] if f["immutable"]]
        say(f"seed: {len(listing['files'])} files, {len(immutable)} under immutable paths")
        return text_files(listing)

    def commit(self, tree: dict[str, str], parent: Candidate, label: str) -> Candidate:
        """Commit ``tree`` as the changes it makes to ``parent``'s tree."""
        body = {"changes": changes_between(parent.tree, tree), "parent": parent.commit}
        reply = self.api.call("POST", "/candidates", body)
        return Candidate(str(reply["candidate"]), label, tree)

    def remaining(self, split: str) -> dict[str, Any]:
        budget: dict[str, Any] = self.api.call("GET", "/budget")
        left: dict[str, Any] = budget["remaining"][split]
        tokens = budget["remaining"].get("target_tokens")
        say(
            f"{split} budget left: {left['calls']} calls, {left['case_passes']} case-passes; "
            f"target tokens left: {tokens}"
        )
        return left

    def evaluate(self, cand: Candidate, split: str, cases: list[str]) -> dict[str, Any]:
        body = {"candidate": cand.commit, "split": split, "case_ids": cases, "attempts": 1}
        reply: dict[str, Any] = self.api.call("POST", "/evaluations", body)
        return reply

    def search(self) -> Candidate:
        info = self.run_info()
        dev_ids = [str(c) for c in info["dev"]["case_ids"]]
        val_ids = [str(c) for c in info["val"]["case_ids"]]
        left = info["budget_remaining"]
        evaluations = 1 + len(self.edits)
        # The same dev subset for every candidate, as large as the budget allows.
        room = frac(left["dev"]["case_passes"]) * len(dev_ids) / evaluations
        per_eval = min(self.dev_cases, len(dev_ids), int(room))
        if per_eval < 1 or int(left["dev"]["calls"]) < evaluations:
            raise SystemExit("optimizer: the dev budget is too small for this plan")
        subset = dev_ids[:per_eval]
        say(f"dev subset: {len(subset)} of {len(dev_ids)} cases; {len(self.edits)} edits to try")

        seed = Candidate(str(info["seed"]), "seed", self.seed_tree())
        seed.dev = dev_mean(self.evaluate(seed, "dev", subset))
        say(f"seed: dev mean {float(seed.dev):.3f}")
        best = seed
        kept: list[Candidate] = [seed]
        for edit in self.edits:
            # greedy: each edit on top of the best so far (they stack); singles: each edit
            # alone on the seed, the best single one kept.
            base = best if self.strategy == "greedy" else seed
            tree = edit.apply(base.tree)
            if tree is None:
                say(f"{edit.name}: does not apply to the current best; skipped")
                continue
            label = f"{base.label}+{edit.name.split('-', 1)[0]}"
            cand = self.commit(tree, base, label)
            cand.history = [*base.history, edit.name]
            cand.dev = dev_mean(self.evaluate(cand, "dev", subset))
            assert best.dev is not None
            keep = cand.dev >= best.dev
            say(
                f"{edit.name} ({edit.lever}): dev mean {float(cand.dev):.3f} "
                f"vs best {float(best.dev):.3f}: {'kept' if keep else 'dropped'}"
            )
            if keep:
                best = cand
                kept.append(cand)

        # Val (aggregate mean only): the final tree and the best earlier kept ones.
        left = self.remaining("val")
        val_room = frac(left["case_passes"]) * len(val_ids)
        per_val = min(self.val_cases, len(val_ids), int(val_room))
        n_val = min(self.finalists, int(left["calls"]), int(val_room // max(per_val, 1)))
        earlier = sorted((c for c in kept if c is not best), key=dev_key, reverse=True)
        finalists = [best, *earlier][: max(n_val, 1)]
        val_subset = val_ids[:per_val]
        for cand in finalists:
            cand.val = val_mean(self.evaluate(cand, "val", val_subset))
            say(f"{cand.label}: val mean {float(cand.val):.3f} on {len(val_subset)} cases")
        winner = max(finalists, key=lambda c: (c.val or Fraction(0), dev_key(c)))
        say(f"nominating {winner.label} ({winner.commit[:12]}): {', '.join(winner.history)}")
        say("the server now scores it on the held-out test split, which this program never sees")
        self.api.call("POST", "/nomination", {"candidate": winner.commit})
        return winner


# --------------------------------------------------------------------------- solve-evolve


def failing_cases(evidence: dict[str, Any]) -> list[str]:
    """The cases of a step's evidence whose mean score is below 1."""
    cases = evidence["projection"].get("cases", {})
    return sorted(c for c, item in cases.items() if frac(item["mean"]) < 1)


class Evolver:
    """The solve-evolve mode: after each scored batch, one prepared edit or nothing.

    For each step the server scores the next batch under the current harness and shows
    its evidence (``POST .../steps``); when a case failed, the evolver commits the next
    prepared edit that applies to the current harness, changes only files inside the
    editable scope and was not tried yet (``POST .../steps/T/commit``), else it closes
    the step unchanged (``POST .../steps/T/unchanged``). The last step's answer holds J.
    """

    def __init__(self, api: Api, edits: list[Edit]) -> None:
        self.api = api
        self.edits = list(edits)

    def next_edit(
        self, tree: dict[str, str], scope: list[str]
    ) -> tuple[Edit, dict[str, str], dict[str, str | None]] | None:
        """The next prepared edit that applies to ``tree`` inside ``scope`` (others are
        dropped, saying why), or None when none is left."""
        while self.edits:
            edit = self.edits.pop(0)
            after = edit.apply(tree)
            changes = changes_between(tree, after) if after is not None else {}
            if after is None or not changes:
                say(f"{edit.name} does not apply to the current harness; dropped")
            elif not all(any(p.startswith(f) for f in scope) for p in changes):
                say(f"{edit.name} changes files outside the editable scope; dropped")
            else:
                return edit, after, changes
        return None

    def run(self) -> dict[str, Any]:
        status: dict[str, Any] = self.api.call("GET", "/steps")
        scope = [str(f) for f in status["scope"]]
        say(f"solve-evolve: {status['steps']} steps of {status['batch']} cases; scope {scope}")
        listing = self.api.call("GET", "/candidates/seed/tree?contents=1", logged=without_contents)
        tree, head = text_files(listing), str(status["head"])
        closed: dict[str, Any] = {}
        for step in range(int(status["step"]) + 1, int(status["steps"]) + 1):
            evidence = self.api.call("POST", "/steps")
            failed = failing_cases(evidence)
            say(f"step {step}: {len(failed)} of {len(evidence['case_ids'])} cases failed")
            chosen = self.next_edit(tree, scope) if failed else None
            if chosen is None:
                closed = self.api.call("POST", f"/steps/{step}/unchanged")
                continue
            edit, after, changes = chosen
            body = {"changes": changes, "parent": head}
            closed = self.api.call("POST", f"/steps/{step}/commit", body)
            tree, head = after, str(closed["candidate"])
            say(f"step {step}: committed {edit.name} ({edit.lever}) as {head[:12]}")
        return closed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent
    parser.add_argument("--edits", type=Path, default=here / "edits")
    parser.add_argument("--api", default=os.environ.get("HOLEDGER_API_URL", ""))
    parser.add_argument("--dev-cases", type=int, default=6, help="dev cases per evaluation")
    parser.add_argument("--val-cases", type=int, default=12, help="val cases per evaluation")
    parser.add_argument("--finalists", type=int, default=2, help="candidates evaluated on val")
    parser.add_argument(
        "--shortcuts", action="store_true", help="also try edits marked overfitting = true"
    )
    parser.add_argument(
        "--strategy",
        choices=("greedy", "singles"),
        default="greedy",
        help="greedy: stack each edit on the best so far; singles: each edit alone on the seed",
    )
    parser.add_argument(
        "--order",
        choices=("given", "reverse"),
        default="given",
        help="the order in which the levers' edits are tried",
    )
    parser.add_argument(
        "--max-edits", type=int, default=None, help="try at most this many edits (a budget)"
    )
    parser.add_argument(
        "--protocol",
        choices=("search", "solve-evolve"),
        default="search",
        help="search (dev/val, nominate) or solve-evolve (one edit or none per step)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("HOLEDGER_API_TOKEN", "")
    if not args.api or not token:
        say("set HOLEDGER_API_URL and HOLEDGER_API_TOKEN")
        return 2
    api = Api(args.api, token, sys.stdout)
    edits = load_edits(args.edits, args.shortcuts)
    if args.order == "reverse":
        edits.reverse()
    if args.max_edits is not None:
        edits = edits[: max(0, args.max_edits)]
    if args.protocol == "solve-evolve":
        try:
            last = Evolver(api, edits).run()
        except ApiError as exc:
            say(f"the server refused: {exc}")
            return 1
        say(f"done: in-situ score {last.get('in_situ')}")
        return 0
    optimizer = Optimizer(
        api,
        edits,
        dev_cases=args.dev_cases,
        val_cases=args.val_cases,
        finalists=args.finalists,
        strategy=args.strategy,
    )
    try:
        winner = optimizer.search()
    except ApiError as exc:
        say(f"the server refused: {exc}")
        return 1
    say(f"done: nominated {winner.commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
