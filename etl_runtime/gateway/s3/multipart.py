"""S3 multipart uploads, kept as hidden objects of the bucket until they are completed.

An upload ``ID`` (random, 32 hex digits) is the objects
``BUCKET/.s3-multipart/ID/upload`` (JSON: the key it was made for) and
``BUCKET/.s3-multipart/ID/part-NNNNN``, one per part, each placed on its own
HRW owner like any object. They are ordinary objects for the rest of Sluice
(copies, rebalance, the native listing shows them); the S3 API hides them
from its listings and refuses keys under ``.s3-multipart/``.

* CreateMultipartUpload writes the ``upload`` object;
* UploadPart streams the part into ``part-NNNNN`` (checked like PutObject);
  its ETag is the part's MD5;
* CompleteMultipartUpload checks the listed parts (ascending numbers, ETags
  that match, every part but the last at least 5 MiB, as S3 wants), streams
  them one after the other into a normal PUT of the key at its owner (one
  part's chunk in memory at a time), then deletes the parts and marks the
  ``upload`` record completed (its answer and parts list): the same Complete
  sent again, say after its answer was lost, gets the same answer, as S3's
  does; any other call on the upload is ``NoSuchUpload``. The sweep deletes
  the record with the others. Its
  ETag is S3's multipart form, ``MD5(MD5(part 1) + ... + MD5(part N))-N``. The
  stored object keeps the MD5 of its bytes, which later GETs and HEADs show
  as its ETag (the store keeps one ETag per object);
* AbortMultipartUpload deletes them; ListParts lists them.

ListMultipartUploads lists the ``upload`` records (key, ID, time). An
abandoned upload is aborted by the targets' sweep once older than
``SLUICE_S3_UPLOAD_TTL`` (24 h: ``storage_target/multipart_sweep.py``);
deleting the bucket removes it too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from etl_runtime.core.errors import InvalidName, S3Error
from etl_runtime.core.names import validate_names
from etl_runtime.gateway import buckets as native
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3 import copy, objects, parts, xml
from etl_runtime.gateway.s3.names import FOLDER
from etl_runtime.gateway.s3.sigv4 import Signed

HIDDEN = ".s3-multipart/"
MIN_PART = 5 << 20
MAX_PARTS = 10_000
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")


def is_hidden(key: str) -> bool:
    return key.startswith(HIDDEN) or key == HIDDEN.rstrip("/")


def refuse_hidden(key: str) -> None:
    if is_hidden(key):
        raise InvalidName(f"keys under {HIDDEN!r} are reserved for multipart uploads", object=key)
    if key == FOLDER or key.endswith("/" + FOLDER):
        raise InvalidName(f"{FOLDER!r} is reserved for folder markers", object=key)


async def checked_xml(request: Request, sha256: str | None) -> bytes:
    body = b""
    async for chunk in objects.checked_body(request, sha256, request.headers.get("content-md5")):
        body += chunk
        if len(body) > xml.MAX_XML_BODY:
            raise S3Error("MalformedXML", 400, "the XML body is too large")
    return body


def _no_upload(upload_id: str) -> S3Error:
    return S3Error(
        "NoSuchUpload",
        404,
        f"the upload {upload_id!r} does not exist: it was completed, aborted, or never made",
    )


def _upload_dir(upload_id: str) -> str:
    if not _UPLOAD_ID.fullmatch(upload_id):  # never a path; S3 and MinIO: NoSuchUpload
        shown = upload_id if len(upload_id) <= 64 else upload_id[:64] + "..."
        raise S3Error(
            "NoSuchUpload",
            404,
            f"uploadId {shown!r} is not an upload id (32 hex digits, as CreateMultipartUpload "
            "answers): there is no such upload",
        )
    return f"{HIDDEN}{upload_id}/"


def _part_name(upload_id: str, number: int) -> str:
    return f"{_upload_dir(upload_id)}part-{number:05d}"


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _check_upload(
    gw: Gateway, bucket: str, key: str | None, upload_id: str, done: bool = False
) -> dict[str, Any]:
    """The upload's record (``key``, ``created``, ``meta``; ``completed`` once it is);
    NoSuchUpload if it is not ``key``'s, or is completed and ``done`` is not asked."""
    name = _upload_dir(upload_id) + "upload"
    try:
        raw = b"".join([c async for c in objects.read_parts(gw, [(bucket, name)])])
    except S3Error as e:
        if e.code == "NoSuchKey":
            raise _no_upload(upload_id) from None
        raise
    record: dict[str, Any] = json.loads(raw)
    if key is not None and record.get("key") != key:
        raise _no_upload(upload_id)
    if "completed" in record and not done:
        raise _no_upload(upload_id)
    return record


async def _parts(gw: Gateway, bucket: str, upload_id: str) -> list[dict[str, Any]]:
    """The stored parts, by number: ``{"number", "name", "size", "etag", "mtime"}``."""
    prefix, after, found = _upload_dir(upload_id) + "part-", "", []
    while True:
        page = await native.list_bucket_page(gw, bucket, prefix, after, 1000)
        for o in page["objects"]:
            found.append({**o, "number": int(o["name"].rsplit("-", 1)[1])})
        if page["next"] is None:
            return found
        after = page["next"]


async def create(gw: Gateway, request: Request, bucket: str, key: str) -> Response:
    """CreateMultipartUpload; its ``Content-Type`` and ``x-amz-meta-*`` go to the object."""
    validate_names(bucket, key)
    upload_id = secrets.token_hex(16)
    headers = objects.meta_headers_in(request.headers)
    meta = json.dumps({"key": key, "created": time.time(), "meta": headers}).encode()
    name = _upload_dir(upload_id) + "upload"
    await objects.put_stream(gw, bucket, name, _one(meta), str(len(meta)))
    return Response(xml.initiate_upload(bucket, key, upload_id), media_type="application/xml")


def _part_number(request: Request) -> int:
    raw = request.query_params.get("partNumber", "")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", 400, f"partNumber must be 1..{MAX_PARTS}, got {raw!r}")
    return int(raw)


async def upload_part(
    gw: Gateway, request: Request, bucket: str, key: str, upload_id: str, signed: Signed | None
) -> Response:
    number = _part_number(request)
    await _check_upload(gw, bucket, key, upload_id)
    if "x-amz-copy-source" in request.headers:  # UploadPartCopy
        await request.body()
        source = await copy.open_source(gw, request, ranged=True)
        try:
            name = _part_name(upload_id, number)
            stored = await objects.put_stream(gw, bucket, name, source.body, source.length)
        finally:
            await source.close()
        result = xml.copy_result("CopyPartResult", f'"{stored["etag"]}"', time.time())
        return Response(result, media_type="application/xml")
    body, checked, length = objects.upload_body(request, signed)
    stored = await objects.put_stream(gw, bucket, _part_name(upload_id, number), body, length)
    return Response(headers={"ETag": f'"{stored["etag"]}"', **checked.headers()})


async def complete(
    gw: Gateway, request: Request, bucket: str, key: str, upload_id: str, sha256: str | None
) -> Response:
    root = xml.parse(await checked_xml(request, sha256), "CompleteMultipartUpload")
    record = await _check_upload(gw, bucket, key, upload_id, done=True)
    asked: list[tuple[int, str]] = []
    for p in xml.children(root, "Part"):
        number = (xml.text(p, "PartNumber") or "").strip()
        if not (number.isascii() and number.isdigit()):
            raise S3Error("MalformedXML", 400, f"bad PartNumber {number!r}")
        asked.append((int(number), (xml.text(p, "ETag") or "").strip().strip('"')))
    if "completed" in record:  # a retried Complete (its answer lost?): the same answer
        if [list(p) for p in asked] != record["completed"]["parts"]:
            raise _no_upload(upload_id)
        return _completed(bucket, key, record["completed"]["etag"])
    await objects.check_write(gw, request, bucket, key)
    if not asked:
        raise S3Error("MalformedXML", 400, "CompleteMultipartUpload lists no parts")
    numbers = [n for n, _ in asked]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", 400, "parts must be listed in ascending order, once")
    stored = {p["number"]: p for p in await _parts(gw, bucket, upload_id)}
    for i, (n, etag) in enumerate(asked):
        part = stored.get(n)
        if part is None or part["etag"] != etag:
            raise S3Error("InvalidPart", 400, f"part {n} was not uploaded, or its ETag differs")
        if i < len(asked) - 1 and part["size"] < MIN_PART:
            raise S3Error("EntityTooSmall", 400, f"part {n} is smaller than 5 MiB")
    chosen = [stored[n] for n in numbers]
    length = sum(p["size"] for p in chosen)
    body = objects.read_parts(gw, [(bucket, p["name"]) for p in chosen])
    meta = parts.with_sizes(record.get("meta") or {}, [p["size"] for p in chosen])
    await objects.put_stream(gw, bucket, key, body, str(length), meta)
    md5s = b"".join(bytes.fromhex(p["etag"]) for p in chosen)
    etag = f'"{hashlib.md5(md5s).hexdigest()}-{len(chosen)}"'
    done = {**record, "completed": {"etag": etag, "parts": [list(p) for p in asked]}}
    raw = json.dumps(done).encode()  # kept until the sweep: a retried Complete is answered
    await objects.put_stream(
        gw, bucket, _upload_dir(upload_id) + "upload", _one(raw), str(len(raw))
    )
    await _remove(gw, bucket, upload_id, list(stored.values()), record=False)
    return _completed(bucket, key, etag)


def _completed(bucket: str, key: str, etag: str) -> Response:
    body_xml = xml.complete_upload(f"/{bucket}/{key}", bucket, key, etag)
    return Response(body_xml, media_type="application/xml")


async def _remove(
    gw: Gateway, bucket: str, upload_id: str, parts: list[dict[str, Any]], record: bool = True
) -> None:
    names = [p["name"] for p in parts] + ([_upload_dir(upload_id) + "upload"] if record else [])
    limit = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with limit:
            await objects.delete(gw, bucket, name)

    await asyncio.gather(*(one(n) for n in names))


async def abort(gw: Gateway, bucket: str, key: str, upload_id: str) -> Response:
    await _check_upload(gw, bucket, key, upload_id)
    await _remove(gw, bucket, upload_id, await _parts(gw, bucket, upload_id))
    return Response(status_code=204)


async def list_parts(gw: Gateway, bucket: str, key: str, upload_id: str) -> Response:
    await _check_upload(gw, bucket, key, upload_id)
    parts = await _parts(gw, bucket, upload_id)
    return Response(xml.list_parts(bucket, key, upload_id, parts), media_type="application/xml")


async def list_uploads(gw: Gateway, bucket: str, params: dict[str, str]) -> Response:
    """ListMultipartUploads: the uploads in progress (their ``upload`` records), by key and
    upload ID; ``prefix``, ``key-marker``/``upload-id-marker``, ``max-uploads``."""
    raw = params.get("max-uploads", "1000")
    if not (raw.isascii() and raw.isdigit()):
        raise S3Error("InvalidArgument", 400, f"max-uploads must be an integer, got {raw!r}")
    limit = min(int(raw), 1000)
    params["max-uploads"] = str(limit)
    prefix = params.get("prefix", "")
    marker = (params.get("key-marker", ""), params.get("upload-id-marker", ""))
    found: list[tuple[str, str, float]] = []
    after = ""
    while True:
        page = await native.list_bucket_page(gw, bucket, HIDDEN, after, 1000)
        for o in page["objects"]:
            name = o["name"]
            if not name.endswith("/upload"):
                continue
            upload_id = name[len(HIDDEN) :].split("/", 1)[0]
            try:
                record = await _check_upload(gw, bucket, None, upload_id)
            except S3Error:  # completed or aborted meanwhile
                continue
            key = str(record.get("key", ""))
            if key.startswith(prefix) and (key, upload_id) > marker:
                found.append((key, upload_id, float(record.get("created", 0.0))))
        if page["next"] is None:
            break
        after = page["next"]
    found.sort()
    body = xml.list_uploads(bucket, params, found[:limit], len(found) > limit)
    return Response(body, media_type="application/xml")


async def dispatch(
    gw: Gateway, request: Request, bucket: str, key: str, signed: Signed | None
) -> Response:
    """The call a request with ``?uploads`` or ``?uploadId=`` is."""
    method, q = request.method, request.query_params
    sha256 = signed.body_sha256 if signed is not None else None
    if "uploads" in q and method == "POST":
        return await create(gw, request, bucket, key)
    upload_id = q.get("uploadId", "")
    if method == "PUT":
        return await upload_part(gw, request, bucket, key, upload_id, signed)
    if method == "POST":
        return await complete(gw, request, bucket, key, upload_id, sha256)
    if method == "DELETE":
        return await abort(gw, bucket, key, upload_id)
    if method == "GET":
        return await list_parts(gw, bucket, key, upload_id)
    raise S3Error("NotImplemented", 501, f"{method} on a multipart upload is not supported")
