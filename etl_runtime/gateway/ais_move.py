"""``bucket.rename(to)``: ``POST /v1/buckets/{old}?bck_to=ais/@#/new/`` ``{"action": "move-bck"}``.

A ``move-bck`` job (``jobs/move.py``) copies the objects under the new name;
once it has finished the old bucket is dropped here, by a task that follows
the job and, for the SDK's ``Job.wait()``, before ``aisjobs`` reports the job
ended (``settle``), whichever comes first. The old bucket is dropped only if
it is still the one that was renamed (its creation time is in the spec), so a
bucket made later under the old name is never touched. The answer is the job
id, as text for the SDK. A value, or any parameter but ``provider`` and
``bck_to``, is a 400 naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest, SluiceError
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import job_views, start_job
from etl_runtime.jobs.state import FINISHED, TERMINAL

ACTION = "move-bck"
FOLLOW_SECONDS = 0.5
_following: set[asyncio.Task[None]] = set()


def _to_bucket(raw: str) -> str:
    parts = raw.strip().strip("/").split("/")
    if raw.startswith("ais://"):
        return raw[len("ais://") :].strip("/")
    if len(parts) == 3 and parts[0] == "ais" and parts[1] in ("@#", "@"):
        return parts[2]
    raise InvalidRequest(f"bck_to={raw!r}: name an 'ais' bucket, e.g. ais/@#/new/")


async def start_move(gw: Gateway, bucket: str, request: Request, value: Any) -> Response:
    refuse_unknown(request, ("provider", "bck_to"), bucket=bucket)
    if value not in (None, {}, ""):
        raise InvalidRequest(f"{ACTION} of bucket {bucket!r} takes no value", bucket=bucket)
    raw = request.query_params.get("bck_to")
    if not raw:
        raise InvalidRequest(f"{ACTION} needs the new name: ?bck_to=ais/@#/new/", bucket=bucket)
    job_id = await start_job(gw, ACTION, {"src": bucket, "dst": _to_bucket(raw)}, request)
    task = asyncio.create_task(_follow(gw, job_id), name=f"follow-{job_id}")
    _following.add(task)
    task.add_done_callback(_following.discard)
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return JSONResponse({"id": job_id, "kind": ACTION})


async def _follow(gw: Gateway, job_id: str) -> None:
    views = job_views(gw)
    while True:
        await asyncio.sleep(FOLLOW_SECONDS)
        try:
            view = await views.view(job_id)
        except SluiceError:
            return
        if view["state"] in TERMINAL:
            await settle(gw, view)
            return


async def settle(gw: Gateway, view: dict[str, Any]) -> dict[str, Any]:
    """A finished ``move-bck`` job's old bucket, dropped (once) before the job is reported."""
    spec = view.get("spec") or {}
    if view.get("kind") != ACTION or view.get("state") != FINISHED or gw.cmap is None:
        return view
    src, created = spec.get("src"), spec.get("src_created")
    props = gw.cmap.get().buckets.get(src) if isinstance(src, str) else None
    if props is None or props.created != created:
        return view  # dropped already, or a new bucket of that name
    gw.cmap.update(lambda m: m.without_bucket(str(src)))  # no await since the check: once
    # Live targets drop the objects now; one that is away, when it sees the map.
    await gw.fanout("DELETE", f"/v1/buckets/{src}")
    return view
