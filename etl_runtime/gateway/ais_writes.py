"""AIStore's own ways to write an object in steps: multipart upload and append.

Both keep what is written so far as hidden objects of the bucket, in the
area the S3 API's multipart uploads use (``.s3-multipart/ID/...``, see
``gateway/s3/multipart.py``): each part is an ordinary PUT to its HRW owner,
so it is checksummed (XXH3 + size) and copied like any object, an abandoned
one is reclaimed by the targets' sweep (``SLUICE_S3_UPLOAD_TTL``), and the
object itself does not change (nor appear) until the upload is completed or
the appends are flushed. Completing streams the parts, one after the other,
into one normal PUT of the object at its owner, then deletes them.

Multipart (``obj.multipart_upload()``):

* ``POST /v1/objects/{b}/{o}`` ``{"action": "mpt-upload"}`` answers the
  upload ID as text (also an S3 upload: ListMultipartUploads shows it);
* ``PUT ...?uploadId=ID&partNumber=N`` (1..10000) stores part N;
* ``POST ...?uploadId=ID`` ``{"action": "mpt-complete", "value":
  [{"part-number", "etag"}]}`` writes the object from the listed parts in
  ascending order (an ``etag`` that is not empty must be the part's MD5);
* ``DELETE ...?uploadId=ID`` ``{"action": "mpt-abort"}`` drops them.

Append (``get_writer().append_content()``, ``as_file(mode="a"|"w")``):
``PUT ...?append_type=append&append_handle=H`` stores the body as the next
part and answers ``Ais-Append-Handle``: ``ID.N`` (N parts so far; an empty
handle starts a new one). ``append_type=flush`` (its body, if any, is a last
part) writes the object as its current bytes (none if it does not exist)
followed by the parts, so appends are invisible until then, as AIStore's.

Over HTTPS the SDK sends a PUT's headers first (``Connection: close``, no
body) and the body to where a 307 points: such a probe is answered with a 307
to the same path, without its query (the SDK sends the query again).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import InvalidRequest, NoTargets, NotFound
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import remote as remote_gateway
from etl_runtime.gateway import views
from etl_runtime.gateway.buckets import list_bucket_page
from etl_runtime.gateway.context import Gateway, passthrough
from etl_runtime.gateway.placement import object_bytes, route
from etl_runtime.gateway.s3.multipart import HIDDEN

UPLOAD_ID = "uploadId"
PART_NO = "partNumber"
APPEND_TYPE = "append_type"
APPEND_HANDLE = "append_handle"
HANDLE_HEADER = "Ais-Append-Handle"
MAX_PARTS = 10_000
TIMEOUT = httpx.Timeout(600.0, connect=10.0)
_ID = re.compile(r"^[0-9a-f]{32}$")


def is_ais_write(request: Request) -> bool:
    """A multipart or append call of the aistore SDK (answered here, not redirected)."""
    q, method = request.query_params, request.method
    if method == "POST":
        return True  # the native API has no object POST: mpt-upload / mpt-complete
    if method == "PUT":
        return any(k in q for k in (UPLOAD_ID, PART_NO, APPEND_TYPE, APPEND_HANDLE))
    return method == "DELETE" and UPLOAD_ID in q


def is_probe(request: Request) -> bool:
    """The SDK's first leg of a PUT with a body over HTTPS: the headers only (the body's
    ``Content-Length``, ``Connection: close``); it sends the body where a 307 points."""
    return (
        request.method == "PUT"
        and request.headers.get("connection", "").lower() == "close"
        and request.headers.get("user-agent", "").startswith("ais/python")
    )


async def answer(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    q = request.query_params
    if is_probe(request):  # here again, with the body (the SDK adds the query itself)
        return Response(status_code=307, headers={"Location": str(request.url.replace(query=""))})
    if views.view_of(gw, bucket) is not None:
        raise views.refuse_write(bucket, name, request.method)
    await remote_gateway.ensure_bucket(gw, request, bucket)
    if request.method == "PUT" and (APPEND_TYPE in q or APPEND_HANDLE in q):
        refuse_unknown(
            request, ("provider", APPEND_TYPE, APPEND_HANDLE), bucket=bucket, object=name
        )
        return await append(gw, request, bucket, name)
    if request.method == "PUT":
        refuse_unknown(request, ("provider", UPLOAD_ID, PART_NO), bucket=bucket, object=name)
        return await put_part(gw, request, bucket, name)
    known = ("provider", UPLOAD_ID) if UPLOAD_ID in q else ("provider",)
    refuse_unknown(request, known, bucket=bucket, object=name)
    msg = await _action(request, bucket, name)
    action = msg.get("action")
    want = {"POST": ("mpt-complete" if UPLOAD_ID in q else "mpt-upload"), "DELETE": "mpt-abort"}
    if action != want[request.method]:
        raise InvalidRequest(
            f"{request.method} {bucket}/{name}: unknown action {action!r} "
            f"(with{'' if UPLOAD_ID in q else 'out'} {UPLOAD_ID}=, send {want[request.method]!r})",
            bucket=bucket,
            object=name,
        )
    if action == "mpt-upload":
        _no_value(msg, bucket, name)
        return PlainTextResponse(await create(gw, bucket, name))
    upload_id = q[UPLOAD_ID]
    if action == "mpt-abort":
        _no_value(msg, bucket, name)
        await abort(gw, bucket, name, upload_id)
        return Response()
    await complete(gw, bucket, name, upload_id, _completed_parts(msg.get("value"), bucket, name))
    return Response()


async def _action(request: Request, bucket: str, name: str) -> dict[str, Any]:
    what = f"the body of {request.method} {bucket}/{name}"
    body = await read_json(request, what) if await request.body() else None
    if not isinstance(body, dict) or not isinstance(body.get("action"), str):
        raise InvalidRequest(
            f"{what} must be an action message {{'action': ..., 'value': ...}}",
            bucket=bucket,
            object=name,
        )
    unknown = sorted(set(body) - {"action", "name", "value"})
    if unknown or body.get("name") not in (None, ""):
        raise InvalidRequest(
            f"{what}: unknown field(s) {', '.join(unknown or ['name'])} of the action message",
            bucket=bucket,
            object=name,
        )
    return body


def _no_value(msg: dict[str, Any], bucket: str, name: str) -> None:
    if msg.get("value") not in (None, "", {}, []):
        raise InvalidRequest(
            f"action {msg['action']!r} on {bucket}/{name} takes no value",
            bucket=bucket,
            object=name,
        )


def _completed_parts(value: Any, bucket: str, name: str) -> list[tuple[int, str]]:
    """``[{"part-number", "etag"}]`` -> ``[(n, etag)]``, ascending and once each."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            f"mpt-complete of {bucket}/{name} lists no parts: send "
            "'value': [{'part-number': N, 'etag': ''}, ...]",
            bucket=bucket,
            object=name,
        )
    parts: dict[int, str] = {}
    for p in value:
        extra = sorted(set(p) - {"part-number", "etag"}) if isinstance(p, dict) else []
        n = p.get("part-number") if isinstance(p, dict) else None
        if extra or not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PARTS:
            raise InvalidRequest(
                f"mpt-complete of {bucket}/{name}: bad part {p!r} (part-number 1..{MAX_PARTS}"
                + (f"; unknown field(s) {', '.join(extra)}" if extra else "")
                + ")",
                bucket=bucket,
                object=name,
            )
        etag = str(p.get("etag") or "").strip('"')
        if parts.get(n, etag) != etag:
            raise InvalidRequest(
                f"mpt-complete of {bucket}/{name}: part {n} listed with two etags",
                bucket=bucket,
                object=name,
            )
        parts[n] = etag
    return sorted(parts.items())


# -- the hidden objects ----------------------------------------------------------


def _dir(upload_id: str, bucket: str, name: str) -> str:
    if not _ID.fullmatch(upload_id):  # never a path: a 400 naming it
        shown = upload_id if len(upload_id) <= 64 else upload_id[:64] + "..."
        raise InvalidRequest(
            f"{UPLOAD_ID}={shown!r} is not an upload id (32 hex digits, as the upload's "
            "start answers)",
            bucket=bucket,
            object=name,
        )
    return f"{HIDDEN}{upload_id}/"


def _part(upload_id: str, number: int, bucket: str, name: str) -> str:
    return f"{_dir(upload_id, bucket, name)}part-{number:05d}"


def _no_upload(upload_id: str, bucket: str, name: str) -> NotFound:
    err = NotFound(
        f"upload {upload_id!r} of {bucket}/{name} does not exist: it was completed, "
        "aborted, or never made",
        bucket=bucket,
        object=name,
    )
    err.kind = "NoSuchUpload"
    return err


def _unreachable(what: str, e: Exception) -> NoTargets:
    return NoTargets(
        f"writing {what}: a target did not answer ({type(e).__name__}); retry", object=what
    )


async def _put(
    gw: Gateway,
    bucket: str,
    name: str,
    body: AsyncIterator[bytes] | bytes,
    length: int | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A normal PUT of ``bucket/name`` at its owner (copies, checksum); its JSON answer."""
    owner = route(gw, "PUT", bucket, name)
    sent = {**gw.target_headers(), **(headers or {})}
    if length is not None:
        sent["content-length"] = str(length)
    try:
        r = await gw.http.put(
            object_url(owner.url, bucket, name), content=body, headers=sent, timeout=TIMEOUT
        )
    except ClientDisconnect:
        raise InvalidRequest(f"the client went away while writing {bucket}/{name}") from None
    except httpx.HTTPError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, InvalidRequest | NotFound):  # raised by our body, inside httpx
            raise cause from None
        raise _unreachable(f"{bucket}/{name}", e) from None
    if r.status_code not in (200, 201):
        raise passthrough(r)
    answer: dict[str, Any] = r.json()
    return answer


async def _read(gw: Gateway, parts: list[tuple[str, str]]) -> AsyncIterator[bytes]:
    """The bytes of the objects ``(bucket, name)``, one after the other, streamed."""
    for bucket, name in parts:
        async for chunk in object_bytes(gw, bucket, name, f"writing {bucket}/{name}"):
            yield chunk


async def _head(gw: Gateway, bucket: str, name: str) -> httpx.Response | None:
    """The object's HEAD answer, or None if it does not exist."""
    src = route(gw, "HEAD", bucket, name)
    try:
        r = await gw.http.head(
            object_url(src.url, bucket, name), headers=gw.target_headers(), follow_redirects=True
        )
    except httpx.HTTPError as e:
        raise _unreachable(f"{bucket}/{name}", e) from None
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise passthrough(r)
    return r


async def _delete(gw: Gateway, bucket: str, names: list[str]) -> None:
    limit = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with limit:
            owner = route(gw, "DELETE", bucket, name)
            try:
                r = await gw.http.delete(
                    object_url(owner.url, bucket, name), headers=gw.target_headers()
                )
            except httpx.HTTPError as e:
                raise _unreachable(f"{bucket}/{name}", e) from None
            if r.status_code not in (200, 204, 404):
                raise passthrough(r)

    await asyncio.gather(*(one(n) for n in names))


async def _stored_parts(gw: Gateway, bucket: str, prefix: str) -> dict[int, dict[str, Any]]:
    """The parts under ``prefix`` (``.../part-``), by number."""
    found: dict[int, dict[str, Any]] = {}
    after = ""
    while True:
        page = await list_bucket_page(gw, bucket, prefix, after, 1000)
        for o in page["objects"]:
            tail = o["name"][len(prefix) :]
            if tail.isascii() and tail.isdigit():
                found[int(tail)] = o
        if page["next"] is None:
            return found
        after = page["next"]


def _body(request: Request) -> tuple[AsyncIterator[bytes], int | None]:
    raw = request.headers.get("content-length")
    length = int(raw) if raw is not None and (raw.isascii() and raw.isdigit()) else None
    return request.stream(), length


# -- multipart ---------------------------------------------------------------------


async def create(gw: Gateway, bucket: str, name: str) -> str:
    route(gw, "PUT", bucket, name)  # the bucket exists, a member owns it
    upload_id = secrets.token_hex(16)
    record = json.dumps({"key": name, "created": time.time(), "meta": {}}).encode()
    await _put(gw, bucket, _dir(upload_id, bucket, name) + "upload", record, len(record))
    return upload_id


async def _check_upload(gw: Gateway, bucket: str, name: str, upload_id: str) -> None:
    record_name = _dir(upload_id, bucket, name) + "upload"
    try:
        raw = b"".join([c async for c in _read(gw, [(bucket, record_name)])])
    except NotFound:
        raise _no_upload(upload_id, bucket, name) from None
    try:
        key = json.loads(raw).get("key")
    except (ValueError, AttributeError):
        key = None
    if key != name:
        raise _no_upload(upload_id, bucket, name)


def _part_number(request: Request, bucket: str, name: str) -> int:
    raw = request.query_params.get(PART_NO, "")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PARTS:
        raise InvalidRequest(
            f"{PART_NO} must be 1..{MAX_PARTS}, got {raw!r} (a part of {bucket}/{name})",
            bucket=bucket,
            object=name,
        )
    return int(raw)


async def put_part(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    if UPLOAD_ID not in request.query_params:
        raise InvalidRequest(
            f"a part of {bucket}/{name} needs {UPLOAD_ID}= (from mpt-upload)",
            bucket=bucket,
            object=name,
        )
    number = _part_number(request, bucket, name)
    upload_id = request.query_params[UPLOAD_ID]
    await _check_upload(gw, bucket, name, upload_id)
    body, length = _body(request)
    stored = await _put(gw, bucket, _part(upload_id, number, bucket, name), body, length)
    return Response(headers={"ETag": f'"{stored["etag"]}"'})


async def complete(
    gw: Gateway, bucket: str, name: str, upload_id: str, asked: list[tuple[int, str]]
) -> None:
    await _check_upload(gw, bucket, name, upload_id)
    prefix = _dir(upload_id, bucket, name) + "part-"
    stored = await _stored_parts(gw, bucket, prefix)
    for n, etag in asked:
        part = stored.get(n)
        if part is None:
            raise InvalidRequest(
                f"mpt-complete of {bucket}/{name}: part {n} was not uploaded "
                f"(uploaded: {sorted(stored) or 'none'})",
                bucket=bucket,
                object=name,
            )
        if etag and part.get("etag") != etag:
            raise InvalidRequest(
                f"mpt-complete of {bucket}/{name}: part {n}'s etag is not {etag!r}",
                bucket=bucket,
                object=name,
            )
    chosen = [stored[n]["name"] for n, _ in asked]
    length = sum(int(stored[n]["size"]) for n, _ in asked)
    await _put(gw, bucket, name, _read(gw, [(bucket, p) for p in chosen]), length)
    await _delete(
        gw,
        bucket,
        [o["name"] for o in stored.values()] + [_dir(upload_id, bucket, name) + "upload"],
    )


async def abort(gw: Gateway, bucket: str, name: str, upload_id: str) -> None:
    await _check_upload(gw, bucket, name, upload_id)
    stored = await _stored_parts(gw, bucket, _dir(upload_id, bucket, name) + "part-")
    await _delete(
        gw,
        bucket,
        [o["name"] for o in stored.values()] + [_dir(upload_id, bucket, name) + "upload"],
    )


# -- append ------------------------------------------------------------------------


def _parse_handle(handle: str, bucket: str, name: str) -> tuple[str, int]:
    upload_id, _, count = handle.partition(".")
    if (
        not _ID.fullmatch(upload_id)
        or not (count.isascii() and count.isdigit())
        or not 1 <= int(count) <= MAX_PARTS
    ):
        raise InvalidRequest(
            f"{APPEND_HANDLE}={handle!r} is not a handle an append of {bucket}/{name} answered",
            bucket=bucket,
            object=name,
        )
    return upload_id, int(count)


async def append(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    q = request.query_params
    kind, handle = q.get(APPEND_TYPE, ""), q.get(APPEND_HANDLE, "")
    if kind not in ("append", "flush"):
        raise InvalidRequest(
            f"{APPEND_TYPE}={kind!r} on {bucket}/{name}: send 'append' or 'flush'",
            bucket=bucket,
            object=name,
        )
    body, length = _body(request)
    if handle:
        upload_id, count = _parse_handle(handle, bucket, name)
    elif kind == "flush":
        raise InvalidRequest(
            f"flush of {bucket}/{name} needs the {APPEND_HANDLE} its appends answered",
            bucket=bucket,
            object=name,
        )
    else:
        route(gw, "PUT", bucket, name)  # the bucket exists
        upload_id, count = secrets.token_hex(16), 0
    prefix = f"{HIDDEN}{upload_id}/append-"
    if kind == "append" or length != 0:
        if count >= MAX_PARTS:
            raise InvalidRequest(
                f"{bucket}/{name}: more than {MAX_PARTS} appends before a flush; flush first",
                bucket=bucket,
                object=name,
            )
        count += 1
        await _put(gw, bucket, f"{prefix}{count:05d}", body, length)
    if kind == "append":
        return Response(headers={HANDLE_HEADER: f"{upload_id}.{count}"})
    await flush(gw, bucket, name, prefix, count, handle)
    return Response()


async def flush(gw: Gateway, bucket: str, name: str, prefix: str, count: int, handle: str) -> None:
    stored = await _stored_parts(gw, bucket, prefix)
    missing = [n for n in range(1, count + 1) if n not in stored]
    if missing:
        raise InvalidRequest(
            f"flush of {bucket}/{name}: the appends of handle {handle!r} are gone (flushed "
            "already, or swept); append again without a handle",
            bucket=bucket,
            object=name,
        )
    current = await _head(gw, bucket, name)
    chain = [(bucket, name)] if current is not None else []
    chain += [(bucket, stored[n]["name"]) for n in range(1, count + 1)]
    length = int(current.headers.get("content-length", "0")) if current is not None else 0
    length += sum(int(stored[n]["size"]) for n in range(1, count + 1))
    # The current object is opened for reading before its new version is published.
    await _put(gw, bucket, name, _read(gw, chain), length, _kept_meta(current))
    await _delete(gw, bucket, [o["name"] for o in stored.values()])


def _kept_meta(head: httpx.Response | None) -> dict[str, str]:
    """The object's content type and ``X-Sluice-Meta-*``, kept by a rewrite."""
    if head is None:
        return {}
    return {
        k: v
        for k, v in head.headers.items()
        if k.lower() == "content-type" or k.lower().startswith("x-sluice-meta-")
    }
