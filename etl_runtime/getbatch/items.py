"""One GetBatch item: fetched from the target that owns it, as a GET through the gateway goes.

A ``Slot`` is one item in flight. Its task asks its host's ``read_owner`` for the
target a GET of the object would be redirected to, sends that target the same
GET (with ``etl_name``/``etl_args``/``etl_pipeline`` when the item has an
ETL, the batch's or its view's: the object is transformed on its own target,
and a 307 from the target to its transformer is followed), and then:

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
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

import anyio.to_thread

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import (
    DuplexError,
    NoTargets,
    NotATar,
    ObjectNotFound,
    RangeNotSatisfiable,
    SluiceError,
    UnsafeShard,
)
from etl_runtime.getbatch.archive import ShardReader
from etl_runtime.getbatch.host import BatchHost
from etl_runtime.getbatch.request import BatchRequest, Item
from etl_runtime.wire.clients.duplex import DuplexClient, DuplexResponse

log = logging.getLogger(__name__)

ITEM_BUFFER = 1 << 20  # bytes read ahead per item in flight (plus one piece of <= 1 MiB)
SPOOL_MEMORY = 1 << 20  # an answer of unknown length: this much in memory, the rest on disk
SPOOL_WRITE = 1 << 20
ERROR_BODY_MAX = 64 << 10
ITEM_TIMEOUT = 120.0  # seconds without progress on one item's answer
MAX_REDIRECTS = 3  # an ETL GET: the target's 307 to its transformer
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
        self._mem: list[bytes | bytearray | memoryview] = []
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_size = 0
        self._file: IO[bytes] | None = None
        self.size = 0

    async def write(self, data: bytes | bytearray | memoryview) -> None:
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

    async def chunks(self) -> AsyncIterator[bytes | bytearray | memoryview]:
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
    if (etl := payload.get("etl")) and str(etl) not in message:
        message += f" (ETL {etl!r})"
    kind = str(payload.get("kind") or "InternalError")
    if status == 503 and not retry_after:  # a share's manifest carries no headers
        retry_after = "2"
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
    in_shard = bool(payload.get("in_shard"))  # the shard is there, not the file in it
    shard_missing = bool(item.archpath) and status == 404 and not in_shard
    return Failed(err, per_item, shard_missing=shard_missing)


class Slot:
    """One item in flight: ``head`` (size or ``Failed``), then its bytes from ``next()``."""

    def __init__(self, gw: BatchHost, http: DuplexClient, req: BatchRequest, item: Item) -> None:
        self.item = item
        self.head: asyncio.Future[int | Failed] = asyncio.get_running_loop().create_future()
        self.broken: SluiceError | None = None  # after head: the stream broke off
        self._chunks: deque[bytes | bytearray | memoryview] = deque()
        self._buffered = 0
        self._ended = False
        self._data = asyncio.Event()  # a chunk or the end arrived
        self._room = asyncio.Event()  # the reader took a chunk
        self._gw, self._http, self._req = gw, http, req
        self.task = asyncio.create_task(self._run())

    def ready(self) -> bool:
        """``next()`` will not wait."""
        return bool(self._chunks) or self._ended

    async def next(self) -> bytes | bytearray | memoryview | None:
        """The next chunk; None at the end (then check ``broken``)."""
        while not self._chunks:
            if self._ended:
                return None
            self._data.clear()
            await self._data.wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        self._room.set()
        return chunk

    async def _put(self, chunk: bytes | bytearray | memoryview) -> None:
        while self._buffered >= ITEM_BUFFER:  # the assembler is behind: stop reading
            self._room.clear()
            await self._room.wait()
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self._data.set()

    def _end(self) -> None:
        self._ended = True
        self._data.set()

    def cancel(self) -> None:
        self.task.cancel()

    async def _run(self) -> None:
        try:
            await self._fetch()
        except asyncio.CancelledError:
            raise
        except SluiceError as e:
            self._fail(Failed(e, per_item=False))
        except (DuplexError, OSError) as e:
            err = NoTargets(
                f"in[{self.item.index}] {self.item.cname()}: its target did not answer "
                f"({type(e).__name__}: {e}); retry",
                bucket=self.item.bucket,
                object=self.item.name,
            )
            self._fail(Failed(err, per_item=False))
        except Exception as e:  # a bug: end the batch, never a silent hole
            log.exception("GetBatch item %s failed", self.item.cname())
            self._fail(Failed(SluiceError(f"internal error: {e!r}"), per_item=False))

    def _fail(self, failed: Failed) -> None:
        if not self.head.done():
            self.head.set_result(failed)
        else:
            self.broken = failed.error
            self._end()

    async def _start(
        self, size: int, chunks: AsyncIterator[bytes | bytearray | memoryview]
    ) -> None:
        self.head.set_result(size)
        async for chunk in chunks:
            if chunk:
                await self._put(chunk)
        self._end()

    async def _send(self) -> DuplexResponse:
        """The item's GET to its owner (and on to the transformer, for an ETL)."""
        item, gw = self.item, self._gw
        bucket = item.read_bucket  # a view's source
        target = gw.read_owner(bucket, item.name)  # 404 bucket, 503 owner away
        params: dict[str, str] = {}
        if item.read_provider:
            params["provider"] = item.read_provider
        if item.etl:
            params["etl_name"] = item.etl[0]
            if len(item.etl) > 1:
                params["etl_pipeline"] = ",".join(item.etl[1:])
            if item.etl_args is not None:
                params["etl_args"] = item.etl_args
        headers = gw.target_headers()
        if item.ranged and not item.archpath:
            end = "" if item.length == -1 else str(item.start + item.length - 1)
            headers["Range"] = f"bytes={item.start}-{end}"
        url = object_url(target.url, bucket, item.name)
        response = await self._http.request(
            "GET", url, params=params, headers=headers, timeout=ITEM_TIMEOUT
        )
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("location")
            if response.status_code != 307 or not location:
                break
            await response.read(ERROR_BODY_MAX)  # empty: keeps the connection
            # signed for this object alone: no Authorization to the transformer
            response = await self._http.request("GET", location, timeout=ITEM_TIMEOUT)
        return response

    async def _fetch(self) -> None:
        item = self.item
        response = await self._send()
        try:
            if response.status_code not in (200, 206):
                self._fail(await _error_of(response, item))
                return
            body = response.aiter_bytes()
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

    async def _from_shard(self, body: AsyncIterator[bytes | bytearray]) -> None:
        """The file ``archpath`` out of the shard, read whole before its entry starts:
        a broken shard (cut short, garbage, a bad header; ``ShardReader``) is then
        this item's error naming the shard, never an entry broken off."""
        item = self.item
        shard = f"{item.provider or 'ais'}://{item.bucket}/{item.name}"
        reader = ShardReader(body, shard)
        spool = Spool()
        try:
            size = await reader.find(item.archpath)
            if size is None:
                err: SluiceError = ObjectNotFound(
                    f"in[{item.index}] {item.cname()}: file {item.archpath!r} is not in shard "
                    f"{shard}",
                    bucket=item.bucket,
                    object=item.name,
                )
                spool.close()
                self._fail(Failed(err, per_item=True))
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
                    spool.close()
                    self._fail(Failed(err, per_item=False))
                    return
                start = item.start
                n = size - start if item.length == -1 else min(item.length, size - start)
            async for chunk in reader.member(n, start):
                await spool.write(chunk)
        except (NotATar, UnsafeShard) as e:
            spool.close()
            e.context.setdefault("bucket", item.bucket)
            e.context.setdefault("object", item.name)
            e.message = f"in[{item.index}] {item.cname()}: {e.message}"
            self._fail(Failed(e, per_item=True))
            return
        except BaseException:
            spool.close()
            raise
        await self._start(n, spool.chunks())


async def _error_of(response: DuplexResponse, item: Item) -> Failed:
    raw = bytes(await response.read(ERROR_BODY_MAX))
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        text = raw[:500].decode("utf-8", "replace")
        payload = {"error": f"answered {response.status_code}: {text}"}
    return relayed(response.status_code, payload, item, response.headers.get("retry-after"))
