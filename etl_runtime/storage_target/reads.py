"""A local object's bytes as a GET answers them, checked against its stored checksum.

``storage/integrity.py`` says what is checked and when. Here: an object that
matched within ``integrity.VERIFIED``'s time and has not changed since is
answered as an unchecked one (``sendfile``). Else one of at most
``LOOP_READ`` is read whole on the loop (``open_if_tagged`` opened it there),
checked and answered from memory; one of at most ``integrity.WHOLE_MAX`` is
checked whole (on the loop while it is in the page cache, else in a thread)
and then sent by ``sendfile`` (read once and answered from memory where the
server offers no zero copy); a bigger one streams through
``CheckedFileResponse``, and a range of one is answered after the whole
object matched. A mismatch found before the first byte is repaired from a
good copy when the bucket keeps copies, then the object is opened again and
served; else ``ObjectCorrupted``. A mismatch found while streaming cuts the
stream and starts the repair for the next read.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import time
from collections.abc import Iterator
from typing import IO

import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from etl_runtime.core.errors import SluiceError
from etl_runtime.storage import integrity
from etl_runtime.storage.ranges import byte_range, preconditions
from etl_runtime.storage.store import READ_CHUNK, ObjectInfo, ObjectStore
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.meta import meta_headers
from etl_runtime.wire.http.zerocopy import FileRangeResponse, offers_zerocopy

log = logging.getLogger(__name__)
WHOLE_GET_MAX = 1 << 20  # without zero-copy: read small objects in one go, stream bigger ones
LOOP_READ = 64 << 10  # a checked object up to this size is read on the event loop
REPAIR_RETRY_AFTER = 2
OCTETS = "application/octet-stream"


def object_headers(info: ObjectInfo) -> dict[str, str]:
    """Validators and size; the MD5 also as the aistore SDK reads it (``Ais-Checksum-*``);
    the content type and user metadata the writer gave (``meta_headers``)."""
    return {
        "Content-Length": str(info.size),
        "ETag": f'"{info.etag}"',
        "Last-Modified": email.utils.formatdate(info.mtime, usegmt=True),
        "Accept-Ranges": "bytes",
        "Ais-Checksum-Type": "md5",
        "Ais-Checksum-Value": info.etag,
        **meta_headers(info.meta),
    }


def _file_iter(f: IO[bytes], remaining: int) -> Iterator[bytes]:
    try:
        while remaining > 0 and (chunk := f.read(min(READ_CHUNK, remaining))):
            remaining -= len(chunk)
            yield chunk
    finally:
        f.close()


def _read_small(f: IO[bytes], start: int, length: int) -> bytes:
    with f:
        f.seek(start)
        return f.read(length)


def _read_whole(f: IO[bytes], size: int) -> bytes:
    with f:
        return os.pread(f.fileno(), size + 1, 0)  # one byte more: a file that grew shows


def not_modified_answer(headers: dict[str, str]) -> Response:
    return Response(
        status_code=304, headers={k: v for k, v in headers.items() if k != "Content-Length"}
    )


async def repair_or_fail(target: Target, bucket: str, name: str, again: bool = False) -> None:
    """After a mismatch found before the first byte: return once a good copy replaced
    the bad one, else raise ``ObjectCorrupted`` (never serve). A remote bucket's cached
    copy is fetched again from its backend instead (``RemoteCache.refetch``), once per
    read (``again``: the copy fetched for this read was bad too)."""
    cache = target.remote
    if cache is not None and (props := cache.props(bucket)) is not None:
        if again:
            raise integrity.corrupted(bucket, name, target.id)
        await cache.refetch(bucket, name, props)
        return
    placement = target.placement
    outcome: bool | None = False
    if placement is not None and placement.keeps_copies(bucket):
        outcome = await placement.repair(bucket, name)
    if outcome is True:
        return
    retry = REPAIR_RETRY_AFTER if outcome is None else None
    raise integrity.corrupted(bucket, name, target.id, retry_after=retry)


def _repair_later(target: Target, bucket: str, name: str) -> integrity.BadRead:
    """The ``BadRead`` of a streamed read: the repair (a remote bucket's: the refetch)
    runs on the loop, for the next read."""
    placement, cache = target.placement, target.remote
    props = cache.props(bucket) if cache is not None else None
    loop = asyncio.get_running_loop()
    if cache is not None and props is not None:

        def refetch() -> None:
            loop.call_soon_threadsafe(
                lambda: asyncio.ensure_future(cache.refetch(bucket, name, props))
            )

        return integrity.BadRead(bucket, name, target.id, refetch)
    if placement is None or not placement.keeps_copies(bucket):
        return integrity.BadRead(bucket, name, target.id)

    def start() -> None:
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(placement.repair(bucket, name)))

    return integrity.BadRead(bucket, name, target.id, start)


async def _matches(fd: int, cs: integrity.Checksum, stamp: integrity.Stamp | None) -> bool:
    """The whole file against ``cs``: on the loop when it is at most ``WHOLE_MAX`` and in
    the page cache (no thread hop, ~0.08 ms a MiB), else in a thread; a match is noted in
    ``integrity.VERIFIED``."""
    started = time.time_ns()
    ok = integrity.matches_cached(fd, cs) if cs.size <= integrity.WHOLE_MAX else None
    if ok is None:
        ok = await anyio.to_thread.run_sync(integrity.file_matches, fd, cs)
    if ok:
        integrity.VERIFIED.note(stamp, cs, started)
    return ok


ADOPT_MAX = 64 << 20  # an older object up to this size gets its checksum before the first byte
_ADOPTING: set[tuple[str, str, str]] = set()


async def _adopted(
    target: Target, f: IO[bytes], info: ObjectInfo, bucket: str, name: str
) -> bool | None:
    """An object written before checksums were stored (``info.checksum`` None): up to
    ``ADOPT_MAX`` hashed now (MD5 against its ETag, ``integrity.adopt``): True, and its
    checksum is stored; False if its MD5 is not its ETag. A bigger one is served as it
    is this once (None) while a thread hashes it beside the read."""
    if info.size <= ADOPT_MAX:
        started = time.time_ns()
        cs = await anyio.to_thread.run_sync(integrity.adopt, f.fileno(), info.etag)
        if cs is not None:
            integrity.VERIFIED.note(info.stamp, cs, started)
        return cs is not None
    key = (target.id or "", bucket, name)
    if key not in _ADOPTING:
        _ADOPTING.add(key)

        async def adopt_beside() -> None:
            try:
                _info, ok = await anyio.to_thread.run_sync(target.store.verify_object, bucket, name)
                if ok is False:
                    integrity.found_bad(bucket, name, target.id)
            except Exception:  # deleted meanwhile, or the read failed: the next read tries
                log.debug("checksum of %s/%s not made", bucket, name, exc_info=True)
            finally:
                _ADOPTING.discard(key)

        _BACKGROUND.add(task := asyncio.ensure_future(adopt_beside()))
        task.add_done_callback(_BACKGROUND.discard)
    return None


_BACKGROUND: set[asyncio.Future[None]] = set()


async def checked_info(target: Target, bucket: str, name: str) -> ObjectInfo:
    """A HEAD's ``ObjectInfo``, checked as a GET would be, sending nothing: a stored size
    that differs from the file's always, the bytes of an object up to
    ``integrity.WHOLE_MAX`` (a hash from the page cache; a match is remembered for the
    GET that follows); a bigger one's bytes are checked by its GET, which streams."""
    store = target.store
    again = False
    while True:
        opened = store.open_if_tagged(bucket, name)
        if opened is None:
            opened = await anyio.to_thread.run_sync(store.open_object, bucket, name)
        f, info = opened
        with f:
            cs = info.checksum if integrity.verify_reads() else None
            if cs is None and integrity.verify_reads():
                ok = await _adopted(target, f, info, bucket, name) is not False
            elif cs is None or integrity.VERIFIED.fresh(info.stamp, cs):
                ok = True
            elif cs.size != info.size:
                ok = False
            elif info.size <= integrity.WHOLE_MAX:
                ok = await _matches(f.fileno(), cs, info.stamp)
            else:
                ok = True
        if ok:
            return info
        integrity.VERIFIED.forget(info.stamp)
        integrity.found_bad(bucket, name, target.id)
        await repair_or_fail(target, bucket, name, again)
        again = True


def _remembered(store: ObjectStore, bucket: str, name: str) -> bool:
    """The object's file matched within ``integrity.VERIFIED``'s time and is unchanged:
    one ``stat`` on the loop, no open and no xattr read (the ETL GET's transformer
    reads the file itself; the open, fstat and three getxattrs were a fifth of the
    target's time in a checked ETL GET, cProfile)."""
    if store.bucket_known(bucket) is False:
        return False
    try:
        st = os.stat(store.local_fspath(bucket, name))
    except (OSError, SluiceError):  # missing, or a bad name: the slow path says which
        return False
    return integrity.VERIFIED.fresh(integrity.stamp_of(st))


async def verify_local(target: Target, bucket: str, name: str) -> None:
    """Check the whole local object before it goes elsewhere (an ETL reads it): repaired
    from a copy or ``ObjectCorrupted`` on a mismatch. Objects without a checksum pass;
    so does one that matched within ``integrity.VERIFIED``'s time and has not changed."""
    if not integrity.verify_reads():
        return
    store = target.store
    if _remembered(store, bucket, name):
        return
    opened = store.open_if_tagged(bucket, name)  # on the loop: an open, an fstat, getxattrs
    if opened is None:  # no stored ETag, or no such object: the thread says which
        _info, ok = await anyio.to_thread.run_sync(store.verify_object, bucket, name)
    else:
        f, info = opened
        with f:
            cs = info.checksum
            if cs is None:
                ok = await _adopted(target, f, info, bucket, name)
            elif integrity.VERIFIED.fresh(info.stamp, cs):
                return
            else:
                ok = cs.size == info.size and await _matches(f.fileno(), cs, info.stamp)
            if ok is False:
                integrity.VERIFIED.forget(info.stamp)
    if ok is False:
        integrity.found_bad(bucket, name, target.id)
        await repair_or_fail(target, bucket, name)


async def serve_local(target: Target, request: Request, bucket: str, name: str) -> Response:
    """The GET of a local object: preconditions, range, and its checked bytes."""
    store = target.store
    again = False
    while True:
        # On the loop, as the 307's stat is: an open, an fstat, a getxattr (a thread hop
        # cost 10x that for a 16 KiB GET, docs/benchmarks.md "S3 API"). No stored ETag
        # (the store hashes the file) or no such object: in a thread, which says why.
        opened = store.open_if_tagged(bucket, name)
        if opened is None:
            opened = await anyio.to_thread.run_sync(store.open_object, bucket, name)
        f, info = opened
        try:
            headers = object_headers(info)
            not_modified, use_range = preconditions(request.headers, info, headers["Last-Modified"])
            if not_modified:
                f.close()
                return not_modified_answer(headers)
            span = byte_range(request.headers.get("range"), info.size) if use_range else None
        except BaseException:
            f.close()
            raise
        start, end, status = 0, info.size, 200
        if span is not None:
            (start, end), status = span, 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{info.size}"
            headers["Content-Length"] = str(end - start)
        verify = integrity.verify_reads()
        cs = info.checksum if verify else None
        if cs is None and verify:  # written before checksums: one is made now
            if await _adopted(target, f, info, bucket, name) is not False:
                return await _unchecked(request, f, start, end, status, headers)
        elif cs is None or (cs.size == info.size and integrity.VERIFIED.fresh(info.stamp, cs)):
            return await _unchecked(request, f, start, end, status, headers)
        zerocopy = offers_zerocopy(request.scope)
        if cs is None:
            pass  # its MD5 is not its ETag
        elif cs.size != info.size:
            pass  # truncated or grown: bad, whatever the size
        elif info.size <= LOOP_READ or (info.size <= integrity.WHOLE_MAX and not zerocopy):
            started = time.time_ns()  # small: read once, checked, answered from memory
            if info.size <= LOOP_READ:
                data = _read_whole(f, info.size)
            else:
                data = await anyio.to_thread.run_sync(_read_whole, f, info.size)
            if cs.matches(data):
                integrity.VERIFIED.note(info.stamp, cs, started)
                body = data if span is None else data[start:end]
                return Response(body, status, headers=headers, media_type=OCTETS)
        elif (zerocopy and info.size <= integrity.WHOLE_MAX) or span is not None:
            # Checked whole first (the read warms the page cache), then by sendfile; a
            # range of a big object likewise.
            if await _matches(f.fileno(), cs, info.stamp):
                return await _unchecked(request, f, start, end, status, headers)
        else:
            bad = _repair_later(target, bucket, name)
            return CheckedFileResponse(f, info.size, cs, headers, bad, info.stamp)
        f.close()
        integrity.VERIFIED.forget(info.stamp)
        integrity.found_bad(bucket, name, target.id)
        await repair_or_fail(target, bucket, name, again)  # raises, or a good copy is here
        again = True


class CheckedFileResponse(Response):
    """A big object streamed through the hash: its last block is sent only once the
    hash matched; a mismatch raises after the head went out (the connection drops
    before the last byte). The file is closed however the answer ends."""

    def __init__(
        self,
        f: IO[bytes],
        size: int,
        cs: integrity.Checksum,
        headers: dict[str, str],
        bad: integrity.BadRead,
        stamp: integrity.Stamp | None = None,
    ) -> None:
        super().__init__(None, 200, headers=headers, media_type=OCTETS)
        self.f, self.size, self.cs, self.bad, self.stamp = f, size, cs, bad, stamp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.time_ns()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            fd, offset, h = self.f.fileno(), 0, integrity.new_hash()
            held: bytes | None = None
            while offset < self.size:
                n = min(self.size - offset, integrity.BLOCK)
                block = await anyio.to_thread.run_sync(os.pread, fd, n, offset)
                if not block:
                    break
                h.update(block)
                offset += len(block)
                if held is not None:
                    await send({"type": "http.response.body", "body": held, "more_body": True})
                held = block
            if offset != self.cs.size or h.hexdigest() != self.cs.digest:
                integrity.VERIFIED.forget(self.stamp)
                raise self.bad()
            integrity.VERIFIED.note(self.stamp, self.cs, started)
            await send({"type": "http.response.body", "body": held or b""})
        finally:
            self.f.close()


async def _unchecked(
    request: Request, f: IO[bytes], start: int, end: int, status: int, headers: dict[str, str]
) -> Response:
    if offers_zerocopy(request.scope):  # os.sendfile, whatever the size
        return FileRangeResponse(
            f, start, end - start, status, headers, media_type="application/octet-stream"
        )
    if end - start <= WHOLE_GET_MAX:
        data = await anyio.to_thread.run_sync(_read_small, f, start, end - start)
        return Response(data, status, headers=headers, media_type="application/octet-stream")
    if start:
        await anyio.to_thread.run_sync(f.seek, start)
    return StreamingResponse(
        _file_iter(f, end - start),
        status,
        headers=headers,
        media_type="application/octet-stream",
    )
