"""The optimizer's HTTP API (Starlette): one run, one bearer token.

Every route is under ``/v1/runs/{run}`` and needs ``Authorization: Bearer <token>``, the
run's optimizer token (``holedger run open`` prints it; only its SHA-256 is stored, and
the lookup compares hashes in constant time). A token of another run is refused (403) and
recorded as a ``foreign_token`` SafetyViolation in the token's own run.

    GET  /v1/runs/{run}                      run info: task, dev cases and inputs, val ids,
                                             budget used and remaining, candidates
    GET  /v1/runs/{run}/budget               the budget per component: limit, used, remaining
    GET  /v1/runs/{run}/candidates/{c}/tree  a candidate's files (c: "seed" or an id):
                                             path, size, executable, immutable;
                                             ?contents=1 adds each file's text (or base64)
    GET  /v1/runs/{run}/candidates/{c}/files/{path}   one file's bytes
    POST /v1/runs/{run}/candidates           {"files": {path: text | {"base64"}}, "parent"}
                                             (the whole tree), or {"changes": {path: text |
                                             {"base64"} | null}, "parent"} (on top of the
                                             parent), or a tar / tar.gz body
                                             (application/gzip, application/x-tar); ?parent=ID
    POST /v1/runs/{run}/evaluations          {"candidate", "split", "case_ids", "attempts"}
                                             -> the disclosure projection
    GET  /v1/runs/{run}/evaluations          the run's projections: request id and digest
    GET  /v1/runs/{run}/evaluations/{req}    one projection again, as recorded
    GET  /v1/runs/{run}/blobs/{digest}       a blob named in a projection shown to this run
    POST /v1/runs/{run}/nomination           {"candidate"} -> nominated, scored and closed

Every read the server answers (run info, budget, a tree, a file, the projections, a blob)
is recorded as
a signed OptimizerRead event, in batches written off the request path
(:mod:`holedger.server.reads`).

A solve-evolve run has the routes of server/evolve_api.py instead of the search ones
(``/v1/runs/{run}/steps``: score the next batch, commit or leave unchanged each step).

Errors are ``{"error": {"message", "type", "hint"}}`` with 400 (malformed), 401 (no or
bad token), 402 (over budget, recorded), 403 (foreign token), 404 (unknown, an unknown
route too), 405 (a known route, another method), 409 (refused by the protocol, recorded
when it is a request), 413 (body too large).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from holedger.errors import (
    BudgetExceededError,
    HoledgerError,
    NotFoundError,
    PolicyError,
    Unavailable,
    UsageError,
)
from holedger.gateway.tokens import TokenRegistry
from holedger.ledger.sql import run_uuid
from holedger.schemas.events import SafetyViolation
from holedger.server.budget_view import budget_json
from holedger.server.candidates import clean_path, read_file_map, read_tar
from holedger.server.evolve import EvolveRuns
from holedger.server.evolve_api import evolve_routes, is_solve_evolve, search_only
from holedger.server.reads import ReadRecorder, read_item
from holedger.server.service import RunService
from holedger.server.trees import changes_on_parent, file_bytes, tree_view

log = logging.getLogger("holedger.server")
MAX_BODY_BYTES = 16 << 20
MAX_JSON_BYTES = 1 << 20
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
Handler = Callable[[Request, str], Awaitable[Response]]


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.hint = status, kind, message, hint


def error_response(
    status: int, kind: str, message: str, hint: str | None = None, code: str | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": {"message": message, "type": kind}}
    if hint:
        body["error"]["hint"] = hint
    if code:
        body["error"]["code"] = code
    return JSONResponse(body, status_code=status)


def _status_of(exc: HoledgerError) -> tuple[int, str]:
    if isinstance(exc, Unavailable):
        return 503, "unavailable"
    if isinstance(exc, BudgetExceededError):
        return 402, "budget_exceeded"
    if isinstance(exc, PolicyError):
        return 409, "refused"
    if isinstance(exc, NotFoundError):
        return 404, "not_found"
    if isinstance(exc, UsageError):
        return 400, "invalid_request"
    return 500, "server_error"


def create_api_app(
    service: RunService, tokens: TokenRegistry | None = None, reads: ReadRecorder | None = None
) -> Starlette:
    """The optimizer API over ``service``; tokens default to the ledger's registry, and
    the optimizer's reads are recorded by ``reads`` (one made here, stopped with the app,
    when none is given)."""
    registry = tokens or TokenRegistry(service.ledger.app.engine)
    recorder = reads or ReadRecorder(service.ledger)
    runs = EvolveRuns(service)

    def authenticate(request: Request, run_id: str) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthorized", "missing bearer token")
        claims = registry.lookup(token.strip())
        if claims is None or claims.scope != "optimizer":
            raise ApiError(401, "unauthorized", "unknown token")
        if claims.run_closed:
            raise ApiError(
                403, "run_closed", f"run {claims.run_id} is closed: its tokens died with it"
            )
        if claims.state() != "live":
            raise ApiError(401, "unauthorized", f"token is {claims.state()}")
        if claims.run_id != run_id:
            _record_foreign(service, claims.run_id, run_id)
            raise ApiError(403, "forbidden", "token is not valid for this run")

    def route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                run_id = str(run_uuid(request.path_params["run"]))
                authenticate(request, run_id)
                return await handler(request, run_id)
            except ApiError as exc:
                return error_response(exc.status, exc.kind, exc.message, exc.hint)
            except HoledgerError as exc:
                status, kind = _status_of(exc)
                code = getattr(exc, "code", None)  # a step refused by the solve-evolve rules
                response = error_response(
                    status, kind, exc.message, exc.hint, code if isinstance(code, str) else None
                )
                if status == 503:
                    response.headers["retry-after"] = "30"
                return response
            except Exception:  # never a traceback to the optimizer; the server log has it
                log.exception("API request failed: %s %s", request.method, request.url.path)
                return error_response(500, "server_error", "internal error")

        return endpoint

    def answered(run_id: str, kind: str, **fields: object) -> None:
        """Record a read the server has answered, from the state it has now reached."""
        recorder.record(run_id, read_item(service.states.current(run_id), kind, **fields))

    async def info(request: Request, run_id: str) -> Response:
        def read() -> dict[str, Any]:
            if is_solve_evolve(runs, run_id):  # the steps' view: no dev inputs shown
                body = runs.status(run_id)
            else:
                body = service.run_info(run_id)
            answered(run_id, "run")
            return body

        return JSONResponse(await run_in_threadpool(read))

    async def post_candidate(request: Request, run_id: str) -> Response:
        await run_in_threadpool(search_only, runs, run_id, "commit outside its steps")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        parent = request.query_params.get("parent")
        if ctype == "application/json":
            body = await _json_body(request, MAX_BODY_BYTES)
            whole, changes = _tree_or_changes(body)
            parent = body.get("parent", parent)
            if parent is not None and not isinstance(parent, str):
                raise ApiError(400, "invalid_request", "parent must be a string")
            if changes is not None:
                files = await run_in_threadpool(
                    changes_on_parent, service, run_id, parent or "seed", changes
                )
            else:
                files = read_file_map(whole, service.tree_limits)
        elif ctype in ("application/gzip", "application/x-gzip", "application/x-tar"):
            files = read_tar(await _body(request, MAX_BODY_BYTES), service.tree_limits)
        else:
            raise ApiError(415, "invalid_request", f"unsupported content type {ctype!r}")
        if parent is not None and not isinstance(parent, str):
            raise ApiError(400, "invalid_request", "parent must be a string")
        result = await run_in_threadpool(service.commit_candidate, run_id, files, parent)
        return JSONResponse(
            {
                "candidate": result.candidate,
                "index": result.index,
                "tree": result.tree,
                "parent": result.parent,
                "changed_paths": result.changed_paths,
                "created": result.created,
            },
            status_code=201 if result.created else 200,
        )

    async def post_evaluation(request: Request, run_id: str) -> Response:
        await run_in_threadpool(search_only, runs, run_id, "evaluation request")
        body = await _json_body(request, MAX_JSON_BYTES)
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "expected a JSON object")
        candidate = body.get("candidate")
        split = body.get("split")
        case_ids = body.get("case_ids")
        attempts = body.get("attempts", 1)
        if not isinstance(candidate, str) or not isinstance(split, str):
            raise ApiError(400, "invalid_request", "candidate and split are required strings")
        if case_ids is not None and (
            not isinstance(case_ids, list) or not all(isinstance(c, str) for c in case_ids)
        ):
            raise ApiError(400, "invalid_request", "case_ids must be a list of strings")
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            raise ApiError(400, "invalid_request", "attempts must be an integer")
        if split not in ("dev", "val", "test"):
            raise ApiError(400, "invalid_request", f"unknown split {split!r}")
        result = await run_in_threadpool(
            service.evaluate, run_id, candidate, split, case_ids, attempts
        )
        return JSONResponse(result.as_json())

    async def list_projections(request: Request, run_id: str) -> Response:
        def read() -> dict[str, Any]:
            body = service.projections(run_id)
            answered(run_id, "evaluations")
            return body

        return JSONResponse(await run_in_threadpool(read))

    async def get_projection(request: Request, run_id: str) -> Response:
        request_id = str(request.path_params["request"])

        def read() -> dict[str, Any]:
            body = service.projection(run_id, request_id)
            answered(run_id, "projection", request_id=request_id)
            return body

        return JSONResponse(await run_in_threadpool(read))

    async def get_blob(request: Request, run_id: str) -> Response:
        digest = str(request.path_params["digest"])
        if not _DIGEST.match(digest):
            raise ApiError(400, "invalid_request", "a blob is named by its SHA-256 (hex)")

        def read() -> bytes:
            data = service.disclosed_blob(run_id, digest)
            state = service.states.current(run_id)
            role = state.disclosed[digest]
            recorder.record(run_id, read_item(state, "blob", digest=digest, role=role))
            return data

        data = await run_in_threadpool(read)
        return Response(data, media_type="application/octet-stream")

    async def post_nomination(request: Request, run_id: str) -> Response:
        await run_in_threadpool(search_only, runs, run_id, "nomination")
        body = await _json_body(request, MAX_JSON_BYTES)
        if not isinstance(body, dict) or not isinstance(body.get("candidate"), str):
            raise ApiError(400, "invalid_request", 'expected {"candidate": ID}')
        scored = await run_in_threadpool(
            partial(service.nominate, wait=False), run_id, body["candidate"]
        )
        return JSONResponse({"run_id": run_id, "nominated": scored.candidate, "state": "closed"})

    async def budget(request: Request, run_id: str) -> Response:
        def read() -> dict[str, Any]:
            state = service.states.current(run_id)
            recorder.record(run_id, read_item(state, "budget"))
            return {"run_id": run_id, **budget_json(state, state.opened.terms)}

        return JSONResponse(await run_in_threadpool(read))

    async def get_tree(request: Request, run_id: str) -> Response:
        contents = request.query_params.get("contents", "").lower() in ("1", "true", "yes")
        ref = str(request.path_params["candidate"])

        def read() -> dict[str, Any]:
            state = service.states.current(run_id)
            immutable = state.opened.terms.immutable_paths
            view = tree_view(service.repo(run_id), state, ref, immutable, contents=contents)
            item = read_item(state, "tree", candidate=view["candidate"], contents=contents)
            recorder.record(run_id, item)
            return view

        return JSONResponse(await run_in_threadpool(read))

    async def get_file(request: Request, run_id: str) -> Response:
        ref, path = str(request.path_params["candidate"]), str(request.path_params["path"])

        def read() -> bytes:
            state = service.states.current(run_id)
            data = file_bytes(service.repo(run_id), state, ref, path)
            item = read_item(
                state, "file", candidate=state.resolve_candidate(ref), path=clean_path(path)
            )
            recorder.record(run_id, item)
            return data

        data = await run_in_threadpool(read)
        return Response(data, media_type="application/octet-stream")

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    routes = [
        Route("/healthz", health, methods=["GET"]),
        Route("/v1/runs/{run}", route(info), methods=["GET"]),
        Route("/v1/runs/{run}/budget", route(budget), methods=["GET"]),
        Route("/v1/runs/{run}/candidates", route(post_candidate), methods=["POST"]),
        Route("/v1/runs/{run}/candidates/{candidate}/tree", route(get_tree), methods=["GET"]),
        Route(
            "/v1/runs/{run}/candidates/{candidate}/files/{path:path}",
            route(get_file),
            methods=["GET"],
        ),
        Route("/v1/runs/{run}/evaluations", route(post_evaluation), methods=["POST"]),
        Route("/v1/runs/{run}/evaluations", route(list_projections), methods=["GET"]),
        Route("/v1/runs/{run}/evaluations/{request}", route(get_projection), methods=["GET"]),
        Route("/v1/runs/{run}/blobs/{digest}", route(get_blob), methods=["GET"]),
        Route("/v1/runs/{run}/nomination", route(post_nomination), methods=["POST"]),
        *evolve_routes(runs, route, lambda request: _json_body(request, MAX_BODY_BYTES), answered),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if reads is None:  # the app's own recorder: what is queued is written at shutdown
            await run_in_threadpool(recorder.close)

    app = Starlette(routes=routes, exception_handlers=JSON_HTTP_ERRORS, lifespan=lifespan)
    app.state.reads = recorder
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """An unknown route (404) or method (405) gets the documented JSON error body."""
    status = int(getattr(exc, "status_code", 500))
    if status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(405, "method_not_allowed", message, hint="see the API's routes")
    if status == 404:
        message = f"no route {request.method} {request.url.path}"
        hint = "the API's routes are under /v1/runs/RUN"
        return error_response(404, "not_found", message, hint=hint)
    detail = str(getattr(exc, "detail", "") or "error")
    return error_response(status, "invalid_request" if status < 500 else "server_error", detail)


JSON_HTTP_ERRORS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    HTTPException: _http_error
}


def _tree_or_changes(body: Any) -> tuple[Any, Any]:
    """A JSON commit's ``files`` (the whole tree) or ``changes`` (on the parent): one."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", 'expected {"files": ...} or {"changes": ...}')
    files, changes = body.get("files"), body.get("changes")
    if (files is None) == (changes is None):
        raise ApiError(
            400,
            "invalid_request",
            'give either "files" (the whole tree) or "changes" (on top of "parent")',
        )
    if files is not None and not isinstance(files, dict):
        raise ApiError(400, "invalid_request", '"files" must map paths to contents')
    if changes is not None and not isinstance(changes, dict):
        raise ApiError(400, "invalid_request", '"changes" must map paths to contents or null')
    return files, changes


async def _body(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise ApiError(413, "too_large", f"body over the {cap} byte cap")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise ApiError(413, "too_large", f"body over the {cap} byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request, cap: int) -> Any:
    raw = await _body(request, cap)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # too deep a nesting too
        raise ApiError(400, "invalid_request", "body is not JSON") from exc


def _record_foreign(service: RunService, token_run: str, target_run: str) -> None:
    """A live optimizer token used on another run: a safety violation of its own run."""
    violation = SafetyViolation(
        category="foreign_token",
        detail=f"optimizer token used on run {target_run} through the server API",
    )
    try:
        if not service.state(token_run).closed:
            service.ledger.append(token_run, "SafetyViolation", violation, "server")
    except HoledgerError:
        pass  # a closed or missing run: the refusal stands without the record
