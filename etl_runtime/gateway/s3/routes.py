"""The S3 API's routes: path-style, under ``/s3`` (``http://GATEWAY/s3/BUCKET/KEY``).

boto3 keeps the path of its ``endpoint_url`` (``endpoint_url=GATEWAY/s3``
sends ``GET /s3/b/k``, and ``ListBuckets`` as ``GET /s3``), and a SigV4
signature covers that whole path, prefix included.

Which call a request is, as S3 decides it: the method, whether a key is in
the path, and the query's sub-resource (``?uploads``, ``?uploadId=``,
``?delete``, ``?location``, ``list-type=2``). Sub-resources Sluice has no
counterpart for (ACLs, policies, versioning, tagging, ...) answer 501
``NotImplemented``. Who may call: ``auth.authorize`` (a ``read`` or ``write``
key, or no signature where reads are open).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request
from fastapi.responses import Response

from etl_runtime.cluster.clustermap import BucketProps
from etl_runtime.core.errors import BucketNotFound, S3Error, bucket_not_found
from etl_runtime.core.names import validate_bucket
from etl_runtime.gateway import buckets as native
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway, unreachable
from etl_runtime.gateway.s3 import copy, multipart, objects, overrides, parts, xml
from etl_runtime.gateway.s3 import early as s3_early
from etl_runtime.gateway.s3 import views as s3_views
from etl_runtime.gateway.s3.auth import authorize
from etl_runtime.gateway.s3.errors import S3Route, answered
from etl_runtime.gateway.s3.keys import KeyStore
from etl_runtime.gateway.s3.names import check_s3_bucket
from etl_runtime.gateway.s3.names import shown as shown_name
from etl_runtime.gateway.s3.names import stored as stored_name
from etl_runtime.getbatch.exchange import ShareBody
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.fastpath import FastRouter
from etl_runtime.wire.http.routes import each_method

XML = "application/xml"
S3_METHODS = ("GET", "HEAD", "PUT", "DELETE", "POST")
READS = ("GET", "HEAD")
MAX_KEYS = 1000
MAX_BUCKETS = 10000  # ListBuckets' max-buckets, as S3's
DELETE_PARALLEL = 16  # a DeleteObjects' deletes in flight at once (each to its key's owner)
LAST = "\U0010ffff"  # sorts after every character a name can hold: skips a common prefix
UNSUPPORTED = (
    "acl",
    "policy",
    "versioning",
    "versions",
    "tagging",
    "cors",
    "lifecycle",
    "website",
    "replication",
    "encryption",
    "object-lock",
    "notification",
    "logging",
    "accelerate",
    "requestPayment",
    "analytics",
    "metrics",
    "inventory",
    "ownershipControls",
    "publicAccessBlock",
    "retention",
    "legal-hold",
    "torrent",
    "restore",
    "select",
    "attributes",
)


def _xml(body: bytes, status: int = 200) -> Response:
    return Response(body, status, media_type=XML)


_UNSUPPORTED = frozenset(UNSUPPORTED)


def _refuse_unsupported(request: Request, listing: bool = False) -> None:
    """501 for a sub-resource with no counterpart; ``listing``: a bucket GET (``?versions`` ok)."""
    query = request.query_params
    if query and not _UNSUPPORTED.isdisjoint(query.keys()):  # one C pass: on every call
        name = next(
            (n for n in UNSUPPORTED if n in query and not (listing and n == "versions")), ""
        )
        if name:
            raise S3Error("NotImplemented", 501, f"the ?{name} sub-resource is not supported")


def _token(cursor: str) -> str:
    return base64.urlsafe_b64encode(cursor.encode()).decode()


def _cursor(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise S3Error("InvalidArgument", 400, "the continuation token is not valid") from None


def _max_keys(params: dict[str, str]) -> int:
    try:
        max_keys = max(0, min(MAX_KEYS, int(params.get("max-keys", MAX_KEYS))))
    except ValueError:
        raise S3Error("InvalidArgument", 400, "max-keys must be an integer") from None
    params["max-keys"] = str(max_keys)
    return max_keys


async def list_objects(gw: Gateway, bucket: str, params: dict[str, str]) -> bytes:
    """ListObjectsV2 (and V1's ``marker``) over the merged listing of the targets."""
    v1 = params.get("list-type") != "2"
    max_keys = _max_keys(params)
    if v1:
        cursor = params.get("marker", "")
    elif params.get("continuation-token"):
        cursor = _cursor(params["continuation-token"])
    else:
        cursor = params.get("start-after", "")
    listed = await _listing(gw, bucket, params, cursor, max_keys, v1)
    contents, prefixes, truncated, last, cursor = listed
    encode = (lambda s: quote(s, safe="/")) if params.get("encoding-type") == "url" else str
    if v1:
        return xml.list_objects_v1(bucket, params, contents, prefixes, truncated, last, encode)
    token = _token(cursor) if truncated else None
    return xml.list_objects_v2(bucket, params, contents, prefixes, token, encode)


async def list_versions(gw: Gateway, bucket: str, params: dict[str, str]) -> bytes:
    """ListObjectVersions of a bucket without versioning, as S3 answers it for one.

    Each object is its one version: ``VersionId`` ``null``, the latest, no delete
    markers; ``key-marker`` pages as V1's ``marker`` does (a ``version-id-marker``
    of ``null`` is the marker key's one version, already answered).
    """
    marker = params.get("key-marker", "")
    vmark = params.get("version-id-marker")
    if vmark is not None and (not marker or vmark not in ("", "null")):
        detail = "needs a key-marker" if not marker else "names no version here"
        raise S3Error("InvalidArgument", 400, f"version-id-marker {vmark!r} {detail}")
    max_keys = _max_keys(params)
    listed = await _listing(gw, bucket, params, marker, max_keys, True)
    contents, prefixes, truncated, last, _ = listed
    encode = (lambda s: quote(s, safe="/")) if params.get("encoding-type") == "url" else str
    return xml.list_versions(bucket, params, contents, prefixes, truncated, last, encode)


async def _listing(
    gw: Gateway, bucket: str, params: dict[str, str], cursor: str, max_keys: int, v1: bool
) -> tuple[list[dict[str, Any]], list[str], bool, str, str]:
    """One page of a listing: (contents, common prefixes, truncated, last answered, cursor).

    Names under ``multipart.HIDDEN`` (parts of uploads in progress) are never
    shown. With a delimiter, names under one common prefix are skipped in one
    step (the next page starts after ``prefix + U+10FFFF``).
    """
    prefix, delimiter = params.get("prefix", ""), params.get("delimiter", "")
    if v1 and delimiter and cursor.startswith(prefix) and cursor.endswith(delimiter):
        cursor += LAST  # resuming after a common prefix (V1's NextMarker): skip under it
    contents: list[dict[str, Any]] = []
    prefixes: list[str] = []
    truncated = False
    last = ""  # the last key or common prefix answered: V1's NextMarker
    while not truncated and max_keys > 0:
        page = await native.list_bucket_page(gw, bucket, prefix, cursor, MAX_KEYS)
        for o in page["objects"]:
            name = o["name"]
            if name <= cursor:  # under a common prefix skipped below
                continue
            if name.startswith(multipart.HIDDEN):
                cursor = name
                continue
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            item = name[: cut + len(delimiter)] if cut >= 0 else None
            if len(contents) + len(prefixes) == max_keys:
                truncated = True
                break
            if item is not None:
                prefixes.append(item)
                cursor, last = item + LAST, item
            else:
                shown = shown_name(name)
                contents.append(o if shown == name else {**o, "name": shown})
                cursor, last = name, shown
        if page["next"] is None:
            break
    return contents, prefixes, truncated, last, cursor


async def create_bucket(gw: Gateway, bucket: str) -> None:
    if gw.cmap is not None:
        if bucket in gw.cmap.get().buckets:
            raise S3Error("BucketAlreadyOwnedByYou", 409, f"bucket {bucket!r} exists")
        props = BucketProps(copies=1, created=time.time())
        gw.cmap.update(lambda m: m.with_bucket(bucket, props))
        await gw.fanout("POST", f"/v1/buckets/{bucket}", json={"action": "create-bck"})
        return
    created = False
    for t, r in await gw.fanout("POST", f"/v1/buckets/{bucket}", json={"action": "create-bck"}):
        if not isinstance(r, httpx.Response) or r.status_code >= 500:
            raise unreachable(t, r)
        created = created or bool(r.json().get("created"))
    if not created:
        raise S3Error("BucketAlreadyOwnedByYou", 409, f"bucket {bucket!r} exists")


async def delete_bucket(gw: Gateway, bucket: str) -> None:
    """S3's DeleteBucket: only an empty bucket (uploads in progress do not count)."""
    page = await native.list_bucket_page(gw, bucket, "", "", 1)
    if page["objects"] and not page["objects"][0]["name"].startswith(multipart.HIDDEN):
        raise S3Error("BucketNotEmpty", 409, f"bucket {bucket!r} is not empty", bucket=bucket)
    after = await native.list_bucket_page(gw, bucket, "", multipart.HIDDEN + LAST, 1)
    if after["objects"]:
        raise S3Error("BucketNotEmpty", 409, f"bucket {bucket!r} is not empty", bucket=bucket)
    if gw.cmap is not None:
        await native.map_delete_bucket(gw, bucket)
        return
    found = False
    for t, r in await gw.fanout("DELETE", f"/v1/buckets/{bucket}"):
        if not isinstance(r, httpx.Response) or r.status_code >= 500:
            raise unreachable(t, r)
        found = found or r.status_code == 200
    if not found:
        raise bucket_not_found(bucket)


async def bucket_exists(gw: Gateway, bucket: str) -> bool:
    return bucket in await native.all_bucket_names(gw)


async def delete_objects(gw: Gateway, request: Request, bucket: str, sha256: str | None) -> bytes:
    """DeleteObjects: up to 1000 keys, each deleted at its owner (``DELETE_PARALLEL`` at a
    time); per-key errors in the body, in the request's order."""
    root = xml.parse(await multipart.checked_xml(request, sha256), "Delete")
    objs = xml.children(root, "Object")
    keys = [xml.text(o, "Key") or "" for o in objs]
    versions = [xml.text(o, "VersionId") for o in objs]  # a bucket's one version: "null"
    if len(keys) > MAX_KEYS:
        raise S3Error("MalformedXML", 400, f"at most {MAX_KEYS} keys per DeleteObjects")
    if not await bucket_exists(gw, bucket):
        raise bucket_not_found(bucket)
    deleted: list[tuple[str, str | None]] = []
    failed: list[tuple[str, str, str]] = []
    limit = asyncio.Semaphore(DELETE_PARALLEL)

    async def one(key: str, version: str | None) -> tuple[str, str, str] | None:
        try:
            if version not in (None, "null"):
                raise S3Error("NoSuchVersion", 404, f"{key!r} has no version {version!r}")
            multipart.refuse_hidden(key)
            async with limit:
                await objects.delete(gw, bucket, stored_name(key))
            return None
        except S3Error as e:
            return (key, e.code, e.message)
        except BucketNotFound as e:
            return (key, "NoSuchBucket", e.message)
        except Exception as e:  # noqa: BLE001 - reported per key, as S3 does
            return (key, "InternalError", str(e))

    done = await asyncio.gather(*(one(k, v) for k, v in zip(keys, versions, strict=True)))
    for key, version, error in zip(keys, versions, done, strict=True):  # in key order
        if error is None:
            deleted.append((key, version))
        else:
            failed.append(error)
    quiet = (xml.text(root, "Quiet") or "").strip().lower() == "true"
    return xml.delete_result(deleted, failed, quiet)


def s3_router(gw: Gateway, keys: KeyStore, duplex: DuplexClient | None = None) -> FastRouter:
    """The S3 API; ``duplex``: the client of the GET hop to the owner (``objects.get``)."""
    router = FastRouter(route_class=S3Route)

    @router.get("/s3")
    @router.get("/s3/")
    async def list_buckets(request: Request) -> Response:
        await authorize(gw, keys, request, write=False)
        names = sorted(await native.all_bucket_names(gw))
        cmap = gw.cmap.get() if gw.cmap is not None else None
        created = {n: p.created for n, p in cmap.buckets.items()} if cmap else {}
        q = request.query_params
        prefix, region = q.get("prefix", ""), q.get("bucket-region", "us-east-1")
        after = _cursor(q["continuation-token"]) if q.get("continuation-token") else ""
        raw = q.get("max-buckets", str(MAX_BUCKETS))
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_BUCKETS:
            raise S3Error("InvalidArgument", 400, f"max-buckets must be 1..{MAX_BUCKETS}: {raw!r}")
        chosen = [n for n in names if n.startswith(prefix) and n > after and region == "us-east-1"]
        page, more = chosen[: int(raw)], len(chosen) > int(raw)
        token = _token(page[-1]) if more else None
        return _xml(xml.list_buckets(page, created, token, prefix if "prefix" in q else None))

    @each_method(router, "/s3/{bucket}", S3_METHODS)
    @each_method(router, "/s3/{bucket}/", S3_METHODS)
    async def bucket_call(bucket: str, request: Request) -> Response:
        method, q = request.method, request.query_params
        signed = await authorize(gw, keys, request, method in ("PUT", "DELETE", "POST"), bucket)
        _refuse_unsupported(request, listing=method == "GET")
        if method == "PUT":
            check_s3_bucket(bucket)  # S3's rules for a new bucket, each named
        validate_bucket(bucket)
        if method == "HEAD":
            if not await bucket_exists(gw, bucket):
                raise bucket_not_found(bucket)
            return Response(headers={"x-amz-bucket-region": "us-east-1"})
        if method == "GET":
            if "location" in q:
                if not await bucket_exists(gw, bucket):
                    raise bucket_not_found(bucket)
                return _xml(xml.location("us-east-1"))
            if "uploads" in q:
                if not await bucket_exists(gw, bucket):
                    raise bucket_not_found(bucket)
                return await multipart.list_uploads(gw, bucket, dict(q))
            if "versions" in q:
                if not await bucket_exists(gw, bucket):
                    raise bucket_not_found(bucket)
                return _xml(await list_versions(gw, bucket, dict(q)))
            return _xml(await list_objects(gw, bucket, dict(q)))
        if method == "PUT":
            await request.body()  # CreateBucketConfiguration: one region here, ignored
            await create_bucket(gw, bucket)
            return Response(headers={"Location": f"/{bucket}"})
        if method == "DELETE":
            if views.view_of(gw, bucket) is not None:  # a view is empty: it stores nothing
                await native.map_delete_bucket(gw, bucket)
            else:
                await delete_bucket(gw, bucket)
            return Response(status_code=204)
        if "delete" in q and views.view_of(gw, bucket) is not None:
            raise s3_views.refuse_write(bucket, None, "DeleteObjects")
        if "delete" in q:
            sha = signed.body_sha256 if signed else None
            return _xml(await delete_objects(gw, request, bucket, sha))
        raise S3Error("NotImplemented", 501, "this bucket POST is not supported")

    @each_method(router, "/s3/{bucket}/{key:path}", S3_METHODS)
    async def object_call(bucket: str, key: str, request: Request) -> Response:
        early = s3_early.take(gw, request, bucket, key)  # sent before the signature's check
        try:
            return await _object_call(bucket, key, request, early)
        finally:
            if early is not None and not early.taken:
                early.close()

    async def _object_call(
        bucket: str, key: str, request: Request, early: ShareBody | None
    ) -> Response:
        method, q = request.method, request.query_params
        signed = await authorize(gw, keys, request, method in ("PUT", "DELETE", "POST"), bucket)
        _refuse_unsupported(request)
        multipart.refuse_hidden(key)
        key = stored_name(key)
        wanted = overrides.asked(request, signed is not None) if method in READS and q else {}
        if (view := views.view_of(gw, bucket)) is not None:
            if method not in READS or "uploadId" in q or "uploads" in q:
                raise s3_views.refuse_write(bucket, key, method)
            got = await s3_views.get(gw, request, bucket, key, view, head=method == "HEAD")
            return overrides.apply(got, wanted)
        if "uploadId" in q or "uploads" in q:
            return await multipart.dispatch(gw, request, bucket, key, signed)
        if method in READS:
            if "partNumber" in q:
                got = await parts.get(gw, request, bucket, key, method == "HEAD")
            else:
                got = await objects.get(gw, request, bucket, key, method == "HEAD", duplex, early)
            return overrides.apply(got, wanted)
        if method == "PUT" and "x-amz-copy-source" in request.headers:
            stored = await copy.copy_object(gw, request, bucket, key)
            return _xml(xml.copy_result("CopyObjectResult", f'"{stored["etag"]}"', time.time()))
        if method == "PUT":
            return await objects.put(gw, request, bucket, key, signed)
        if method == "DELETE":
            await objects.delete(gw, bucket, key)
            return Response(status_code=204)
        raise S3Error("NotImplemented", 501, "this object POST is not supported")

    # Every object call skips FastAPI's routing (wire/http/fastpath.py): a 16 KiB GetObject
    # spent a third of the gateway's CPU matching routes (docs/benchmarks.md, "S3 API").
    router.fast("/s3/{bucket}/{key:path}", S3_METHODS, wrap=answered)
    return router
