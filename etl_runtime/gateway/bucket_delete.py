"""What a ``DELETE /v1/buckets/{bucket}`` asks for: the bucket, or some of its objects.

The body decides, and it is always read:

* no body, or AIStore's ``{"action": "destroy-bck"}`` (``Bucket.delete()``):
  the bucket and every object in it;
* ``{"action": "delete-listrange", "value": {"objnames": [...]}}`` or
  ``{"value": {"template": "..."}}`` (``bucket.objects(...).delete()``): a
  ``delete-listrange`` job over those objects (``jobs/listrange.py``); the
  bucket stays;
* ``{"action": "evict-listrange", "value": {...}}`` (``objects(...).evict()``,
  a remote bucket only): an ``evict`` job dropping those objects' cached
  copies (``jobs/prefetch.py``); the backend keeps them;

A job's id is the answer: plain text for the aistore SDK (``?provider=``),
which follows it with ``Job.wait()``; ``{"id", "kind"}`` JSON otherwise. Any
other action, field or body is a 400 naming it and the bucket, and deletes
nothing.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import parse_json
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import start_job
from etl_runtime.jobs.listrange import expand, listrange_spec

DESTROY = "destroy-bck"
DELETE_OBJECTS = "delete-listrange"
EVICT_OBJECTS = "evict-listrange"
ACTIONS = (DESTROY, DELETE_OBJECTS, EVICT_OBJECTS)
_MSG_FIELDS = ("action", "name", "value")  # AIStore's ActionMsg


async def objects_action(gw: Gateway, bucket: str, request: Request) -> Response | None:
    """The job a list/range delete or evict started (its id as the answer), or None
    when the request destroys the bucket."""
    raw = await request.body()
    if not raw.strip():
        return None
    what = f"the body of DELETE /v1/buckets/{bucket}"
    body = parse_json(raw, what)
    if not isinstance(body, dict) or not isinstance(body.get("action"), str):
        raise InvalidRequest(
            f'{what} must be an action message, {{"action": ...}}, one of '
            f"{', '.join(ACTIONS)}; nothing was deleted",
            bucket=bucket,
        )
    action = body["action"]
    if action not in ACTIONS:
        raise InvalidRequest(
            f"unknown action {action!r} for DELETE /v1/buckets/{bucket}; known: "
            f"{', '.join(ACTIONS)}; nothing was deleted",
            bucket=bucket,
            action=action,
        )
    unknown = sorted(set(body) - set(_MSG_FIELDS))
    if unknown or body.get("name") not in (None, ""):
        named = ", ".join(unknown) if unknown else f"name={body['name']!r}"
        raise InvalidRequest(
            f"{what}: {named} is not read by {action!r}; nothing was deleted",
            bucket=bucket,
            action=action,
        )
    value = body.get("value")
    if action == DESTROY:
        if value not in (None, {}):
            raise InvalidRequest(
                f"{what}: {DESTROY!r} takes no value (got {value!r}); to delete some "
                f"objects send {DELETE_OBJECTS!r}; nothing was deleted",
                bucket=bucket,
                action=action,
            )
        return None
    spec = listrange_spec(bucket, value)
    if action == EVICT_OBJECTS:
        job_id = await start_job(gw, "evict", evict_spec(bucket, spec))
        return job_answer(request, job_id, EVICT_OBJECTS)
    job_id = await start_job(gw, DELETE_OBJECTS, spec)
    return job_answer(request, job_id, DELETE_OBJECTS)


def evict_spec(bucket: str, spec: dict[str, object]) -> dict[str, object]:
    """A list/range spec as the ``evict`` job's: names, or a template's prefix."""
    if "objnames" in spec:
        return {"bucket": bucket, "objnames": spec["objnames"]}
    template = str(spec["template"])
    names = expand(bucket, template)
    if names is None:
        return {"bucket": bucket, "prefix": template}
    return {"bucket": bucket, "objnames": names}


def job_answer(request: Request, job_id: str, kind: str) -> Response:
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return JSONResponse({"id": job_id, "kind": kind})
