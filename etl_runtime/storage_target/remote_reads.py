"""The target's data path for remote buckets: the hooks ``storage_target/objects.py`` calls.

Each hook returns ``None`` when the ordinary store path should serve the call
(an ``ais`` bucket, or a remote object that is cached and valid), so a warm
GET of a remote object costs what a GET of a native one does.
"""

from __future__ import annotations

import email.utils
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from etl_runtime.core import providers
from etl_runtime.core.errors import InvalidRequest, ObjectNotFound
from etl_runtime.etl.forward import EtlForwarder
from etl_runtime.providers.cache import Fill, RemoteCache
from etl_runtime.storage.store import BeforePublish
from etl_runtime.wire.http.zerocopy import EXTENSION, offers_zerocopy

# A cold GET with one of these waits for the whole object, then is served from
# the cache by the ordinary path (ranges and validators need the stored file).
WHOLE_FIRST = ("range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since")


async def _as_bytes(chunks: AsyncIterator[bytes | memoryview]) -> AsyncIterator[bytes]:
    """The transformer client takes ``bytes`` chunks (one copy per MiB)."""
    async for chunk in chunks:
        yield chunk if isinstance(chunk, bytes) else bytes(chunk)


def _headers(size: int, etag: str, last_modified: float) -> dict[str, str]:
    return {
        "Content-Length": str(size),
        "ETag": f'"{etag}"',
        "Last-Modified": email.utils.formatdate(last_modified, usegmt=True),
        "Accept-Ranges": "bytes",
        "X-Sluice-Cache": "miss",
    }


async def get(
    cache: RemoteCache | None,
    forwarder: EtlForwarder,
    request: Request,
    bucket: str,
    name: str,
    etl_name: str | None,
    etl_args: str | None,
) -> Response | None:
    """A cold GET of a remote object (plain or ``etl_name``); None if the store serves it."""
    props = cache.props(bucket) if cache is not None else None
    if cache is None or props is None:
        return None
    if await cache.ensure_fresh(bucket, name, props):
        return None
    fqn = False
    if etl_name:  # refuse an unknown or unready ETL before fetching anything
        record = forwarder.record(etl_name)
        forwarder.transformer(record)
        fqn = record.spec.arg_type == "fqn"
    fill = cache.fill(bucket, name, props)
    await fill.ready.wait()
    if fill.check:  # the first bytes first: an object of one chunk that fails its MD5 is a 502
        await fill.wait_beyond(0)
    if fill.error is not None:
        raise fill.error
    # A chain, files in a shard (archpath), a wds answer that skips samples: the cached file.
    q = request.query_params
    pipeline = any(p in q for p in ("etl_pipeline", "archpath", "archregx", "etl_skip"))
    if fqn or pipeline or (not etl_name and any(h in request.headers for h in WHOLE_FIRST)):
        await cache.wait_filled(fill)
        return None
    if etl_name:
        source = _as_bytes(cache.reader(fill))
        return await forwarder.transform(bucket, name, etl_name, etl_args, source=source)

    meta = fill.meta
    assert meta is not None
    headers = _headers(meta.size, meta.etag, meta.last_modified)
    if offers_zerocopy(request.scope):
        src = cache.open_fill(fill)
        if src is None:  # published meanwhile: a warm GET
            return None
        return FillResponse(fill, src, headers)
    return StreamingResponse(
        cache.reader(fill), headers=headers, media_type="application/octet-stream"
    )


class FillResponse(Response):
    """A cold GET's answer sent by ``sendfile`` from the fill's temp file as it grows.

    Each time the fill wrote more, the new bytes go from the page cache to the
    socket (``http.response.zerocopysend`` with ``more_body``): no Python
    buffer holds them and no copy is made on the way, as for a warm GET. A fill
    that breaks ends the answer short (the connection is closed).
    """

    def __init__(self, fill: Fill, src: Any, headers: dict[str, str]) -> None:
        super().__init__(None, 200, headers, "application/octet-stream")
        self.fill, self.src = fill, src

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fill, offset = self.fill, 0
        assert fill.meta is not None
        size = fill.meta.size
        with self.src:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            while offset < size:
                await fill.wait_beyond(offset)
                if fill.error is not None:
                    raise fill.error
                end = min(fill.written, size)
                if end > offset:
                    await send(
                        {
                            "type": EXTENSION,
                            "file": self.src,
                            "offset": offset,
                            "count": end - offset,
                            "more_body": True,
                        }
                    )
                    offset = end
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def head(cache: RemoteCache | None, bucket: str, name: str) -> Response | None:
    """HEAD of a remote object that is not cached: the backend's answer."""
    props = cache.props(bucket) if cache is not None else None
    if cache is None or props is None or cache.is_cached(bucket, name):
        return None
    backend = cache.backend(bucket, props)
    meta = await backend.head(name)
    if meta is None:
        raise ObjectNotFound(
            f"object {backend.uri(name)} does not exist on backend {backend.where}",
            bucket=bucket,
            object=name,
            backend=backend.where,
        )
    return Response(
        headers=_headers(meta.size, meta.etag, meta.last_modified),
        media_type="application/octet-stream",
    )


def write_through(
    cache: RemoteCache | None, bucket: str, name: str, copies: BeforePublish | None
) -> BeforePublish | None:
    """The PUT's hook before publishing: upload to the backend, then the copies (if any)."""
    props = cache.props(bucket) if cache is not None else None
    if cache is None or props is None:
        return copies
    upload = cache.write_through(bucket, name, props)
    if copies is None:
        return upload

    async def both(tmp: Path, etag: str, size: int) -> None:
        await upload(tmp, etag, size)
        await copies(tmp, etag, size)

    return both


async def delete(cache: RemoteCache | None, bucket: str, name: str) -> dict[str, Any] | None:
    props = cache.props(bucket) if cache is not None else None
    if cache is None or props is None:
        return None
    await cache.delete(bucket, name, props)
    return {"bucket": bucket, "object": name, "deleted": True}


def refuse_without_map(cache: RemoteCache | None, request: Request, bucket: str) -> None:
    if providers.is_remote(request.query_params.get("provider")) and cache is None:
        raise InvalidRequest(
            "remote buckets need a cluster map: run targets with --cluster-map",
            bucket=bucket,
        )
