"""Gateway routes that start and watch dSort jobs.

* ``POST /v1/dsort`` — body: the dSort spec (``docs/dsort.md``) → ``{"id": ...}``;
  the job is a ``dsort`` job of ``/v1/jobs`` (``GET /v1/jobs/{id}``, abort, CLI).
* AIStore's own routes, for the official ``aistore`` SDK's ``client.dsort()``:
  ``POST /v1/sort`` (the id as text), ``GET /v1/sort?uuid=ID`` (a ``JobInfo``
  per target, as ``Dsort.wait`` and ``get_job_info`` read it) and
  ``DELETE /v1/sort/abort?uuid=ID``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from etl_runtime.core.access import IN_BODY
from etl_runtime.core.errors import InvalidRequest, NotFound
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import (
    _headers,
    aggregate,
    end_everywhere,
    job_buckets,
    start_job,
)
from etl_runtime.jobs.state import ABORTED, FAILED, FINISHED


async def _job(gw: Gateway, job_id: str) -> dict[str, Any]:
    headers = _headers(gw)

    async def one(url: str) -> dict[str, Any] | None:
        try:
            r = await gw.http.get(f"{url}/v1/_jobs/{quote(job_id)}", headers=headers, timeout=5)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    targets = gw.known_targets()
    answers = await asyncio.gather(*(one(t.url) for t in targets))
    parts = {t.id: a for t, a in zip(targets, answers, strict=True) if a is not None}
    if not parts or parts[next(iter(parts))].get("kind") != "dsort":
        raise NotFound(f"dsort job {job_id!r} does not exist", job=job_id)
    return aggregate(parts, {})


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat() if ts else None


def _phase(start: float, end: float | None, done: bool) -> dict[str, Any]:
    return {
        "started_time": _iso(start) or "",
        "end_time": (_iso(end) or "") if done else "",
        "elapsed": int(((end or start) - start) * 1e9) if done else 0,
        "running": not done,
        "finished": done,
    }


def aistore_job_info(view: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/sort`` answer: one AIStore ``JobInfo`` per target."""
    spec = view["spec"]
    bck = {"name": spec["input_bck"]["name"], "provider": "ais"}
    out_bck = {"name": spec["output_bck"]["name"], "provider": "ais"}
    failed = view["state"] in (FAILED, ABORTED)
    errors = [view["reason"]] if view["state"] == FAILED and view["reason"] else []
    started, ended = view["started"], view["ended"]
    infos = {}
    for tid, part in view["targets"].items():
        phases = part.get("phases") or []
        progress = part.get("progress") or {}
        done = part.get("state") == FINISHED
        metrics = {
            "local_extraction": {
                **_phase(started, ended, "inventory" in phases),
                "total_count": "0",
                "extracted_count": "0",
                "extracted_size": "0",
                "extracted_record_count": "0",
                "extracted_to_disk_count": "0",
                "extracted_to_disk_size": "0",
            },
            "meta_sorting": _phase(started, ended, "sent" in phases),
            "shard_creation": {
                **_phase(started, ended, done),
                "to_create": str((part.get("output") or {}).get("shards", 0)),
                "created_count": str(progress.get("objects", 0)),
                "moved_shard_count": "0",
            },
            "aborted": failed,
            "archived": False,
            "description": spec.get("description", ""),
            "errors": errors,
        }
        infos[tid] = {
            "id": view["id"],
            "src-bck": bck,
            "dst-bck": out_bck,
            "started_time": _iso(started),
            "finish_time": _iso(ended) if done else None,
            "loc-objs": str(progress.get("objects", 0)),
            "loc-bytes": str(progress.get("bytes", 0)),
            "Metrics": metrics,
            "aborted": failed,
            "archived": False,
        }
    return infos


def dsort_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    async def start(request: Request) -> str:
        gw.require_write(request, IN_BODY)  # the buckets: start_job
        refuse_unknown(request, ())
        spec = await read_json(request, "dsort spec")
        return await start_job(gw, "dsort", spec, request)

    @router.post("/v1/dsort")
    async def post_dsort(request: Request) -> dict[str, Any]:
        return {"id": await start(request)}

    @router.post("/v1/sort")
    async def post_sort(request: Request) -> PlainTextResponse:
        return PlainTextResponse(await start(request))

    def uuid_of(request: Request) -> str:
        refuse_unknown(request, ("uuid",))
        job_id = request.query_params.get("uuid")
        if not job_id:
            raise InvalidRequest("uuid: the dsort job id is required (?uuid=...)")
        return job_id

    @router.get("/v1/sort")
    async def get_sort(request: Request) -> dict[str, Any]:
        gw.require_read(request, IN_BODY)  # and the job's buckets, once found
        view = await _job(gw, uuid_of(request))
        gw.require_read(request, *sum(job_buckets(view.get("spec") or {}), []))
        return aistore_job_info(view)

    @router.delete("/v1/sort/abort")
    async def abort_sort(request: Request) -> dict[str, Any]:
        gw.require_write(request)
        job_id = uuid_of(request)
        view = await _job(gw, job_id)
        if view["state"] not in (FINISHED, FAILED, ABORTED):
            urls = [t.url for t in gw.known_targets()]
            await end_everywhere(gw, job_id, urls, ABORTED, "aborted by request")
            view = await _job(gw, job_id)
        return {"id": job_id, "state": view["state"], "reason": view["reason"]}

    return router
