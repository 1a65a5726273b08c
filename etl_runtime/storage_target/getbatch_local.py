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
``LOOP_READ`` bytes. A share through an ETL comes the same way: the target
transforms its items (``getbatch_etl.py``) and the outputs are read as files are.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any

import anyio.to_thread

from etl_runtime.getbatch.exchange import PIECE, FileSlice, ShareBroken, encode_manifest, padding
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.getbatch_share import Share, open_share

LOOP_READ = 64 << 10  # a file's bytes read on the event loop up to this much a read


class _File:
    __slots__ = ("file", "offset", "size")

    def __init__(self, file: IO[bytes], offset: int, size: int) -> None:
        self.file, self.offset, self.size = file, offset, size


Buffer = bytes | bytearray | memoryview
Segment = Buffer | _File


class LocalBody:
    """The bytes of a share's answer, taken in exact pieces as ``ShareBody``'s are."""

    status = 200
    headers: dict[str, str] = {}

    def __init__(self, share: Share) -> None:
        self._share: Share | None = share
        segs: deque[Segment] = deque([encode_manifest(share.manifest)])
        for e in share.entries:
            segs.append(e.head)
            if e.data is not None:
                if e.size:
                    segs.append(e.data)
            elif e.file is not None and e.size:
                segs.append(_File(e.file, e.offset, e.size))
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
        want = min(n, seg.size, PIECE)
        fd = seg.file.fileno()
        if want <= LOOP_READ:
            got = os.pread(fd, want, seg.offset)
        else:
            got = await anyio.to_thread.run_sync(os.pread, fd, want, seg.offset)
        if len(got) != want:  # objects are replaced by rename, never cut: a disk fault
            raise ShareBroken(f"a short read ({len(got)} of {want} bytes)")
        seg.offset += want
        seg.size -= want
        if not seg.size:
            self._segs.popleft()
        return got

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
