"""AIStore's bucket summary, for its SDK's ``bucket.summary()`` and ``bucket.info()``.

* ``bucket.summary(prefix=...)``: ``GET /v1/buckets/{b}`` with ``{"action":
  "summary-bck", "value": {"uuid", "prefix", "cached", "present"}}``. Without
  ``uuid`` the answer is ``202`` and an id; asked again with it, ``200`` and
  ``[BsummResult]``.
* ``bucket.info()``: ``HEAD /v1/buckets/{b}?presence=&bsumm_remote=``: ``202``
  with ``Ais-Bucket-Props`` (the bucket's props) and ``Ais-Xaction-Id``; asked
  again with ``?uuid=``, ``200`` with the summary in ``Ais-Bucket-Summ``.

The summary is counted when asked for with the id (the listing of the bucket
under ``prefix``, as every target holds it), so no state is kept between the
two calls. ``BsummResult``: ``ObjCount`` (``obj_count_present``),
``ObjSize`` (min, max, avg), ``TotalSize`` (``size_on_disk``,
``size_all_present_objs``), ``is_present``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from etl_runtime.core.errors import InvalidRequest, bucket_not_found
from etl_runtime.core.jsonbody import MAX_DEPTH, nesting_depth
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.context import Gateway

SUMMARY = "summary-bck"
SUMMARY_FIELDS = ("uuid", "prefix", "cached", "present")
INFO_PARAMS = ("provider", "presence", "bsumm_remote", "uuid")
PRESENCE = ("0", "1", "2", "3", "4", "5")  # FLTPresence: every value asks the same here
PAGE = 10_000
# list_bucket_page(gw, bucket, prefix, start_after, limit) of gateway/buckets.py
Lister = Callable[[Gateway, str, str, str, int], Awaitable[dict[str, Any]]]


def summary_action(raw: bytes, bucket: str) -> dict[str, Any] | None:
    """The ``value`` of a ``summary-bck`` body, or None for any other body."""
    if nesting_depth(raw) > MAX_DEPTH:  # json.loads would raise RecursionError: a 500
        return None  # (the listing's own parse answers the 400)
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("action") != SUMMARY:
        return None
    value = body.get("value") or {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"'value' of {SUMMARY} must be an object", bucket=bucket)
    unknown = sorted(set(value) - set(SUMMARY_FIELDS)) + sorted(
        set(body) - {"action", "name", "value"}
    )
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} of {SUMMARY}; known: "
            f"{', '.join(SUMMARY_FIELDS)}",
            bucket=bucket,
        )
    if not isinstance(value.get("prefix") or "", str):
        raise InvalidRequest(f"'prefix' of {SUMMARY} must be a string", bucket=bucket)
    return value


async def summarize(gw: Gateway, lister: Lister, bucket: str, prefix: str) -> dict[str, Any]:
    count = total = 0
    smallest = largest = 0
    start_after = ""
    while True:
        page = await lister(gw, bucket, prefix, start_after, PAGE)
        for o in page["objects"]:
            size = int(o.get("size") or 0)
            smallest = size if count == 0 else min(smallest, size)
            largest = max(largest, size)
            count += 1
            total += size
        if page["next"] is None:
            break
        start_after = page["next"]
    return {
        "name": bucket,
        "provider": "ais",
        "namespace": {"uuid": "", "name": ""},
        "ObjCount": {"obj_count_present": str(count), "obj_count_remote": "0"},
        "ObjSize": {
            "obj_min_size": smallest,
            "obj_max_size": largest,
            "obj_avg_size": total // count if count else 0,
        },
        "TotalSize": {
            "size_on_disk": str(total),
            "size_all_present_objs": str(total),
            "size_all_remote_objs": "0",
            "total_disks_size": "0",
        },
        "used_pct": 0,
        "is_present": True,
    }


def _known(gw: Gateway, bucket: str) -> None:
    if gw.cmap is not None and bucket not in gw.cmap.get().buckets:
        raise bucket_not_found(bucket)


async def summary(gw: Gateway, lister: Lister, bucket: str, value: dict[str, Any]) -> Response:
    _known(gw, bucket)
    uuid = value.get("uuid") or ""
    if not uuid:
        return PlainTextResponse(f"{SUMMARY}-{secrets.token_hex(4)}", status_code=202)
    return JSONResponse([await summarize(gw, lister, bucket, str(value.get("prefix") or ""))])


def is_info(request: Request) -> bool:
    q = request.query_params
    return "presence" in q or "bsumm_remote" in q or "uuid" in q


async def info(gw: Gateway, lister: Lister, bucket: str, request: Request) -> Response:
    refuse_unknown(request, INFO_PARAMS, bucket=bucket)
    q = request.query_params
    if q.get("presence", "0") not in PRESENCE:
        raise InvalidRequest(f"presence={q['presence']!r}: one of 0..5", bucket=bucket)
    _known(gw, bucket)
    if not q.get("uuid"):
        props = gw.cmap.get().buckets[bucket].to_dict() if gw.cmap is not None else {}
        headers = {
            "Ais-Bucket-Props": json.dumps(props),
            "Ais-Xaction-Id": f"{SUMMARY}-{secrets.token_hex(4)}",
        }
        return Response(status_code=202, headers=headers)
    summ = await summarize(gw, lister, bucket, "")
    return Response(headers={"Ais-Bucket-Summ": json.dumps(summ)})
