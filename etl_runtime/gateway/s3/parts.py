"""GetObject and HeadObject by ``partNumber``: one part of a multipart object, as S3 answers.

CompleteMultipartUpload stores the parts' sizes with the object (the metadata key
``~parts``, run-length: ``5242880*3,1000``; not shown as a header); part N is
then the byte range those sizes give, answered 206 with its ``Content-Range``
and ``x-amz-mp-parts-count``, as S3 and MinIO answer it. An object written
whole (or whose sizes did not fit beside its user metadata, at most 2 KiB in
all) is one part: part 1 is all of it, any other 416 ``InvalidPartNumber``.
``partNumber`` beside ``Range`` is 400 ``InvalidRequest``; the conditional
headers apply as on any GET.
"""

from __future__ import annotations

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from etl_runtime.core.errors import NoTargets, S3Error
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3 import objects
from etl_runtime.gateway.s3.errors import from_target
from etl_runtime.storage.meta import META_MAX

MAX_PARTS = 10000
KEY = objects.PARTS  # the stored metadata key
HEADER = objects.NATIVE_META + KEY  # as the target answers it


def encode(sizes: list[int]) -> str:
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ",".join(f"{s}*{n}" if n > 1 else str(s) for s, n in runs)


def decode(raw: str | None) -> list[int] | None:
    """The sizes ``encode`` wrote; None for none or a malformed value."""
    if not raw:
        return None
    sizes: list[int] = []
    for run in raw.split(","):
        size, _, count = run.partition("*")
        if (
            not (size.isascii() and size.isdigit())
            or not (count or "1").isascii()
            or not (count or "1").isdigit()
        ):
            return None
        sizes += [int(size)] * int(count or "1")
        if len(sizes) > MAX_PARTS:
            return None
    return sizes or None


def with_sizes(meta: dict[str, str], sizes: list[int]) -> dict[str, str]:
    """A completed upload's metadata (native headers) with its parts' sizes, where they fit
    within ``META_MAX`` beside the user's; a single part needs none."""
    if len(sizes) < 2:
        return meta
    value = encode(sizes)
    used = sum(
        len(k) - len(objects.NATIVE_META) + len(v)
        for k, v in meta.items()
        if k.startswith(objects.NATIVE_META)
    )
    if used + len(KEY) + len(value) > META_MAX:
        return meta
    return {**meta, HEADER: value}


def _number(request: Request) -> int:
    raw = request.query_params.get("partNumber", "")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", 400, f"partNumber must be 1..{MAX_PARTS}, got {raw!r}")
    if "range" in request.headers:
        raise S3Error(
            "InvalidRequest", 400, "Cannot specify both Range header and partNumber query parameter"
        )
    return int(raw)


async def get(gw: Gateway, request: Request, bucket: str, key: str, head: bool) -> Response:
    """GetObject / HeadObject with ``?partNumber=N``."""
    n = _number(request)
    what = f"{bucket}/{key}"
    url = objects.owner_url(gw, "GET", bucket, key)
    headers = objects._owner_headers(gw, request)
    try:
        r = await gw.http.head(url, headers=headers)
    except httpx.HTTPError as e:
        raise objects._unreachable(what, e) from None
    if r.status_code >= 400:
        raise from_target(r, b"")
    kept = objects._kept(r.headers)
    if r.status_code == 304:
        objects._not_modified(kept)
        return Response(status_code=304, headers=kept)
    size = int(r.headers.get("content-length", "0"))
    stored = decode(r.headers.get(HEADER))
    sizes = stored if stored is not None and sum(stored) == size else [size]
    if n > len(sizes):
        raise S3Error("InvalidPartNumber", 416, f"{what} has {len(sizes)} part(s), not a part {n}")
    start = sum(sizes[: n - 1])
    length = sizes[n - 1]
    if len(sizes) > 1:
        kept["x-amz-mp-parts-count"] = str(len(sizes))
    if length == 0:  # an empty object: its one part is empty
        kept["content-length"] = "0"
        return Response(b"", 200, headers=kept, media_type=kept["content-type"])
    kept["content-range"] = f"bytes {start}-{start + length - 1}/{size}"
    kept["content-length"] = str(length)
    if head:
        return Response(status_code=206, headers=kept, media_type=kept["content-type"])
    ranged = {**headers, "range": f"bytes={start}-{start + length - 1}"}
    try:
        answer = await gw.http.send(gw.http.build_request("GET", url, headers=ranged), stream=True)
    except httpx.HTTPError as e:
        raise objects._unreachable(what, e) from None
    if answer.status_code != 206:  # changed since the HEAD (or a condition now fails)
        body = await answer.aread()
        await answer.aclose()
        if answer.status_code >= 400:
            raise from_target(answer, body)
        raise NoTargets(f"{what} changed while its part was read; retry", object=what)
    answered = {**kept, **objects._kept(answer.headers)}
    if len(sizes) > 1:
        answered["x-amz-mp-parts-count"] = str(len(sizes))
    return StreamingResponse(
        answer.aiter_raw(),
        206,
        headers=answered,
        media_type=kept["content-type"],
        background=BackgroundTask(answer.aclose),
    )
