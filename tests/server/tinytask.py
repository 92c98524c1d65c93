"""A tiny task for server tests: an upper-casing harness that needs no model.

The seed answers ``{"answer": q.upper()}`` except for questions starting with "hard",
where it answers the question unchanged; the verifier scores 1 for the upper-cased
question, else 0. ``rules/policy.txt`` is immutable.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path
from typing import Any

from sample_terms import task_terms

from holedger.server.candidates import seed_commit_id
from holedger.server.taskview import CaseData, ServerTask

SEED_MAIN = """import json, sys
case = json.loads(sys.stdin.read())
q = case["q"]
print("thinking about", q, file=sys.stderr)
print(json.dumps({"answer": q if q.startswith("hard") else q.upper()}))
"""

# The model task's harness: asks the model (through the gateway, with its trial's token),
# then answers as the perfect candidate does. A test may make it wait after the call.
MODEL_MAIN = """import json, os, sys, time, urllib.request
case = json.loads(sys.stdin.read())
body = json.dumps({
    "model": os.environ["HOLEDGER_MODEL"],
    "messages": [{"role": "user", "content": "Say hello to " + case["q"]}],
    "max_completion_tokens": 64,
}).encode()
reply = None
for _ in range(5):
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "content-type": "application/json"})
    try:
        reply = json.load(urllib.request.urlopen(req, timeout=30))
        break
    except Exception as exc:
        print("retry:", exc, file=sys.stderr)
print("model said:", reply["choices"][0]["message"]["content"][:80], file=sys.stderr)
time.sleep(WAIT_S)
print(json.dumps({"answer": case["q"].upper()}))
"""

CASES = {
    "dev": [f"dev-{i}" for i in range(6)],
    "val": [f"val-{i}" for i in range(8)],
    "test": [f"test-{i}" for i in range(2)],
}


def question(case_id: str) -> str:
    split, n = case_id.split("-")
    return f"hard {split} {n}" if int(n) % 3 == 0 else f"easy {split} {n}"


def write_seed(root: Path) -> Path:
    seed = root / "seed"
    (seed / "harness").mkdir(parents=True, exist_ok=True)
    (seed / "harness" / "__init__.py").write_text("")
    (seed / "harness" / "__main__.py").write_text(SEED_MAIN)
    (seed / "rules").mkdir(exist_ok=True)
    (seed / "rules" / "policy.txt").write_text("answers are upper case\n")
    return seed


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_task(
    root: Path,
    *,
    ref: str = "tiny",
    dev_calls: int = 100,
    dev_passes: str = "4",
    val_calls: int = 100,
    val_passes: str = "4",
    k: int = 2,
    models: list[str] | None = None,
    seed: Path | None = None,
) -> ServerTask:
    seed = seed or write_seed(root)
    terms = task_terms(
        f"tiny-{ref}",
        models=models if models is not None else [],
        sizes={s: len(ids) for s, ids in CASES.items()},
        calls=(dev_calls, val_calls),
        case_passes=(dev_passes, val_passes),
        target_tokens=100000,
        split_digests={s: _digest(",".join(ids)) for s, ids in CASES.items()},
        manifest_digest=_digest(repr(CASES)),
        k=k,
        verifier_digest=_digest("upper"),
        seed_commit=seed_commit_id(seed),
        entrypoint=["python3", "-m", "harness"],
        immutable_paths=["rules"],
        case_timeout_s=20,
        environment_digest=_digest("env"),
    )

    def cases(split: str) -> list[CaseData]:
        return [CaseData(c, {"q": question(c)}) for c in CASES[split]]

    def verify(case_id: str, answer: Any) -> Fraction:
        ok = isinstance(answer, dict) and answer.get("answer") == question(case_id).upper()
        return Fraction(1 if ok else 0)

    digest = _digest(terms.model_dump_json())
    return ServerTask(ref, terms, digest, seed, cases, verify)


PERFECT_MAIN = """import json, sys
case = json.loads(sys.stdin.read())
print(json.dumps({"answer": case["q"].upper()}))
"""


TASK_TOML = """# tiny: an upper-casing task for tests (no model)
id = "tiny-folder"
title = "tiny"
models = ["holedger-sim-1"]
entrypoint = ["python3", "-m", "harness"]
immutable_paths = ["rules/"]
case_timeout_s = 20
k = 2
resolution_band = "0.05"

[environment]
runtime = "python3"
python = "3.11"
packages = []
network = "gateway-only"
env = {}

[verifier]
path = "verifier.py"
function = "score"
digest = Z64

[splits]
cases_dir = "cases"
manifest = "manifest.json"
sizes = { dev = 0, val = 0, test = 0 }
split_digests = { dev = Z64, val = Z64, test = Z64 }
manifest_digest = Z64

[seed]
path = "seed"
tree_digest = Z64
commit = Z40

[budget]
target_tokens = 0

[budget.dev]
calls = 100
case_passes = "4"

[budget.val]
calls = 100
case_passes = "4"

[disclosure]
min_aggregate_cases = 5
""".replace("Z64", '"' + "0" * 64 + '"').replace("Z40", '"' + "0" * 40 + '"')

VERIFIER = """from fractions import Fraction


def score(case_input, expected, answer):
    ok = isinstance(answer, dict) and answer.get("answer") == expected["answer"]
    return Fraction(1 if ok else 0)
"""


def write_task_folder(root: Path) -> Path:
    """The tiny task as a holedger.tasks folder (task.toml, cases, verifier, seed), pinned."""
    import json

    from holedger.tasks.pinning import pin_task

    root.mkdir(parents=True, exist_ok=True)
    write_seed(root)
    (root / "task.toml").write_text(TASK_TOML)
    (root / "verifier.py").write_text(VERIFIER)
    (root / "cases").mkdir(exist_ok=True)
    for split, ids in CASES.items():
        cases = [
            {"id": c, "input": {"q": question(c)}, "expected": {"answer": question(c).upper()}}
            for c in ids
        ]
        (root / "cases" / f"{split}.json").write_text(json.dumps(cases, indent=1))
    pin_task(root)
    return root


def model_task(root: Path, *, wait_s: float = 0) -> ServerTask:
    """The tiny task with a model: its seed harness is MODEL_MAIN, waiting ``wait_s``
    seconds after its model call."""
    seed = write_seed(root)
    main = MODEL_MAIN.replace("WAIT_S", repr(float(wait_s)))
    (seed / "harness" / "__main__.py").write_text(main)
    return make_task(root, ref="model", models=["holedger-sim-1"], seed=seed)
