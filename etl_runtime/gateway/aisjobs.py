"""``/v1/cluster``: Sluice's cluster view, and AIStore's job queries for its official SDK.

``GET /v1/cluster`` without ``what`` is Sluice's cluster view
(``membership.cluster_view``; Sluice's SDK and ``sluice cluster`` read it). The
official ``aistore`` SDK (2.0.x) asks about jobs ("xactions") on the same path,
with ``?what=`` and a JSON body, and gets AIStore's shapes:

* ``what=status`` (``Job.status()``, and ``Job.wait()`` for kinds that end:
  ``etl-bck``, ``dsort``, prefetch/evict), body ``{"ID", "Kind", "DaemonID",
  "Bck", "Buckets"}``: ``{"uuid", "kind", "err", "end_time", "aborted"}``,
  ``end_time`` in ns since the epoch and ``0`` while the job runs. With no
  ``ID``, the newest job of ``Kind``;
* ``what=qryxstats`` (``Job.get_details()``, ``wait_for_idle``,
  ``wait_single_node``, and ``wait()`` of a job known only by id): ``{target
  id: [JobSnap]}``, one snapshot per target of each job asked for (``ID``, or
  every job of ``Kind``, of ``DaemonID``, of ``Bck``; ``OnlyRunning``);
* ``what=status_all`` / ``what=running_all`` (``Cluster.list_jobs_status`` /
  ``list_running_jobs``), body ``{"kind", "node", "show_active"}``: a list of
  statuses / of ``"kind[id]"``;
* ``what=smap``: AIStore's cluster map (``gateway/smap.py``).

Any other ``what`` is a 400 naming it. ``PUT /v1/cluster`` ``{"action":
"stop", "value": {"ID"|"Kind"}}`` (``Job.abort()``) aborts the job (or every
running job of the kind); any other action is a 400 naming it.

Sluice job kinds are AIStore's ``etl-bck`` and ``dsort``, and
``prefetch-listrange`` / ``evict-listrange`` for ``prefetch`` / ``evict``
(either name is accepted in a query). A job's state maps onto a snapshot as:
``Finished`` -> ``end-time`` set, ``is_idle``; ``Failed`` and ``Aborted`` ->
also ``aborted`` with ``abort-err`` (the reason); ``Running`` -> ``end-time``
Go's zero time. ``stats`` carries the target's progress (``loc-objs``,
``loc-bytes``), and ``glob.id`` the workers of an ``etl-bck`` job. A job that
finished with per-object errors (``coer``) answers ``err`` / ``abort-err`` as
``"N object(s) failed: obj: why"``, not aborted, so ``Job.wait()`` reports it
unsuccessful with the count, as AIStore's does.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from etl_runtime.core.access import IN_BODY
from etl_runtime.core.errors import InvalidRequest, JobNotFound, SluiceError
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown, refuse_what
from etl_runtime.gateway import ais_move
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import JobViews, job_views
from etl_runtime.gateway.jobs import job_buckets as spec_buckets
from etl_runtime.gateway.membership import cluster_view
from etl_runtime.gateway.smap import smap
from etl_runtime.jobs.state import ABORTED, FAILED, RUNNING, TERMINAL

TC_KINDS = ("etl-bck", "etl-listrange", "copy-bck", "copy-listrange", "move-bck")  # transform.py
AIS_KINDS = {"prefetch": "prefetch-listrange", "evict": "evict-listrange"}
SLUICE_KINDS = {v: k for k, v in AIS_KINDS.items()}
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
WORKER_COUNT_SHIFT = 10  # glob.id packs joggers (10 bits), then workers (10 bits)
ARGS_FIELDS = ("ID", "Kind", "DaemonID", "Bck", "Buckets", "Timeout", "Force", "OnlyRunning")
QUERY_FIELDS = ("kind", "node", "show_active")
CLUSTER_WHATS = ("status", "qryxstats", "status_all", "running_all", "smap")
STOP = "stop"
GET_BATCH = "get-batch"  # AIStore's GetBatch xaction kind (batch_snaps)


def ais_kind(kind: str) -> str:
    return AIS_KINDS.get(kind, kind)


def _go_time(ts: float | None) -> str:
    if not ts:
        return GO_ZERO_TIME
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _bucket(value: Any) -> str | None:
    name = value.get("name") if isinstance(value, dict) else value
    return name if isinstance(name, str) and name else None


def job_buckets(view: dict[str, Any]) -> tuple[str | None, str | None]:
    """(source, destination) bucket of a job, as its kind names them."""
    spec = view.get("spec") or {}
    if view["kind"] == "dsort":
        return _bucket(spec.get("input_bck")), _bucket(spec.get("output_bck"))
    if view["kind"] in TC_KINDS:
        return _bucket(spec.get("src")), _bucket(spec.get("dst"))
    return _bucket(spec.get("bucket")), None


def _model(gw: Gateway, name: str | None) -> dict[str, Any] | None:
    if name is None:
        return None
    props = gw.cmap.get().buckets.get(name) if gw.cmap is not None else None
    provider = props.provider if props is not None else "ais"
    return {"name": name, "provider": provider, "namespace": {"uuid": "", "name": ""}}


def _ended(view: dict[str, Any]) -> bool:
    return view["state"] in TERMINAL


def errors_err(count: int, errors: list[dict[str, Any]]) -> str:
    """A job that ended with per-object errors, as AIStore's ``err``: the count and the first."""
    if not count:
        return ""
    first = errors[0] if errors else {}
    named = f": {first.get('object')}: {first.get('error')}" if first else ""
    return f"{count} object(s) failed{named}"


def status(view: dict[str, Any]) -> dict[str, Any]:
    """AIStore's ``nl.Status`` of a job."""
    failed = view["state"] in (FAILED, ABORTED)
    counted = errors_err(int(view.get("error_count") or 0), view.get("errors") or [])
    return {
        "uuid": view["id"],
        "kind": ais_kind(view["kind"]),
        "err": (view.get("reason") or view["state"].lower()) if failed else counted,
        "end_time": round((view.get("ended") or 0) * 1e6) * 1000 if _ended(view) else 0,  # ns
        "aborted": failed,
    }


def snaps(gw: Gateway, view: dict[str, Any], only: str = "") -> dict[str, dict[str, Any]]:
    """One AIStore ``JobSnap`` per target of ``view`` (of target ``only``, if given)."""
    src, dst = (_model(gw, b) for b in job_buckets(view))
    workers = (view.get("spec") or {}).get("num_workers") if view["kind"] in TC_KINDS else 0
    out = {}
    for tid, part in view["targets"].items():
        if only and tid != only:
            continue
        state, reason = part["state"], part.get("reason")
        if state not in (RUNNING, *TERMINAL):  # Unreachable: the job's state stands for it
            state, reason = view["state"], view.get("reason")
        failed = state in (FAILED, ABORTED)
        ended = part.get("ended") or view.get("ended")
        progress = part.get("progress") or {}
        out[tid] = {
            "id": view["id"],
            "kind": ais_kind(view["kind"]),
            "start-time": _go_time(part.get("started") or view["started"]),
            "end-time": _go_time(ended) if state in TERMINAL else GO_ZERO_TIME,
            "bck": src,
            "src-bck": src,
            "dst-bck": dst,
            "stats": {
                "loc-objs": str(progress.get("objects", 0)),
                "loc-bytes": str(progress.get("bytes", 0)),
                "out-objs": "0",
                "out-bytes": "0",
                "in-objs": "0",
                "in-bytes": "0",
            },
            "aborted": failed,
            "is_idle": state in TERMINAL,
            "abort-err": (
                (reason or view.get("reason") or state.lower())
                if failed
                else errors_err(
                    int(part.get("error_count") or 0),
                    [e for e in view.get("errors") or [] if e.get("target") == tid],
                )
                if state in TERMINAL
                else ""
            ),
            "glob.id": str((int(workers or 0) & 0x3FF) << WORKER_COUNT_SHIFT),
        }
    return out


async def _body(request: Request, known: tuple[str, ...]) -> dict[str, Any]:
    """The JSON body of an AIStore job query (``{}`` when there is none)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    body = await read_json(request, f"the body of {request.method} /v1/cluster")
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body of {request.method} /v1/cluster must be a JSON object")
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} in a job query; known: {', '.join(known)}"
        )
    return body


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key) or ""
    if not isinstance(value, str):
        raise InvalidRequest(f"{key} of a job query must be a string, got {value!r}")
    return value


def _kind_matches(view: dict[str, Any], kind: str) -> bool:
    return not kind or kind in (view["kind"], ais_kind(view["kind"]))


async def _jobs(views: JobViews, kind: str) -> list[dict[str, Any]]:
    jobs, _ = await views.all(SLUICE_KINDS.get(kind, kind) if kind else None)
    return jobs


async def _one(views: JobViews, job_id: str, kind: str) -> dict[str, Any]:
    """Job ``job_id`` (checked to be of ``kind``), or the newest of ``kind``."""
    if job_id:
        view = await ais_move.settle(views.gw, await views.view(job_id))  # a rename: OLD gone
        if not _kind_matches(view, kind):
            raise JobNotFound(
                f"job {job_id!r} is a {ais_kind(view['kind'])!r} job, not {kind!r}", job=job_id
            )
        return view
    if not kind:
        raise InvalidRequest("a job query needs the job's ID (or its Kind)")
    jobs = await _jobs(views, kind)
    if not jobs:
        raise JobNotFound(f"there is no {kind!r} job; list jobs with GET /v1/jobs")
    return await views.view(jobs[0]["id"])


def _touches(view: dict[str, Any], bucket: str | None) -> bool:
    return bucket is None or bucket in job_buckets(view)


def batch_snaps(gw: Gateway, node: str) -> dict[str, list[dict[str, Any]]]:
    """``get-batch`` by kind: each member target idle. A Sluice GetBatch is served within
    its request (``GET /v1/ml/moss``) and leaves no work behind, so ``Job(job_kind=
    "get-batch").wait()``, which waits for AIStore's idling kind to idle, returns."""
    members = gw.cmap.get().members if gw.cmap is not None else [t.id for t in gw.live_targets()]
    zero = {k: "0" for k in ("loc-objs", "loc-bytes", "out-objs", "out-bytes", "in-objs")}
    snap = {
        "id": "",
        "kind": GET_BATCH,
        "start-time": GO_ZERO_TIME,
        "end-time": GO_ZERO_TIME,
        "stats": {**zero, "in-bytes": "0"},
        "aborted": False,
        "is_idle": True,
        "abort-err": "",
        "glob.id": "0",
    }
    return {t: [snap] for t in members if not node or t == node}


async def xact_stats(gw: Gateway, views: JobViews, body: dict[str, Any]) -> dict[str, Any]:
    job_id, kind, node = _str(body, "ID"), _str(body, "Kind"), _str(body, "DaemonID")
    if kind == GET_BATCH and not job_id:
        return batch_snaps(gw, node)
    if job_id:
        jobs = [await _one(views, job_id, kind)]
    else:
        bucket = _bucket(body.get("Bck"))
        jobs = [j for j in await _jobs(views, kind) if _touches(j, bucket)]
        if body.get("OnlyRunning"):
            jobs = [j for j in jobs if j["state"] == RUNNING]
    out: dict[str, list[dict[str, Any]]] = {}
    for view in jobs:
        for tid, snap in snaps(gw, view, node).items():
            out.setdefault(tid, []).append(snap)
    return out


async def etl_job_errors(gw: Gateway, etl: str, job_id: str) -> list[dict[str, Any]] | None:
    """The per-object errors of offline transform ``job_id`` through ``etl`` (what
    ``etl.view(job_id).obj_errors`` lists); None if it is no such job."""
    try:
        view = await job_views(gw).view(job_id)
    except SluiceError:
        return None
    chain = (view.get("spec") or {}).get("etl") or []
    if view["kind"] not in TC_KINDS or etl not in chain:
        return None
    return list(view.get("errors") or [])


async def statuses(views: JobViews, body: dict[str, Any], running: bool) -> list[Any]:
    kind, node = _str(body, "kind"), _str(body, "node")
    if kind == GET_BATCH:
        return []  # never running, nothing kept (batch_snaps)
    jobs = [j for j in await _jobs(views, kind) if not node or node in j["targets"]]
    if running or body.get("show_active"):
        jobs = [j for j in jobs if j["state"] == RUNNING]
    if running:
        return [f"{ais_kind(j['kind'])}[{j['id']}]" for j in jobs]
    return [status(j) for j in jobs]


def cluster_router(gw: Gateway) -> APIRouter:
    router = APIRouter()
    views = job_views(gw)

    @router.get("/v1/cluster")
    async def cluster(request: Request) -> Any:
        if request.query_params.get("what") != "status":  # status: a job's buckets, below
            gw.require_read(request)  # cluster-wide: the read or user token (core/access.py)
        refuse_unknown(request, ("what",))
        if "what" not in request.query_params:
            return await cluster_view(gw)
        refuse_what(request, CLUSTER_WHATS)
        what = request.query_params["what"]
        if what == "smap":
            return smap(gw, request)
        if what == "status":  # Job.wait(): a token may follow a job of its buckets
            gw.require_read(request, IN_BODY)
            body = await _body(request, ARGS_FIELDS)
            view = await _one(views, _str(body, "ID"), _str(body, "Kind"))
            gw.require_read(request, *sum(spec_buckets(view.get("spec") or {}), []))
            return status(view)
        if what == "qryxstats":
            return await xact_stats(gw, views, await _body(request, ARGS_FIELDS))
        return await statuses(views, await _body(request, QUERY_FIELDS), what == "running_all")

    @router.put("/v1/cluster")
    async def cluster_action(request: Request) -> Response:
        gw.require_write(request)
        refuse_unknown(request, ())
        body = await read_json(request, "the action of PUT /v1/cluster")
        action = body.get("action") if isinstance(body, dict) else None
        if action != STOP:
            raise InvalidRequest(
                f"PUT /v1/cluster: action {action!r} is not supported; supported: {STOP!r} "
                "(abort a job); start jobs with POST /v1/jobs",
                action=action if isinstance(action, str) else None,
            )
        value = body.get("value") or {}
        if not isinstance(value, dict):
            raise InvalidRequest("'value' of the stop action must be a JSON object")
        unknown = sorted(set(value) - set(ARGS_FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown field(s) {', '.join(unknown)} in the stop action")
        job_id, kind = _str(value, "ID"), _str(value, "Kind")
        if job_id:
            await views.abort((await _one(views, job_id, kind))["id"])
            return Response()
        if not kind:
            raise InvalidRequest("the stop action needs the job's ID or Kind")
        for job in await _jobs(views, kind):
            if job["state"] == RUNNING:
                await views.abort(job["id"])
        return Response()

    return router
