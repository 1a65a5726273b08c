"""``POST /v1/buckets/{src}`` ``{"action": "etl-bck", ...}``: an offline transform.

The request is AIStore's, as its SDK's ``Bucket.transform`` sends it: the
destination in ``?bck_to=ais/@#/dst/`` and ``value`` with ``id`` (the ETL),
``pipeline``, ``prefix``, ``prepend``, ``ext``, ``num-workers``, ``coer``
(continue on error), ``dry_run``. Sluice adds ``template``, ``skip_existing``
and ``etl_args`` (and takes ``to_bucket`` in ``value`` instead of ``bck_to``).
The answer is the job id: plain text for the aistore SDK (``?provider=``),
``{"id": ...}`` JSON otherwise.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.jobs import start_job

ACTION = "etl-bck"
# AIStore fields Sluice takes as they are, and ones it accepts only at their defaults.
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
    return isinstance(body, dict) and body.get("action") == ACTION


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


async def start_transform(gw: Any, bucket: str, request: Request) -> Response:
    refuse_unknown(request, ("provider", "bck_to"), bucket=bucket)
    body = await read_json(request, f"the body of POST /v1/buckets/{bucket}")
    value = body.get("value") or {}
    if not isinstance(value, dict):
        raise InvalidRequest("'value' of an etl-bck action must be a JSON object", bucket=bucket)
    value = dict(value)
    for key, default in IGNORED_DEFAULTS.items():
        got = value.pop(key, default)
        if got not in (default, "", 0) and key not in ("request_timeout", "name"):
            raise InvalidRequest(f"{key}={got!r} is not supported by Sluice's etl-bck")
    dst = value.pop("to_bucket", None) or request.query_params.get("bck_to")
    if not dst:
        raise InvalidRequest("etl-bck needs the destination: ?bck_to=ais/@#/dst/", bucket=bucket)
    etl = value.pop("id", None)
    pipeline = value.pop("pipeline", None) or []
    if isinstance(etl, list):
        chain = etl
    else:
        if not isinstance(etl, str) or not etl:
            raise InvalidRequest("etl-bck needs the ETL name in value.id", bucket=bucket)
        if not isinstance(pipeline, list):
            raise InvalidRequest("value.pipeline must be a list of ETL names", bucket=bucket)
        chain = [etl, *pipeline]
    renames = {"num-workers": "num_workers", "coer": "continue_on_error"}
    spec = {renames.get(k, k): v for k, v in value.items()}
    spec.update(etl=chain, src=bucket, dst=_to_bucket(str(dst)))
    spec.setdefault("continue_on_error", "provider" not in request.query_params)
    job_id = await start_job(gw, "etl-bck", spec)
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return Response(
        content=f'{{"id": "{job_id}", "kind": "etl-bck"}}', media_type="application/json"
    )
