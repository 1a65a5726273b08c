"""One GetBatch item: fetched from the target that owns it, as a GET through the gateway goes.

A ``Slot`` is one item in flight. Its task asks ``placement.route`` for the
target a GET of the object would be redirected to, sends that target the same
GET (with ``etl_name``/``etl_args``/``etl_pipeline`` when the batch has an
ETL: the object is transformed on its own target, and a 307 from the target
to its transformer is followed), and then:

* resolves ``head`` with the item's size once it is known (``Content-Length``;
  the file's size in the shard for an ``archpath``; an answer of unknown length,
  as an ETL may give, is spooled first: memory, then a temporary file) or with
  a ``Failed`` when the item cannot be had;
* feeds the item's bytes into a small bounded queue: when the assembler is
  behind (it writes items strictly in request order) the task stops reading
  and TCP pushes back on the target, so a batch never holds more than its
  window of items times the queue in memory.

Failures are classified once, here: a missing object, shard or file in a
shard (404) and an item the ETL refuses deterministically (422) are
``per_item``: with ``coer`` the batch goes on and writes the item under
``__404__/``; anything else (a bucket or ETL that does not exist, a target
away, a 5xx) ends the batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

import anyio.to_thread
import httpx

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import NoTargets, ObjectNotFound, RangeNotSatisfiable, SluiceError
from etl_runtime.gateway.batch.archive import ShardReader
from etl_runtime.gateway.batch.request import BatchRequest, Item
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route

log = logging.getLogger(__name__)

QUEUE_CHUNKS = 8  # chunks (<= 64 KiB each from httpx) buffered per item in flight
SPOOL_MEMORY = 1 << 20  # an answer of unknown length: this much in memory, the rest on disk
SPOOL_WRITE = 1 << 20
ERROR_BODY_MAX = 64 << 10
ITEM_TIMEOUT = httpx.Timeout(120.0, connect=10.0, pool=120.0)
PER_ITEM_STATUSES = (404, 422)  # what coer goes past (but for the kinds below)
BATCH_KINDS = ("BucketNotFound", "EtlNotFound")  # a 404 of these ends the batch


@dataclass
class Failed:
    error: SluiceError
    per_item: bool  # coer lets the batch go on past it
    shard_missing: bool = False  # the shard of an archpath item, not the file in it


class Spool:
    """Bytes of unknown total length: kept in memory up to a limit, then in a temp file."""

    def __init__(self, memory: int = SPOOL_MEMORY) -> None:
        self._memory = memory
        self._mem: list[bytes] = []
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._file: IO[bytes] | None = None
        self.size = 0

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self._file is None and self.size <= self._memory:
            self._mem.append(data)
            return
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= SPOOL_WRITE:
            await self._flush()

    async def _flush(self) -> None:
        if not self._pending:
            return
        if self._file is None:
            self._file = await anyio.to_thread.run_sync(tempfile.TemporaryFile)
        data = b"".join(self._pending)
        self._pending, self._pending_size = [], 0
        await anyio.to_thread.run_sync(self._file.write, data)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Everything written, once, in order; the file is closed after it."""
        try:
            for chunk in self._mem:
                yield chunk
            self._mem = []
            if self._file is not None:
                await self._flush()
                f = self._file
                await anyio.to_thread.run_sync(f.seek, 0)
                while chunk := await anyio.to_thread.run_sync(f.read, SPOOL_WRITE):
                    yield chunk
            else:
                for chunk in self._pending:
                    yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._mem, self._pending = [], []
        if self._file is not None:
            self._file.close()
            self._file = None


def relayed(status: int, payload: dict[str, Any], item: Item, retry_after: str | None) -> Failed:
    """A target's (or transformer's) error answer for ``item``, as one of ours."""
    message = str(payload.get("error") or payload.get("message") or f"answered {status}")
    kind = str(payload.get("kind") or "InternalError")
    context = {k: payload[k] for k in ("etl", "target", "sample") if payload.get(k)}
    err = SluiceError(
        f"in[{item.index}] {item.cname()}: {message}",
        headers={"Retry-After": retry_after} if retry_after else None,
        bucket=item.bucket,
        object=item.name,
        **context,
    )
    err.status, err.kind = status, kind
    per_item = status in PER_ITEM_STATUSES and kind not in BATCH_KINDS
    return Failed(err, per_item, shard_missing=bool(item.archpath) and status == 404)


class Slot:
    """One item in flight: ``head`` (size or ``Failed``), then its bytes from ``next()``."""

    def __init__(self, gw: Gateway, req: BatchRequest, item: Item) -> None:
        self.item = item
        self.head: asyncio.Future[int | Failed] = asyncio.get_running_loop().create_future()
        self.broken: SluiceError | None = None  # after head: the stream broke off
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_CHUNKS)
        self._gw, self._req = gw, req
        self.task = asyncio.create_task(self._run())

    def ready(self) -> bool:
        """``next()`` will not wait (for the head: ``head.done()``)."""
        return not self._queue.empty()

    async def next(self) -> bytes | None:
        """The next chunk; None at the end (check ``broken``)."""
        return await self._queue.get()

    def cancel(self) -> None:
        self.task.cancel()

    async def _run(self) -> None:
        try:
            await self._fetch()
        except asyncio.CancelledError:
            raise
        except SluiceError as e:
            await self._fail(Failed(e, per_item=False))
        except httpx.HTTPError as e:
            err = NoTargets(
                f"in[{self.item.index}] {self.item.cname()}: its target did not answer "
                f"({type(e).__name__}: {e}); retry",
                bucket=self.item.bucket,
                object=self.item.name,
            )
            await self._fail(Failed(err, per_item=False))
        except Exception as e:  # a bug: end the batch, never a silent hole
            log.exception("GetBatch item %s failed", self.item.cname())
            await self._fail(Failed(SluiceError(f"internal error: {e!r}"), per_item=False))

    async def _fail(self, failed: Failed) -> None:
        if not self.head.done():
            self.head.set_result(failed)
        else:
            self.broken = failed.error
            await self._queue.put(None)

    async def _start(self, size: int, chunks: AsyncIterator[bytes]) -> None:
        self.head.set_result(size)
        async for chunk in chunks:
            if chunk:
                await self._queue.put(chunk)
        await self._queue.put(None)

    def _request(self) -> httpx.Request:
        item, req, gw = self.item, self._req, self._gw
        target = route(gw, "GET", item.bucket, item.name)  # 404 bucket, 503 owner away
        params: dict[str, str] = {}
        if item.provider:
            params["provider"] = item.provider
        if req.etl_name:
            params["etl_name"] = req.etl_name
            if req.etl_pipeline:
                params["etl_pipeline"] = req.etl_pipeline
            if req.etl_args is not None:
                params["etl_args"] = req.etl_args
        headers = gw.target_headers()
        if item.ranged and not item.archpath:
            end = "" if item.length == -1 else str(item.start + item.length - 1)
            headers["Range"] = f"bytes={item.start}-{end}"
        url = object_url(target.url, item.bucket, item.name)
        return gw.http.build_request(
            "GET", url, params=params, headers=headers, timeout=ITEM_TIMEOUT
        )

    async def _fetch(self) -> None:
        item = self.item
        response = await self._gw.http.send(
            self._request(), stream=True, follow_redirects=bool(self._req.etl_name)
        )
        try:
            if response.status_code not in (200, 206):
                await self._fail(await _error_of(response, item))
                return
            body = response.aiter_raw()
            if item.archpath:
                await self._from_shard(body)
                return
            length = response.headers.get("content-length", "")
            if length.isdigit():
                await self._start(int(length), body)
                return
            spool = Spool()
            try:
                async for chunk in body:
                    await spool.write(chunk)
            except BaseException:
                spool.close()
                raise
            await self._start(spool.size, spool.chunks())
        finally:
            await response.aclose()

    async def _from_shard(self, body: AsyncIterator[bytes]) -> None:
        item = self.item
        reader = ShardReader(body, f"{item.provider or 'ais'}://{item.bucket}/{item.name}")
        size = await reader.find(item.archpath)
        err: SluiceError
        if size is None:
            err = ObjectNotFound(
                f"in[{item.index}] {item.cname()}: file {item.archpath!r} is not in shard "
                f"{item.provider or 'ais'}://{item.bucket}/{item.name}",
                bucket=item.bucket,
                object=item.name,
            )
            await self._fail(Failed(err, per_item=True))
            return
        start, n = 0, size
        if item.ranged:
            if item.start > size or (item.start == size and item.length != -1):
                err = RangeNotSatisfiable(
                    f"in[{item.index}] {item.cname()}: start={item.start} is past the end "
                    f"of the file ({size} bytes)",
                    bucket=item.bucket,
                    object=item.name,
                )
                await self._fail(Failed(err, per_item=False))
                return
            start = item.start
            n = size - start if item.length == -1 else min(item.length, size - start)
        await self._start(n, reader.member(n, start))


async def _error_of(response: httpx.Response, item: Item) -> Failed:
    raw = b""
    async for chunk in response.aiter_raw():
        raw += chunk
        if len(raw) > ERROR_BODY_MAX:
            break
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        text = raw[:500].decode("utf-8", "replace")
        payload = {"error": f"answered {response.status_code}: {text}"}
    return relayed(response.status_code, payload, item, response.headers.get("retry-after"))
