"""``POST /v1/buckets/{src}``: offline transforms and copies, as jobs.

The requests are AIStore's, as its SDK sends them:

* ``etl-bck`` (``Bucket.transform``) and ``copy-bck`` (``Bucket.copy``): the
  destination in ``?bck_to=ais/@#/dst/``, ``value`` with ``prefix``,
  ``prepend``, ``ext``, ``num-workers``, ``coer`` (continue on error),
  ``dry_run`` and, for a transform, ``id`` (the ETL), ``pipeline``,
  ``request_timeout``;
* ``etl-listrange`` and ``copy-listrange`` (``objects(...).transform`` /
  ``.copy`` / ``.inspect``): the same ``value`` plus ``objnames`` or
  ``template`` and the destination in ``tobck`` (``{"name", "provider"}``).

* ``move-bck`` (``Bucket.rename``): ``gateway/ais_move.py``;
* ``prefetch-listrange`` (``objects(...).prefetch()``, a remote bucket):
  ``objnames`` or ``template``, ``coer``, ``num-workers`` and ``latest-ver``
  (false only); a ``prefetch`` job (``jobs/prefetch.py``). On an ``ais``
  bucket it is a 400: not a remote bucket.

Sluice adds ``template``, ``skip_existing`` and ``etl_args`` (and takes
``to_bucket`` in ``value`` instead of ``bck_to``). ``force``, ``latest-ver``
and ``synchronize`` are taken at their defaults only (a 400 naming them
otherwise); any other field is a 400 naming it. The answer is the job id:
plain text for the aistore SDK (``?provider=``), ``{"id", "kind"}`` JSON
otherwise.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import ais_move
from etl_runtime.gateway.jobs import start_job
from etl_runtime.jobs.listrange import expand

ACTION = "etl-bck"
PREFETCH = "prefetch-listrange"
ACTIONS = ("etl-bck", "etl-listrange", "copy-bck", "copy-listrange", PREFETCH, ais_move.ACTION)
COPIES = ("copy-bck", "copy-listrange")
# AIStore fields Sluice accepts only at their defaults (request_timeout: any).
IGNORED_DEFAULTS = {
    "force": False,
    "latest-ver": False,
    "synchronize": False,
    "request_timeout": None,
    "name": None,
}


async def is_job_action(request: Request) -> bool:
    try:
        body = await read_json(request, "bucket action")
    except InvalidRequest:
        return False
    return isinstance(body, dict) and body.get("action") in ACTIONS


def _to_bucket(raw: str) -> str:
    """``ais/@#/dst/`` (aistore SDK), ``ais://dst`` or ``dst`` -> ``dst``."""
    raw = raw.strip().strip("/")
    if raw.startswith("ais://"):
        return raw[len("ais://") :]
    parts = raw.split("/")
    if len(parts) == 3 and parts[0] == "ais" and parts[1].startswith("@"):
        return parts[2]
    if "/" in raw:
        raise InvalidRequest(f"bck_to={raw!r}: name an 'ais' bucket, e.g. ais/@#/dst/")
    return raw


def _tobck(bucket: str, raw: Any) -> str:
    """``tobck`` of a list/range action (AIStore's ``BucketModel``) -> its name."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidRequest('\'tobck\' must be a bucket: {"name", "provider"}', bucket=bucket)
    unknown = sorted(set(raw) - {"name", "provider", "namespace"})
    ns = raw.get("namespace") or {}
    if unknown or raw.get("provider", "ais") != "ais" or (ns and any(ns.values())):
        raise InvalidRequest(
            f"tobck={raw!r}: the destination must be an 'ais' bucket without a namespace"
            + (f" (unknown field(s) {', '.join(unknown)})" if unknown else ""),
            bucket=bucket,
        )
    return str(raw["name"])


def _selection(bucket: str, value: dict[str, Any]) -> dict[str, Any]:
    """``objnames`` / ``template`` of a list/range action as the job's fields."""
    names, template = value.pop("objnames", None), value.pop("template", None)
    if (names is None) == (template is None):
        raise InvalidRequest(
            f"bucket {bucket!r}: a list/range action needs 'objnames' or 'template'", bucket=bucket
        )
    if names is not None:
        return {"objnames": names}
    if not isinstance(template, str):
        raise InvalidRequest(f"bucket {bucket!r}: 'template' must be a string", bucket=bucket)
    listed = expand(bucket, template)
    return {"prefix": template} if listed is None else {"objnames": listed}


async def start_transform(gw: Any, bucket: str, request: Request) -> Response:
    refuse_unknown(request, ("provider", "bck_to"), bucket=bucket)
    body = await read_json(request, f"the body of POST /v1/buckets/{bucket}")
    action = body["action"]
    value = body.get("value") or {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"'value' of a {action} action must be a JSON object", bucket=bucket)
    unknown = sorted(set(body) - {"action", "name", "value"})
    if unknown:
        raise InvalidRequest(
            f"{action} of bucket {bucket!r}: unknown field(s) {', '.join(unknown)}", bucket=bucket
        )
    value = dict(value)
    for key, default in IGNORED_DEFAULTS.items():
        got = value.pop(key, default)
        if got not in (default, "", 0) and key not in ("request_timeout", "name"):
            raise InvalidRequest(f"{key}={got!r} is not supported by Sluice's {action}")
    if action == PREFETCH:
        return await _start_prefetch(gw, bucket, request, value)
    if action == ais_move.ACTION:  # bucket.rename(): gateway/ais_move.py
        return await ais_move.start_move(gw, bucket, request, body.get("value"))
    listrange = action.endswith("-listrange")
    if listrange:
        dst: Any = _tobck(bucket, value.pop("tobck", None))
        if "bck_to" in request.query_params:
            raise InvalidRequest(f"{action} names its destination in value.tobck, not bck_to")
        value.update(_selection(bucket, value))
    else:
        dst = value.pop("to_bucket", None) or request.query_params.get("bck_to")
    if not dst:
        raise InvalidRequest(f"{action} needs the destination: ?bck_to=ais/@#/dst/", bucket=bucket)
    etl = value.pop("id", None)
    pipeline = value.pop("pipeline", None) or []
    if action in COPIES:
        if etl or pipeline:
            raise InvalidRequest(f"{action} copies: it takes no ETL (id, pipeline)", bucket=bucket)
        chain: list[Any] = []
    elif isinstance(etl, list):
        chain = etl
    else:
        if not isinstance(etl, str) or not etl:
            raise InvalidRequest(f"{action} needs the ETL name in value.id", bucket=bucket)
        if not isinstance(pipeline, list):
            raise InvalidRequest("value.pipeline must be a list of ETL names", bucket=bucket)
        chain = [etl, *pipeline]
    renames = {"num-workers": "num_workers", "coer": "continue_on_error"}
    spec = {renames.get(k, k): v for k, v in value.items()}
    spec.update(etl=chain, src=bucket, dst=_to_bucket(str(dst)))
    spec.setdefault("continue_on_error", "provider" not in request.query_params)
    job_id = await start_job(gw, action, spec, request)
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return Response(
        content=f'{{"id": "{job_id}", "kind": "{action}"}}', media_type="application/json"
    )


async def _start_prefetch(
    gw: Any, bucket: str, request: Request, value: dict[str, Any]
) -> Response:
    """``prefetch-listrange``: a ``prefetch`` job over the names (or the template's prefix)."""
    if "bck_to" in request.query_params:
        raise InvalidRequest(f"{PREFETCH} of {bucket!r} takes no bck_to", bucket=bucket)
    spec: dict[str, Any] = {"bucket": bucket, **_selection(bucket, value)}
    renames = {"coer": "continue_on_error", "num-workers": "num_workers"}
    for key, got in value.items():
        if key not in renames:
            raise InvalidRequest(
                f"{PREFETCH} of bucket {bucket!r}: unknown field {key!r}; known: objnames, "
                "template, coer, num-workers, latest-ver (false)",
                bucket=bucket,
            )
        if key == "num-workers" and got in (0, -1):  # AIStore: 0 = default, -1 = one
            got = 1 if got == -1 else None
        if got is not None:
            spec[renames[key]] = got
    job_id = await start_job(gw, "prefetch", spec, request)
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return Response(
        content=f'{{"id": "{job_id}", "kind": "{PREFETCH}"}}', media_type="application/json"
    )
