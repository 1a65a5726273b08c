"""The ``/v1/etl`` API: init, list, details, stop/start, delete, logs.

``PUT /v1/etl`` also takes AIStore's init message (the official SDK's
``init_class``), translated by ``aisetl`` and answered as AIStore does: once
the ETL runs, with its job id as text.

Writes go to the injected ``EtlBackend`` (local controller or ETL custom
resources); the gateway adds what only the data plane knows — transform counts
and recent errors, gathered from every target's internal
``/v1/_etl/{name}/stats`` (each target asks its own transformer), and logs from
``/v1/_etl/{name}/logs``.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import PlainTextResponse

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core import auth
from etl_runtime.core import spec as etl_spec
from etl_runtime.core.errors import (
    EtlNotFound,
    InvalidRequest,
    InvalidSpec,
    NotFound,
    Unauthorized,
)
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.etl.cacheindex import FIELDS as CACHE_FIELDS
from etl_runtime.etl.forward import STAT_FIELDS
from etl_runtime.gateway import aiscompat, aisetl, aisjobs
from etl_runtime.gateway.context import Gateway

LAST_ERRORS = 20
# ``GET /v1/etl/{name}?wait=S``: answer once the ETL leaves Initializing (at most S seconds,
# at most MAX_WAIT): the SDK's init_code waits without polling a fan-out of stats.
MAX_WAIT = 30.0
WAIT_POLL = 0.02  # the backend's record is in memory (local) or a watch cache (Kubernetes)


def _not_found(name: str) -> EtlNotFound:
    return EtlNotFound(f"ETL {name!r} does not exist; list ETLs with GET /v1/etl", etl=name)


def public_spec(spec: etl_spec.EtlSpec) -> dict[str, Any]:
    """The spec without code bodies (they can be large and are nobody's business)."""
    d = spec.to_dict()
    if "code" not in d:  # an ETL image (commType): no code
        return d
    code = dict(d.get("code") or {})
    for body in ("pickled", "source", "aisClass"):
        if body in code:
            code[body] = f"<{len(code[body])} characters>"
    d["code"] = code
    return d


def summary(record: EtlRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "phase": record.phase,
        "mode": record.spec.mode,
        "ready": record.ready_count,
        "total": len(record.transformers),
    }


def _time_key(entry: dict[str, Any]) -> float:
    t = entry.get("time")
    if isinstance(t, int | float):
        return float(t)
    if isinstance(t, str):
        try:
            return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
    return 0.0


async def stats_by_target(gw: Gateway, name: str, timeout: float = 10.0) -> dict[str, dict]:
    """Each answering target's ``/v1/_etl/{name}/stats`` body, by target id."""
    out: dict[str, dict] = {}
    if not gw.discovery.targets():
        return out
    for t, r in await gw.fanout("GET", f"/v1/_etl/{name}/stats", timeout=timeout):
        if isinstance(r, httpx.Response) and r.status_code == 200:
            out[t.id] = r.json()
        # else: stats are best effort, a missing target just counts nothing
    return out


def combine_stats(
    per_target: dict[str, dict],
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The counts summed over targets, and the last errors of all, oldest first."""
    stats = {f: 0 for f in (*STAT_FIELDS, *CACHE_FIELDS)}  # cache_*: 0 unless cache: true
    errors: list[dict[str, Any]] = []
    for target, body in per_target.items():
        for f in stats:
            stats[f] += int(body.get(f) or 0)
        for e in body.get("last_errors") or []:
            errors.append(
                {
                    "time": e.get("time"),
                    "target": target,
                    "object": e.get("object"),
                    "sample": e.get("sample"),
                    "error": e.get("error"),
                }
            )
    errors.sort(key=_time_key)
    return stats, errors[-LAST_ERRORS:]


async def gather_stats(gw: Gateway, name: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    return combine_stats(await stats_by_target(gw, name))


async def details(gw: Gateway, record: EtlRecord) -> dict[str, Any]:
    stats, last_errors = await gather_stats(gw, record.name)
    return {
        **summary(record),
        "uid": record.uid,
        "message": record.message,
        "spec": public_spec(record.spec),
        "transformers": [t.to_dict() for t in record.transformers],
        "stats": stats,
        "last_errors": last_errors,
    }


def _seconds(raw: str, name: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WAIT:  # also refuses nan
        raise InvalidRequest(
            f"wait={raw!r}: give the seconds to wait while ETL {name!r} starts, 0 to {MAX_WAIT:g}",
            etl=name,
        )
    return seconds


def refuse_unknown_etl_params(request: Request) -> None:
    """The ETL routes take no query parameters but ``tail`` on logs and ``uuid`` on
    details (the aistore SDK's ``view()`` sends it, empty or the ETL's uid)."""
    name = request.path_params.get("name")
    if request.url.path.endswith("/logs") or "target_id" in request.path_params:
        known: tuple[str, ...] = ("tail",)
    elif name and request.method == "GET":
        known = ("uuid", "wait")
    else:
        known = ()
    refuse_unknown(request, known, etl=name)


def etl_router(gw: Gateway) -> APIRouter:
    def credentials_then_params(request: Request) -> None:
        """The credentials first (``core/access.py``: a 401/403 before any 400), then
        the parameters; each route checks its own need again."""
        if request.method == "GET":
            gw.require_read(request)
        else:
            gw.require_write(request)
        refuse_unknown_etl_params(request)

    router = APIRouter(dependencies=[Depends(credentials_then_params)])
    backend = gw.backend

    async def existing(name: str) -> EtlRecord:
        record = await backend.get(name)
        if record is None:
            raise _not_found(name)
        return record

    @router.put("/v1/etl", response_model=None)
    async def init(request: Request) -> dict[str, Any] | PlainTextResponse:
        gw.require_write(request)
        try:
            body = await read_json(request, 'the body {"name": ..., "spec": {...}}')
        except InvalidRequest as e:
            raise InvalidSpec(e.message) from None
        if not isinstance(body, dict):
            raise InvalidSpec('body must be a JSON object: {"name": ..., "spec": {...}}')
        if aisetl.is_ais_message(body):  # the official aistore SDK's init / init_class
            ais_name, ais_spec = aisetl.to_spec(body, getattr(backend, "platform", "local"))
            await backend.init(ais_name, ais_spec)
            record = await aisetl.wait_running(backend, ais_name, aisetl.init_wait(ais_spec))
            return PlainTextResponse(record.uid)  # AIStore answers the job id as text
        name = body.get("name")
        try:
            etl_spec.validate_name(name)  # type: ignore[arg-type]
            spec = etl_spec.EtlSpec.from_dict(body.get("spec"))  # type: ignore[arg-type]
        except etl_spec.InvalidSpec as e:
            raise InvalidSpec(str(e), etl=name if isinstance(name, str) else None) from None
        except (TypeError, ValueError, KeyError) as e:
            raise InvalidSpec(f"invalid ETL spec: {e}", etl=name) from None
        record = await backend.init(name, spec)  # type: ignore[arg-type]
        return await details(gw, record)

    @router.get("/v1/etl", response_model=None)
    async def list_etls(request: Request) -> dict[str, Any] | list[dict[str, Any]]:
        gw.require_read(request)
        records = await backend.list()
        if aiscompat.from_ais_sdk(request):  # the official aistore SDK: [ETLInfo]
            return [aiscompat.etl_info(r, (await gather_stats(gw, r.name))[0]) for r in records]
        return {"etls": [summary(r) for r in records]}

    @router.get("/v1/etl/{name}")
    async def get_etl(name: str, request: Request) -> dict[str, Any]:
        gw.require_read(request)
        record = await existing(name)
        if (wait := request.query_params.get("wait")) is not None:
            record = await _wait_while_starting(name, record, _seconds(wait, name))
        uuid = request.query_params.get("uuid")
        if uuid and uuid != record.uid:
            errors = await aisjobs.etl_job_errors(gw, name, uuid)  # an offline transform's id
            if errors is None:
                raise EtlNotFound(f"ETL {name!r} has uid {record.uid!r}, not {uuid!r}", etl=name)
            return aiscompat.etl_details(record, errors)  # its obj_errors: that job's
        if aiscompat.from_ais_sdk(request):  # ETLDetails
            return aiscompat.etl_details(record, (await gather_stats(gw, name))[1])
        return await details(gw, record)

    async def _wait_while_starting(name: str, record: EtlRecord, seconds: float) -> EtlRecord:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while record.phase == "Initializing" and loop.time() < deadline:
            await asyncio.sleep(WAIT_POLL)
            record = await existing(name)
        return record

    async def set_stopped(name: str, request: Request, stopped: bool) -> dict[str, Any]:
        gw.require_write(request)
        try:
            record = await backend.set_stopped(name, stopped)
        except KeyError:
            raise _not_found(name) from None
        if not stopped and aiscompat.from_ais_sdk(request):  # AIStore's start waits
            wait = min(aisetl.START_WAIT, record.spec.init_timeout_seconds)
            record = await aisetl.wait_running(backend, name, wait)
        return await details(gw, record)

    @router.post("/v1/etl/{name}/stop")
    async def stop(name: str, request: Request) -> dict[str, Any]:
        return await set_stopped(name, request, True)

    @router.post("/v1/etl/{name}/start")
    async def start(name: str, request: Request) -> dict[str, Any]:
        return await set_stopped(name, request, False)

    @router.delete("/v1/etl/{name}")
    async def delete(name: str, request: Request) -> dict[str, Any]:
        gw.require_write(request)
        try:
            await backend.delete(name)
        except KeyError:
            raise _not_found(name) from None
        return {"name": name, "deleted": True}

    @router.get("/v1/etl/{name}/logs/{target_id}")
    async def target_logs(
        name: str, target_id: str, request: Request, tail: int = Query(200, ge=1, le=100_000)
    ) -> Any:
        """One target's logs (the aistore SDK's ``logs(target_id)``); 404 naming it."""
        every = await logs(name, request, tail)
        entries = (
            every
            if isinstance(every, list)
            else [{"target_id": t, "logs": v} for t, v in every["logs"].items()]
        )
        mine = [e for e in entries if e["target_id"] == target_id]
        if not mine:
            raise NotFound(
                f"ETL {name!r} runs on no target {target_id!r}", etl=name, target=target_id
            )
        return mine if isinstance(every, list) else {"logs": {target_id: mine[0]["logs"]}}

    @router.get("/v1/etl/{name}/logs")
    async def logs(name: str, request: Request, tail: int = Query(200, ge=1, le=100_000)) -> Any:
        # Logs can carry user data (error messages): a token is needed once one is set.
        held = request.headers.get("authorization")
        if not auth.read_ok(held, gw.read_token or gw.token, gw.token):
            raise Unauthorized("ETL logs can hold user data: send 'Authorization: Bearer <token>'")
        await existing(name)
        out: dict[str, str] = {}
        if gw.discovery.targets():
            answers = await gw.fanout("GET", f"/v1/_etl/{name}/logs", params={"tail": tail})
            for t, r in answers:
                if isinstance(r, httpx.Response) and r.status_code == 200:
                    out[t.id] = r.text
                elif isinstance(r, httpx.Response):
                    try:
                        why = r.json().get("error", r.text)
                    except ValueError:
                        why = r.text
                    out[t.id] = f"<logs unavailable: {why}>"
                else:
                    out[t.id] = f"<logs unavailable: target did not answer: {r!r}>"
        if aiscompat.from_ais_sdk(request):  # [ETLNodeLogs], each base64 as AIStore's
            return aiscompat.etl_node_logs(out)
        return {"logs": out}

    return router
