"""A target's internal job routes (the gateway and other targets call them).

* ``POST /v1/_jobs`` ``{"id", "kind", "spec", "members": {target: url}}`` — start
  this target's part (idempotent);
* ``GET /v1/_jobs[?kind=]`` and ``GET /v1/_jobs/{id}`` — parts and their progress;
* ``POST /v1/_jobs/{id}/abort`` ``{"state": "Aborted"|"Failed", "reason"}``;
* ``GET /v1/_jobs/{id}/phase/{name}`` — has this part reached a barrier phase;
* ``POST /v1/_jobs/{id}/recv`` — data another target's part sends (streamed).

Every call needs ``X-Sluice-Internal`` (derived from the cluster key).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from etl_runtime.core import auth
from etl_runtime.core.errors import InvalidRequest, Unauthorized
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.jobs.context import FROM_HEADER, META_HEADER
from etl_runtime.jobs.manager import JobManager
from etl_runtime.jobs.state import ABORTED, FAILED
from etl_runtime.storage.peers import INTERNAL_HEADER


def jobs_target_router(manager: JobManager, cluster_key: str | None) -> APIRouter:
    router = APIRouter()

    def require(request: Request, params: tuple[str, ...] = ()) -> None:
        if not auth.internal_ok(request.headers.get(INTERNAL_HEADER), cluster_key):
            raise Unauthorized("internal job route: only the gateway and targets may call it")
        refuse_unknown(request, params)  # and repeated ones: 400 naming them

    @router.post("/v1/_jobs")
    async def start(request: Request) -> dict[str, Any]:
        require(request)
        doc = await read_json(request, "job")
        if not isinstance(doc, dict) or not doc.get("id") or not doc.get("kind"):
            raise InvalidRequest("job must be a JSON object with 'id', 'kind', 'spec', 'members'")
        return (await manager.create(doc)).summary()

    @router.get("/v1/_jobs")
    async def list_parts(request: Request) -> dict[str, Any]:
        require(request, ("kind",))
        kind = request.query_params.get("kind")
        return {
            "target": manager.target.id,
            "jobs": [p.summary() for p in manager.parts.values() if not kind or p.kind == kind],
        }

    @router.get("/v1/_jobs/{job_id}")
    async def get_part(job_id: str, request: Request) -> dict[str, Any]:
        require(request)
        return manager.get(job_id).summary()

    @router.post("/v1/_jobs/{job_id}/abort")
    async def abort(job_id: str, request: Request) -> dict[str, Any]:
        require(request)
        doc = await read_json(request, "abort") if await request.body() else {}
        state = doc.get("state", ABORTED) if isinstance(doc, dict) else ABORTED
        if state not in (ABORTED, FAILED):
            raise InvalidRequest(f"state must be {ABORTED} or {FAILED}, got {state!r}")
        reason = str(doc.get("reason") or "aborted by request") if isinstance(doc, dict) else ""
        return (await manager.end(job_id, state, reason)).summary()

    @router.get("/v1/_jobs/{job_id}/phase/{name}")
    async def phase(job_id: str, name: str, request: Request) -> dict[str, Any]:
        require(request)
        return manager.phase(job_id, name)

    @router.post("/v1/_jobs/{job_id}/recv")
    async def recv(job_id: str, request: Request) -> dict[str, Any]:
        require(request)
        try:
            meta = json.loads(request.headers.get(META_HEADER) or "{}")
        except ValueError:
            raise InvalidRequest(f"{META_HEADER} must be JSON") from None
        sender = request.headers.get(FROM_HEADER, "")
        result = await manager.receive(job_id, sender, meta, request.stream())
        return {"result": result}

    return router
