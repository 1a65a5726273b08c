"""A designated target's own share of a GetBatch, read in its own process.

A target that assembles a batch (``getbatch_routes.py``) asks every other target for its
share over HTTP (``POST /v1/_moss``), and would ask itself the same way: a
request through its own server and a loopback socket, and every one of its
items' bytes copied through the kernel twice. ``local_opener`` gives the
assembler (``getbatch/shares.py``, ``TargetShare``) the same share straight
from ``batch.open_share``: ``LocalBody`` reads the answer the target would
have sent (the manifest, then each TAR entry: header, bytes, padding) from
the opened share itself, with the reads ``getbatch/exchange.py``'s
``ShareBody`` offers. Small files are already in memory; a bigger one is
read with ``os.pread`` when its turn comes, in a worker thread beyond
``LOOP_READ`` bytes. A file not matched lately (``integrity.VERIFIED``) is
checked as it is read, its last piece only once the hash matched (a mismatch
breaks the answer, as the HTTP share's dropped connection does); one that
matched is sent by ``sendfile`` where the server can. A share through an ETL
comes the same way: the target transforms its items (``getbatch_etl.py``) and
the outputs are read as files are.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any

import anyio.to_thread

from etl_runtime.getbatch.exchange import PIECE, FileSlice, ShareBroken, encode_manifest, padding
from etl_runtime.storage import integrity
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.getbatch_share import Share, open_share

LOOP_READ = 64 << 10  # a file's bytes read on the event loop up to this much a read


class _File:
    """A file's part of the answer; ``check``: its stored checksum while not yet matched
    (``Share`` leaves it None for a file that matched lately, ``integrity.VERIFIED``)."""

    __slots__ = ("file", "offset", "size", "check", "stamp", "what", "hash", "started")

    def __init__(
        self,
        file: IO[bytes],
        offset: int,
        size: int,
        check: integrity.Checksum | None = None,
        stamp: integrity.Stamp | None = None,
        what: str = "",
    ) -> None:
        self.file, self.offset, self.size = file, offset, size
        self.check, self.stamp, self.what = check, stamp, what
        self.hash = integrity.new_hash() if check is not None else None
        self.started = time.time_ns()


Buffer = bytes | bytearray | memoryview
Segment = Buffer | _File


class LocalBody:
    """The bytes of a share's answer, taken in exact pieces as ``ShareBody``'s are."""

    status = 200
    headers: dict[str, str] = {}

    def __init__(self, share: Share) -> None:
        self._share: Share | None = share
        self._target_id = share.target.id
        segs: deque[Segment] = deque([encode_manifest(share.manifest)])
        for e in share.entries:
            segs.append(e.head)
            if e.data is not None:
                if e.size:
                    segs.append(e.data)
            elif e.file is not None and e.size:
                segs.append(_File(e.file, e.offset, e.size, e.check, e.stamp, e.what))
            if pad := padding(e.size):
                segs.append(bytes(pad))
        self._segs = segs
        self.left = sum(x.size if isinstance(x, _File) else len(x) for x in segs)
        self._skip = 0

    def _claim(self, n: int) -> None:
        if n > self.left or self._share is None:
            raise ShareBroken(f"{n} bytes asked of an answer with {self.left} left")
        self.left -= n

    async def _front(self, n: int) -> Buffer:
        """Up to ``n`` (> 0) bytes off the front, from its first segment."""
        seg = self._segs[0]
        if not isinstance(seg, _File):
            if len(seg) <= n:
                self._segs.popleft()
                return seg
            self._segs[0] = seg[n:]
            return seg[:n]
        if seg.check is not None and (seg.offset, seg.size) != (0, seg.check.size):
            await self._check_whole(seg)  # a part of a big object: all of it first
        want = min(n, seg.size, PIECE)
        fd = seg.file.fileno()
        if want <= LOOP_READ:
            got = os.pread(fd, want, seg.offset)
        else:
            got = await anyio.to_thread.run_sync(os.pread, fd, want, seg.offset)
        if len(got) != want:  # objects are replaced by rename, never cut: a disk fault
            raise ShareBroken(f"a short read ({len(got)} of {want} bytes)")
        if seg.hash is not None:  # checked as it goes; the last piece once it matched
            seg.hash.update(got)
        seg.offset += want
        seg.size -= want
        if not seg.size:
            if seg.check is not None and seg.hash is not None:
                if seg.hash.hexdigest() != seg.check.digest:
                    raise self._bad(seg)
                integrity.VERIFIED.note(seg.stamp, seg.check, seg.started)
            self._segs.popleft()
        return got

    async def _check_whole(self, seg: _File) -> None:
        assert seg.check is not None
        started = time.time_ns()
        if not await anyio.to_thread.run_sync(integrity.file_matches, seg.file.fileno(), seg.check):
            raise self._bad(seg)
        integrity.VERIFIED.note(seg.stamp, seg.check, started)
        seg.check = seg.hash = None

    def _bad(self, seg: _File) -> ShareBroken:
        """A mismatch: the answer breaks before the entry's last byte (as the HTTP share's
        connection drops), so no reader takes the archive for whole."""
        integrity.VERIFIED.forget(seg.stamp)
        bucket, _, name = seg.what.partition("/")
        integrity.found_bad(bucket, name, self._target_id)
        return ShareBroken(f"ais://{seg.what} does not match its checksum: the batch was cut short")

    async def _drop(self) -> None:
        n, self._skip = self._skip, 0
        self._claim(n)
        while n:
            n -= len(await self._front(n))

    def skip(self, n: int) -> None:
        self._skip += n

    async def exactly(self, n: int) -> bytes:
        if self._skip:
            await self._drop()
        self._claim(n)
        first = await self._front(n) if n else b""
        if len(first) == n:
            return first if isinstance(first, bytes) else bytes(first)
        parts = [first]
        n -= len(first)
        while n:
            parts.append(await self._front(n))
            n -= len(parts[-1])
        return b"".join(parts)

    async def block(self, n: int) -> bytes:
        return await self.exactly(n)

    async def pieces(self, n: int) -> AsyncIterator[Buffer]:
        if self._skip:
            await self._drop()
        self._claim(n)
        while n:
            piece = await self._front(n)
            n -= len(piece)
            yield piece

    async def spliced(self, n: int, what: str) -> AsyncIterator[Buffer | FileSlice]:
        """``n`` bytes for a server that sends files itself: a file's as a ``FileSlice``
        (``os.sendfile`` from the page cache to the client), the rest as bytes."""
        if self._skip:
            await self._drop()
        self._claim(n)
        while n:
            seg = self._segs[0]
            if not isinstance(seg, _File):
                piece = await self._front(n)
                n -= len(piece)
                yield piece
                continue
            if seg.check is not None:  # not matched lately: read through the hash
                piece = await self._front(n)
                n -= len(piece)
                yield piece
                continue
            take = min(n, seg.size)
            yield FileSlice(seg.file, seg.offset, take)
            seg.offset += take
            seg.size -= take
            n -= take
            if not seg.size:
                self._segs.popleft()

    async def end(self) -> None:
        if self._skip:
            await self._drop()
        if self.left:
            raise ShareBroken(f"the answer has {self.left} bytes nobody asked")
        self.close()

    async def read_all(self, limit: int) -> bytes:
        self.close()
        return b""

    def close(self) -> None:
        share, self._share = self._share, None
        if share is not None:
            share.close()


def local_opener(target: Target) -> Callable[[dict[str, Any]], Awaitable[LocalBody]]:
    """What ``TargetShare`` calls instead of ``POST /v1/_moss`` to this target."""

    async def open_local(ask: dict[str, Any]) -> LocalBody:
        return LocalBody(await open_share(target, ask, etl=bool(ask.get("etl"))))

    return open_local
