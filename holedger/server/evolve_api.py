"""The optimizer API's routes of a solve-evolve run (mounted by server/api.py).

    GET  /v1/runs/{run}/steps                  where the run stands: step, phase ("solve":
                                               the next batch may be scored; "evolve": the
                                               step awaits its commit or "unchanged"),
                                               H_{t-1}, scope, the cases already scored
    POST /v1/runs/{run}/steps                  score the next batch under H_{t-1} and get
                                               its evidence D_t (recorded first)
    POST /v1/runs/{run}/steps/{t}/commit       {"changes": {path: text | {"base64"} | null},
                                               "parent"} or {"files": ..., "parent"}: step
                                               t's one commit (parent: H_{t-1}, the default)
    POST /v1/runs/{run}/steps/{t}/unchanged    close step t without a change

A step refused by the rules answers 409 with ``{"error": {"code": "evolve.*", ...}}``
and records nothing. In a solve-evolve run the search routes (candidates, evaluations,
nomination) answer 409 ``evolve.not_solve_evolve``: the evolver changes the harness only
through its steps, and sees no case before its batch is scored, so ``GET /v1/runs/{run}``
answers with the steps' view instead of the dev inputs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from holedger.errors import UsageError
from holedger.protocol.refusals import EVOLVE_NOT_SOLVE_EVOLVE, Refusal
from holedger.server.candidates import read_file_map
from holedger.server.evolve import EvolveRuns, StepRefused

Handler = Callable[[Request, str], Awaitable[Response]]
Wrap = Callable[[Handler], Callable[[Request], Awaitable[Response]]]
BodyReader = Callable[[Request], Awaitable[Any]]


def is_solve_evolve(runs: EvolveRuns, run_id: str) -> bool:
    return runs.service.states.current(run_id).opened.solve_evolve is not None


def search_only(runs: EvolveRuns, run_id: str, what: str) -> None:
    """Refuse a search route on a solve-evolve run (nothing recorded)."""
    if is_solve_evolve(runs, run_id):
        raise StepRefused(
            Refusal(EVOLVE_NOT_SOLVE_EVOLVE, f"a solve-evolve run takes no {what}"),
            hint="score batches with POST .../steps; change the harness with "
            "POST .../steps/T/commit",
        )


def evolve_routes(
    runs: EvolveRuns, route: Wrap, json_body: BodyReader, answered: Callable[[str, str], None]
) -> list[Route]:
    """The steps' routes; ``answered(run, kind)`` records a read the server answered."""

    async def status(request: Request, run_id: str) -> Response:
        def read() -> dict[str, Any]:
            body = runs.status(run_id)
            answered(run_id, "run")
            return body

        return JSONResponse(await run_in_threadpool(read))

    async def solve(request: Request, run_id: str) -> Response:
        evidence = await run_in_threadpool(runs.solve, run_id)
        return JSONResponse(evidence.as_json())

    def step_of(request: Request) -> int:
        text = str(request.path_params["step"])
        if not text.isdigit() or len(text) > 9:
            raise StepRefused(
                Refusal("evolve.out_of_turn", f"no step {text!r}"), hint="steps count from 1"
            )
        return int(text)

    async def commit(request: Request, run_id: str) -> Response:
        step = step_of(request)
        body = await json_body(request)
        if not isinstance(body, dict) or (body.get("files") is None) == (
            body.get("changes") is None
        ):
            raise UsageError('give either "files" (the whole tree) or "changes" (on the parent)')
        parent = body.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise UsageError("parent must be a string")
        if body.get("changes") is not None:
            if not isinstance(body["changes"], dict):
                raise UsageError('"changes" must map paths to contents or null')
            closed = await run_in_threadpool(
                runs.commit_changes, run_id, step, body["changes"], parent
            )
        else:
            files = read_file_map(body["files"], runs.service.tree_limits)
            closed = await run_in_threadpool(runs.commit, run_id, step, files, parent)
        return JSONResponse(closed.as_json(), status_code=201)

    async def unchanged(request: Request, run_id: str) -> Response:
        closed = await run_in_threadpool(runs.unchanged, run_id, step_of(request))
        return JSONResponse(closed.as_json())

    return [
        Route("/v1/runs/{run}/steps", route(status), methods=["GET"]),
        Route("/v1/runs/{run}/steps", route(solve), methods=["POST"]),
        Route("/v1/runs/{run}/steps/{step}/commit", route(commit), methods=["POST"]),
        Route("/v1/runs/{run}/steps/{step}/unchanged", route(unchanged), methods=["POST"]),
    ]
