"""CopyObject and UploadPartCopy: a PUT whose bytes come from another object.

``x-amz-copy-source: [/]BUCKET/KEY`` (URL-encoded) names the source, in this
bucket or another, or in an ETL view: then the copy holds the view's
transformed bytes. The source is read from its owner and streamed into the
destination's owner as a normal PUT (one chunk in memory at a time).

* ``x-amz-metadata-directive``: ``COPY`` (the default: the source's content
  type, ``x-amz-meta-*`` and kept headers) or ``REPLACE`` (the request's). A
  copy of an object onto itself must ``REPLACE``, as S3 wants.
* ``x-amz-copy-source-if-match`` / ``-if-none-match`` /
  ``-if-modified-since`` / ``-if-unmodified-since``: checked against the
  source's ETag and Last-Modified (a view's: its own ETag) as S3 combines
  them; a failed one is 412 ``PreconditionFailed`` and nothing is written.
* UploadPartCopy: ``x-amz-copy-source-range: bytes=FIRST-LAST`` (inclusive).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote, urlencode

import httpx
from fastapi import Request

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import NoTargets, S3Error
from etl_runtime.core.names import validate_names
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route
from etl_runtime.gateway.s3 import objects
from etl_runtime.gateway.s3.errors import from_target
from etl_runtime.gateway.s3.names import stored

_RANGE = re.compile(r"^bytes=(\d+)-(\d+)$")
RANGED_MAX = 256 << 20  # bytes of a view's output a ranged copy may hold


@dataclass
class Source:
    """An opened copy source: its bytes (streamed), length if known, and metadata."""

    bucket: str
    key: str
    body: AsyncIterator[bytes]
    length: str | None
    meta: dict[str, str] = field(default_factory=dict)
    answer: httpx.Response | None = None

    async def close(self) -> None:
        if self.answer is not None:
            await self.answer.aclose()


def parse_source(request: Request) -> tuple[str, str]:
    """``[/]BUCKET/KEY[?versionId=null]``: a ``?`` in the key itself comes encoded (``%3F``)."""
    header = request.headers["x-amz-copy-source"]
    path, _, version = header.partition("?")
    raw = unquote(path).lstrip("/")
    if version:
        name, _, value = version.partition("=")
        if name != "versionId":
            raise S3Error(
                "InvalidArgument", 400, f"x-amz-copy-source: unknown {name!r} in {header!r}"
            )
        if unquote(value) != "null":  # a bucket without versioning has one version: null
            raise S3Error(
                "NoSuchVersion", 404, f"x-amz-copy-source: no version {value!r} of {raw!r}"
            )
    bucket, _, key = raw.partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", 400, f"x-amz-copy-source must be BUCKET/KEY, got {raw!r}")
    key = stored(key)
    validate_names(bucket, key)
    return bucket, key


def _http_time(value: str, name: str) -> float:
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        raise S3Error("InvalidArgument", 400, f"{name}: not an HTTP date: {value!r}") from None


def _matches(condition: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/").strip('"') for t in condition.split(",")]
    return "*" in tags or etag.strip('"') in tags


def check_conditions(request: Request, etag: str, last_modified: str) -> None:
    """S3's copy conditions: if-match wins over if-unmodified-since, if-none-match over
    if-modified-since; any other failure is 412."""
    h, prefix = request.headers, "x-amz-copy-source-if-"
    mtime = _http_time(last_modified, "Last-Modified") if last_modified else 0.0

    def failed(what: str) -> S3Error:
        return S3Error("PreconditionFailed", 412, f"{prefix}{what} does not hold for the source")

    if (im := h.get(prefix + "match")) is not None:
        if not _matches(im, etag):
            raise failed("match")
    elif (ius := h.get(prefix + "unmodified-since")) is not None:
        if mtime > _http_time(ius, prefix + "unmodified-since"):
            raise failed("unmodified-since")
    if (inm := h.get(prefix + "none-match")) is not None:
        if _matches(inm, etag):
            raise failed("none-match")
    elif (ims := h.get(prefix + "modified-since")) is not None:
        if mtime <= _http_time(ims, prefix + "modified-since"):
            raise failed("modified-since")


def _span(request: Request) -> tuple[int, int] | None:
    raw = request.headers.get("x-amz-copy-source-range")
    if raw is None:
        return None
    m = _RANGE.match(raw.strip())
    if m is None or int(m.group(1)) > int(m.group(2)):
        raise S3Error(
            "InvalidArgument", 400, f"x-amz-copy-source-range must be bytes=FIRST-LAST: {raw!r}"
        )
    return int(m.group(1)), int(m.group(2))


def _unreachable(bucket: str, key: str, e: Exception) -> NoTargets:
    return NoTargets(
        f"the owner of {bucket}/{key} (copy source) did not answer ({type(e).__name__}); retry",
        bucket=bucket,
        object=key,
    )


async def open_source(gw: Gateway, request: Request, ranged: bool = False) -> Source:
    """The copy source, opened after its conditions held; the caller closes it."""
    bucket, key = parse_source(request)
    span = _span(request) if ranged else None
    view = views.view_of(gw, bucket)
    if view is not None:
        return await _open_view(gw, request, bucket, key, view, span)
    owner = route(gw, "HEAD", bucket, key).url
    try:
        head = await gw.http.head(object_url(owner, bucket, key), headers=gw.target_headers())
    except httpx.HTTPError as e:
        raise _unreachable(bucket, key, e) from None
    if head.status_code >= 400:
        raise from_target(head, b"")
    check_conditions(request, head.headers.get("etag", ""), head.headers.get("last-modified", ""))
    headers = gw.target_headers()
    if span is not None:
        size = int(head.headers.get("content-length", "0"))
        if span[1] >= size:
            raise S3Error(
                "InvalidRange", 416, f"x-amz-copy-source-range is past the end of {bucket}/{key}"
            )
        headers["range"] = f"bytes={span[0]}-{span[1]}"
    url = objects.owner_url(gw, "GET", bucket, key)
    try:
        r = await gw.http.send(gw.http.build_request("GET", url, headers=headers), stream=True)
    except httpx.HTTPError as e:
        raise _unreachable(bucket, key, e) from None
    if r.status_code >= 400:
        body = await r.aread()
        await r.aclose()
        raise from_target(r, body)
    meta = {k: v for k, v in r.headers.items() if k.startswith(objects.NATIVE_META)}
    if "content-type" in r.headers:
        meta["content-type"] = r.headers["content-type"]
    length = r.headers.get("content-length")
    return Source(bucket, key, r.aiter_raw(), length, meta, r)


async def _whole(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _open_view(
    gw: Gateway,
    request: Request,
    bucket: str,
    key: str,
    view: dict[str, Any],
    span: tuple[int, int] | None,
) -> Source:
    head = await views.source_head(gw, bucket, view, key)
    etag = views.view_etag(head.headers.get("etag", ""), view)
    check_conditions(request, etag, head.headers.get("last-modified", ""))
    src = views.check_source(gw, bucket, view)
    extra = [("etl_name", str(view["etl"]))]
    if view.get("args"):
        extra.append(("etl_args", str(view["args"])))
    url = object_url(route(gw, "GET", src, key).url, src, key) + "?" + urlencode(extra)
    try:
        r = await views.follow(gw, "GET", url)
    except httpx.HTTPError as e:
        raise _unreachable(bucket, key, e) from None
    if r.status_code >= 400:
        body = await r.aread()
        await r.aclose()
        raise from_target(r, body)
    if span is None:
        return Source(bucket, key, r.aiter_raw(), r.headers.get("content-length"), {}, r)
    data = bytearray()
    try:
        async for chunk in r.aiter_raw():
            data += chunk
            if len(data) > RANGED_MAX:
                raise S3Error(
                    "InvalidRange", 416, f"a ranged copy of view {bucket}/{key} is over 256 MiB"
                )
    finally:
        await r.aclose()
    if span[1] >= len(data):
        raise S3Error("InvalidRange", 416, f"x-amz-copy-source-range is past the end of {key}")
    piece = bytes(data[span[0] : span[1] + 1])
    return Source(bucket, key, _whole(piece), str(len(piece)))


async def copy_object(gw: Gateway, request: Request, bucket: str, key: str) -> dict[str, Any]:
    """CopyObject into ``bucket/key``: the owner's answer to the PUT (``etag``...)."""
    directive = request.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error(
            "InvalidArgument", 400, f"x-amz-metadata-directive must be COPY or REPLACE: {directive}"
        )
    if parse_source(request) == (bucket, key) and directive == "COPY":
        raise S3Error(
            "InvalidRequest",
            400,
            f"copying {bucket}/{key} onto itself without changing its metadata: "
            "use x-amz-metadata-directive: REPLACE",
        )
    await request.body()  # a copy has no body of its own
    await objects.check_write(gw, request, bucket, key)
    source = await open_source(gw, request)
    try:
        meta = source.meta if directive == "COPY" else objects.meta_headers_in(request.headers)
        return await objects.put_stream(gw, bucket, key, source.body, source.length, meta)
    finally:
        await source.close()
