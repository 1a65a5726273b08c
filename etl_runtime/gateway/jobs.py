"""The gateway's job API: start a job on every member target, aggregate, abort.

Jobs live on the targets (each persists its part), so any gateway answers:

* ``POST /v1/jobs`` ``{"kind", "spec"}`` — start a job of a registered kind
  (the kind's ``validate`` checks the spec here first); ``{"id": ...}``;
* ``GET /v1/jobs[?kind=&state=]`` — every job, aggregated;
* ``GET /v1/jobs/{id}`` — one job: state, per-target progress, errors, output;
* ``POST /v1/jobs/{id}/abort``.

``start_job(gw, kind, spec)`` is what other gateway routes call
(``POST /v1/buckets/{src}`` ``etl-bck``, ``POST /v1/dsort``).

A member target that does not answer for ``SLUICE_JOB_TARGET_TIMEOUT`` seconds
(default 60) while the job runs fails the job, naming it: a job never hangs on
a target that is gone (``job_monitor.py``, the gateway's background task;
reading a job never ends it). A target that comes back within the timeout
resumes its part.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core import auth
from etl_runtime.core.access import IN_BODY
from etl_runtime.core.errors import InsufficientStorage, InvalidRequest, JobNotFound, NoTargets
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.context import Gateway
from etl_runtime.jobs.kinds import get_kind, load_kinds
from etl_runtime.jobs.manager import target_timeout_from_env
from etl_runtime.jobs.state import ABORTED, FAILED, FINISHED, MAX_ERRORS, RUNNING, STATES
from etl_runtime.storage.peers import INTERNAL_HEADER

PROGRESS_FIELDS = ("objects", "bytes", "records", "skipped")
UNREACHABLE = "Unreachable"  # a member's state in a view when it has no part to show
NO_PART = "no part of this job"


def _headers(gw: Gateway) -> dict[str, str]:
    h = dict(gw.target_headers())
    if gw.cluster_key:
        h[INTERNAL_HEADER] = auth.internal_token(gw.cluster_key)
    return h


def _members(gw: Gateway) -> list[TargetInfo]:
    """Every member target, each reachable now (a job needs all of them)."""
    if gw.cmap is None:
        return gw.live_targets()
    cmap = gw.cmap.get()
    if not cmap.members:
        raise NoTargets("the cluster has no member targets; check `GET /v1/cluster`")
    alive = gw.alive_ids()
    out = []
    for tid in cmap.members:
        info = gw.target_info(tid, cmap)
        if tid not in alive or info is None:
            raise NoTargets(
                f"target {tid!r} is not reachable right now: a job runs on every target; "
                "retry when it is back",
                retry_after=2,
                target=tid,
            )
        out.append(info)
    return out


def job_buckets(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The buckets a job spec reads and writes, as every kind names them (raw or checked)."""

    def names(keys: tuple[str, ...]) -> list[str]:
        got = [spec.get(k) for k in keys]
        got = [g.get("name") if isinstance(g, dict) else g for g in got]
        return [g for g in got if isinstance(g, str) and g]

    return names(("src", "bck", "input_bck")), names(("dst", "bucket", "output_bck"))


def check_job(gw: Gateway, request: Request, spec: dict[str, Any]) -> None:
    """``core/access.py``'s check for a job: read its sources, write its destinations;
    a job that names no bucket (a scrub of every bucket) is cluster-wide."""
    reads, writes = job_buckets(spec)
    if reads:
        gw.require_read(request, *reads)
    if writes or not reads:
        gw.require_write(request, *writes)


async def start_job(
    gw: Gateway, kind: str, spec: dict[str, Any], request: Request | None = None
) -> str:
    """Validate ``spec`` for ``kind``, start the job on every member; its id. With
    ``request``, its caller must be allowed the job's buckets (before and after the
    kind's check, which may create the destination)."""
    k = get_kind(kind)
    if request is not None:
        check_job(gw, request, spec)
    if k.validate is not None:
        spec = await k.validate(gw, spec)
    if request is not None:
        check_job(gw, request, spec)
    members = _members(gw)
    job_id = f"{kind}-{secrets.token_hex(4)}"
    doc = {
        "id": job_id,
        "kind": kind,
        "spec": spec,
        "members": {t.id: t.url for t in members},
    }
    headers = _headers(gw)

    full: list[InsufficientStorage] = []

    async def one(t: TargetInfo) -> str | None:
        try:
            r = await gw.http.post(f"{t.url}/v1/_jobs", json=doc, headers=headers)
        except httpx.HTTPError as e:
            return f"target {t.id!r} not reachable ({e!r})"
        if r.status_code == InsufficientStorage.status:  # retrying cannot help: say so
            message = _error_text(r)
            full.append(InsufficientStorage(message, target=t.id, job=job_id))
            return f"target {t.id!r}: {message}"
        return None if r.status_code == 200 else f"target {t.id!r}: {r.status_code} {r.text}"

    problems = [p for p in await asyncio.gather(*(one(t) for t in members)) if p]
    if problems:
        reason = f"the job could not start on every target: {problems[0]}"
        await end_everywhere(gw, job_id, [t.url for t in members], FAILED, reason)
        if full:
            raise full[0]
        raise NoTargets(reason, retry_after=2, job=job_id)
    return job_id


def _error_text(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"])
    except (ValueError, KeyError, TypeError):
        return r.text[:500]


async def end_everywhere(
    gw: Gateway, job_id: str, urls: list[str], state: str, reason: str
) -> None:
    headers = _headers(gw)

    async def one(url: str) -> None:
        try:
            await gw.http.post(
                f"{url}/v1/_jobs/{quote(job_id)}/abort",
                json={"state": state, "reason": reason},
                headers=headers,
            )
        except httpx.HTTPError:
            pass  # it will see the job failed elsewhere when it reaches a barrier

    await asyncio.gather(*(one(u) for u in urls))


def aggregate(parts: dict[str, dict[str, Any]], away: dict[str, str]) -> dict[str, Any]:
    """One job from its targets' parts (``away``: member -> why it did not answer)."""
    first = next(iter(parts.values()))
    members = sorted(first.get("members") or parts)
    states = {t: p["state"] for t, p in parts.items()}
    progress = {
        f: sum(int(p["progress"].get(f, 0)) for p in parts.values()) for f in PROGRESS_FIELDS
    }
    errors: list[dict[str, Any]] = []
    for t in sorted(parts):
        errors.extend(parts[t].get("errors") or [])
    errors.sort(key=lambda e: e.get("time") or 0)
    reason = None
    if any(s == FAILED for s in states.values()):
        state = FAILED
        reason = next(parts[t]["reason"] for t in sorted(parts) if states[t] == FAILED)
    elif any(s == ABORTED for s in states.values()):
        state = ABORTED
        reason = next(parts[t]["reason"] for t in sorted(parts) if states[t] == ABORTED)
    elif all(states.get(t) == FINISHED for t in members):
        state = FINISHED
    else:
        state = RUNNING
    ended = [p.get("ended") for p in parts.values()]
    output: dict[str, Any] = {}
    for t in sorted(parts):
        for k, v in (parts[t].get("output") or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                output[k] = output.get(k, 0) + v
            elif isinstance(v, list):
                output.setdefault(k, []).extend(v)
            else:
                output.setdefault(k, v)
    return {
        "id": first["id"],
        "kind": first["kind"],
        "state": state,
        "reason": reason,
        "spec": first.get("spec") or {},
        "started": min(p["started"] for p in parts.values()),
        "ended": max(e for e in ended if e) if state != RUNNING and any(ended) else None,
        "progress": progress,
        "error_count": sum(int(p.get("error_count") or 0) for p in parts.values()),
        "errors": errors[:MAX_ERRORS],
        "output": output,
        "targets": {
            t: (
                {
                    "state": parts[t]["state"],
                    "reason": parts[t].get("reason"),
                    "started": parts[t].get("started"),
                    "ended": parts[t].get("ended"),
                    "progress": parts[t]["progress"],
                    "error_count": parts[t].get("error_count", 0),
                    "phases": parts[t].get("phases", []),
                    "restarts": parts[t].get("restarts", 0),
                    "output": parts[t].get("output") or {},
                }
                if t in parts
                else {"state": UNREACHABLE, "reason": away.get(t, NO_PART)}
            )
            for t in members
        },
    }


class JobViews:
    """Jobs as the gateway sees them: each target's part, aggregated (one per gateway).

    Reading only: a member away too long is ``job_monitor.JobMonitor``'s to fail.
    """

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.timeout = target_timeout_from_env()

    async def collect(
        self, path: str, params: dict[str, str] | None = None
    ) -> tuple[list[tuple[TargetInfo, dict[str, Any]]], dict[str, str]]:
        gw = self.gw
        targets = gw.known_targets()
        headers = _headers(gw)

        async def one(t: TargetInfo) -> Any:
            try:
                r = await gw.http.get(t.url + path, params=params, headers=headers, timeout=5.0)
            except httpx.HTTPError as e:
                return f"not reachable ({type(e).__name__})"
            if r.status_code == 404:
                return None
            if r.status_code != 200:
                return f"answered {r.status_code}"
            return r.json()

        answers = await asyncio.gather(*(one(t) for t in targets))
        found = [(t, a) for t, a in zip(targets, answers, strict=True) if isinstance(a, dict)]
        failed = {t.id: a for t, a in zip(targets, answers, strict=True) if isinstance(a, str)}
        return found, failed

    async def all(self, kind: str | None = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Every job (of ``kind``), newest first, and the targets that did not answer."""
        found, failed = await self.collect("/v1/_jobs", {"kind": kind} if kind else None)
        by_job: dict[str, dict[str, dict[str, Any]]] = {}
        for t, answer in found:
            for part in answer.get("jobs", []):
                by_job.setdefault(part["id"], {})[t.id] = part
        jobs = [aggregate(parts, failed) for parts in by_job.values()]
        jobs.sort(key=lambda j: j["started"], reverse=True)
        return jobs, failed

    async def view(self, job_id: str) -> dict[str, Any]:
        found, failed = await self.collect(f"/v1/_jobs/{quote(job_id)}")
        if not found:
            if failed:
                t = sorted(failed)[0]
                raise NoTargets(
                    f"job {job_id!r}: no target that answered knows it, and target {t!r} "
                    f"{failed[t]}; retry shortly",
                    retry_after=2,
                    job=job_id,
                    target=t,
                )
            raise JobNotFound(
                f"job {job_id!r} does not exist; list jobs with GET /v1/jobs", job=job_id
            )
        return aggregate({t.id: p for t, p in found}, failed)

    async def abort(self, job_id: str) -> dict[str, Any]:
        view = await self.view(job_id)
        if view["state"] == RUNNING:
            urls = [t.url for t in self.gw.known_targets()]
            await end_everywhere(self.gw, job_id, urls, ABORTED, "aborted by request")
            view = await self.view(job_id)
        return view


def job_views(gw: Gateway) -> JobViews:
    """The gateway's one ``JobViews`` (the away-timers are shared by every route)."""
    if gw.job_views is None:
        gw.job_views = JobViews(gw)
    assert isinstance(gw.job_views, JobViews)
    return gw.job_views


def jobs_router(gw: Gateway) -> APIRouter:
    router = APIRouter()
    load_kinds()
    views = job_views(gw)

    @router.post("/v1/jobs")
    async def start(request: Request) -> dict[str, Any]:
        gw.require_write(request, IN_BODY)  # the buckets: start_job
        refuse_unknown(request, ())
        body = await read_json(request, "job")
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            raise InvalidRequest('a job is {"kind": "...", "spec": {...}}')
        unknown = sorted(set(body) - {"kind", "spec"})
        if unknown:
            raise InvalidRequest(
                f"unknown field(s) {', '.join(unknown)} in a job; known: kind, spec"
            )
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise InvalidRequest("'spec' of a job must be a JSON object")
        return {"id": await start_job(gw, body["kind"], spec, request)}

    @router.get("/v1/jobs")
    async def list_jobs(request: Request) -> dict[str, Any]:
        gw.require_read(request)
        refuse_unknown(request, ("kind", "state"))
        kind = request.query_params.get("kind")
        state = request.query_params.get("state")
        if state and state not in STATES:
            raise InvalidRequest(f"state must be one of {', '.join(STATES)}, got {state!r}")
        jobs, failed = await views.all(kind)
        jobs = [j for j in jobs if not state or j["state"] == state]
        for j in jobs:
            j.pop("errors")
            j.pop("spec")
        return {"jobs": jobs, "unreachable": failed}

    @router.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str, request: Request) -> dict[str, Any]:
        gw.require_read(request, IN_BODY)  # and the job's buckets, once found
        refuse_unknown(request, ())
        view = await views.view(job_id)
        gw.require_read(request, *sum(job_buckets(view.get("spec") or {}), []))
        return view

    @router.post("/v1/jobs/{job_id}/abort")
    async def abort(job_id: str, request: Request) -> dict[str, Any]:
        gw.require_write(request)
        refuse_unknown(request, ())
        return await views.abort(job_id)

    return router
