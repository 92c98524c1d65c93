"""An optimizer written from the API's documentation alone: the standard library only.

Run as ``python http_only_optimizer.py`` with HOLEDGER_API_URL (``http://HOST:PORT/v1/
runs/RUN``) and HOLEDGER_API_TOKEN. It reads the seed's tree and files, commits changes
on top of a parent, reads its budget, evaluates, nominates, and prints one JSON object of
what it saw. It exits non-zero on anything unexpected.
"""

import json
import os
import sys
import urllib.error
import urllib.request

BASE = os.environ["HOLEDGER_API_URL"].rstrip("/")
TOKEN = os.environ["HOLEDGER_API_TOKEN"]
PERFECT = (
    "import json, sys\n"
    "case = json.loads(sys.stdin.read())\n"
    'print(json.dumps({"answer": case["q"].upper()}))\n'
)


def call(method, path, body=None, raw=False):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("authorization", "Bearer " + TOKEN)
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            content = response.read()
            return response.status, content if raw else json.loads(content)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


seen = {}
status, info = call("GET", "")
assert status == 200, info
seed = info["seed"]

status, tree = call("GET", "/candidates/seed/tree")
assert status == 200 and tree["candidate"] == seed, tree
seen["listing"] = {f["path"]: [f["size"], f["immutable"], f["executable"]] for f in tree["files"]}
status, full = call("GET", "/candidates/seed/tree?contents=1")
texts = {f["path"]: f["text"] for f in full["files"]}
status, main = call("GET", "/candidates/" + seed[:8] + "/files/harness/__main__.py", raw=True)
assert status == 200 and main.decode() == texts["harness/__main__.py"]
seen["seed_main_matches"] = True
status, missing = call("GET", "/candidates/seed/files/harness/nothing.py")
seen["missing_file"] = [status, missing["error"]["type"]]

status, budget = call("GET", "/budget")
assert status == 200, budget
seen["budget_before"] = budget["remaining"]
seen["components"] = [row["component"] for row in budget["components"]]

# Changes on top of the seed: only the harness's entry module.
status, made = call(
    "POST", "/candidates", {"changes": {"harness/__main__.py": PERFECT}, "parent": "seed"}
)
assert status == 201, made
first = made["candidate"]
seen["first"] = {"parent": made["parent"], "changed_paths": made["changed_paths"]}

# On top of that candidate: a new file, and a file removed.
status, made = call(
    "POST",
    "/candidates",
    {
        "changes": {"notes.txt": "tried upper-casing\n", "harness/__init__.py": None},
        "parent": first,
    },
)
assert status == 201, made
second = made["candidate"]
seen["second"] = {"parent": made["parent"], "changed_paths": made["changed_paths"]}
status, tree2 = call("GET", "/candidates/" + second + "/tree?contents=1")
seen["second_files"] = sorted(f["path"] for f in tree2["files"])

# The immutable rule, twice: a change under it, and a whole tree that leaves it out.
status, refused = call(
    "POST", "/candidates", {"changes": {"rules/policy.txt": "anything goes\n"}, "parent": first}
)
seen["immutable_change"] = [status, refused["error"]["message"], refused["error"].get("hint")]
whole = {p: t for p, t in texts.items() if not p.startswith("rules/")}
status, refused = call("POST", "/candidates", {"files": whole})
seen["immutable_left_out"] = [status, refused["error"]["message"], refused["error"].get("hint")]

status, ev = call(
    "POST", "/evaluations", {"candidate": first, "split": "dev", "case_ids": ["dev-0"]}
)
assert status == 200, ev
seen["dev_score"] = ev["projection"]["cases"]["dev-0"]["mean"]
status, budget = call("GET", "/budget")
seen["budget_after"] = budget["remaining"]
status, info = call("GET", "")
seen["info_budget"] = info["budget_remaining"]

status, unknown = call("GET", "/no-such-route")
seen["unknown_route"] = [status, unknown]

status, nominated = call("POST", "/nomination", {"candidate": first})
assert status == 200, nominated
seen["nominated"] = nominated["nominated"] == first
seen["holedger_imported"] = any(name.split(".")[0] == "holedger" for name in sys.modules)
print(json.dumps(seen))
