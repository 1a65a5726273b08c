"""``PUT /v1/buckets/{b}`` ``{"action": "archive"}``: AIStore's ``objects(...).archive()``.

The value is AIStore's ``ArchiveBckMsg``: the selection (``objnames``, or
``template`` with brace ranges, or a plain prefix), ``archname`` (the new
object), ``tobck`` (its bucket; the source by default), ``mime`` (``.tar``,
``.tgz``, ``.tar.gz``, ``.zip``; else from the name), ``isbn`` (member names
carry the source bucket), ``aate`` (append to an existing archive) and
``coer``. A prefix is listed here, so the ``archive`` job
(``jobs/archive.py``) always gets names. The answer is the job id (text for
the SDK, which splits it on commas). Any other action or field is a 400
naming it; nothing is written.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.aiscompat import IN_PROGRESS
from etl_runtime.gateway.bucket_action import _tobck
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.jobs import start_job
from etl_runtime.jobs.archive import MAX_NAMES, archive_format
from etl_runtime.jobs.listrange import expand

ACTION = "archive"
VALUE_FIELDS = ("objnames", "template", "archname", "tobck", "mime", "isbn", "aate", "coer")


async def start_archive(gw: Gateway, bucket: str, request: Request, list_page: Any) -> Response:
    """``list_page(gw, bucket, prefix, start_after, limit)``: the gateway's merged listing."""
    refuse_unknown(request, ("provider",), bucket=bucket)
    what = f"the body of PUT /v1/buckets/{bucket}"
    body = await read_json(request, what)
    action = body.get("action") if isinstance(body, dict) else None
    if action != ACTION:
        raise InvalidRequest(
            f"unknown action {action!r} for PUT /v1/buckets/{bucket}; known: {ACTION}",
            bucket=bucket,
            action=action,
        )
    unknown = sorted(set(body) - {"action", "name", "value"})
    if unknown or body.get("name") not in (None, ""):
        raise InvalidRequest(
            f"{what}: unknown field(s) {', '.join(unknown or ['name'])}", bucket=bucket
        )
    value = body.get("value")
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what}: 'value' must be an object", bucket=bucket)
    extra = sorted(set(value) - set(VALUE_FIELDS))
    if extra:
        raise InvalidRequest(
            f"archive of bucket {bucket!r}: unknown field(s) {', '.join(extra)}; known: "
            + ", ".join(VALUE_FIELDS),
            bucket=bucket,
        )
    archname = value.get("archname")
    if not isinstance(archname, str) or not archname:
        raise InvalidRequest(f"archive of bucket {bucket!r} needs 'archname'", bucket=bucket)
    for flag in ("isbn", "aate", "coer"):
        if not isinstance(value.get(flag, False), bool):
            raise InvalidRequest(f"archive of {bucket!r}: {flag!r} must be true or false")
    dst = _tobck(bucket, value["tobck"]) if value.get("tobck") is not None else bucket
    spec = {
        "bucket": bucket,
        "objnames": await _names(gw, bucket, value, list_page),
        "dst": dst,
        "archname": archname,
        "format": archive_format(archname, str(value.get("mime") or "")),
        "isbn": value.get("isbn", False),
        "aate": value.get("aate", False),
        "continue_on_error": value.get("coer", False),
    }
    job_id = await start_job(gw, ACTION, spec, request)
    if "provider" in request.query_params:
        return PlainTextResponse(job_id)
    return JSONResponse({"id": job_id, "kind": ACTION})


async def _names(gw: Gateway, bucket: str, value: dict[str, Any], list_page: Any) -> list[str]:
    names, template = value.get("objnames"), value.get("template")
    if (names is None) == (template is None):
        raise InvalidRequest(
            f"archive of bucket {bucket!r}: give 'objnames' or 'template', one of them",
            bucket=bucket,
        )
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidRequest(f"archive of {bucket!r}: 'objnames' must be a list of strings")
        return names
    if not isinstance(template, str):
        raise InvalidRequest(f"archive of {bucket!r}: 'template' must be a string")
    listed = expand(bucket, template)
    if listed is not None:
        return listed
    found: list[str] = []  # a prefix: what the bucket holds under it, now
    after = ""
    while True:
        page = await list_page(gw, bucket, template, after, 1000)
        found += [o["name"] for o in page["objects"] if not o["name"].startswith(IN_PROGRESS)]
        if page["next"] is None or len(found) > MAX_NAMES:
            break
        after = page["next"]
    if not found:
        raise InvalidRequest(
            f"archive of bucket {bucket!r}: no object under the prefix {template!r}",
            bucket=bucket,
        )
    return found
