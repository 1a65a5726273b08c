"""The two archive halves of GetBatch: writing the answer, reading a file out of a shard.

``ArchiveWriter`` builds the answer's TAR (gzip'd for ``.tgz``) entry by
entry into a small buffer the caller drains (``take``) whenever it would
otherwise wait, so bytes leave as soon as they are known and memory stays
bounded. ``broken_entry`` is how a stream that cannot be completed ends: a
header that declares more bytes than will ever follow, after which the caller
aborts the connection, so no tar reader can mistake the rest for a whole
archive.

``ShardReader`` finds one file (``archpath``) in a ``.tar`` or ``.tar.gz``
shard while the shard streams in from its target: headers are parsed as they
pass (ustar, GNU long names, pax ``path``/``size``), other members are
skipped, and the wanted member's bytes are handed on without reading the rest
of the shard. The simplest correct way: a file at the end of a big shard
costs reading the whole shard (an index with byte offsets and a ``Range``
would not).
"""

from __future__ import annotations

import tarfile
import time
import zlib
from collections.abc import AsyncIterator

from etl_runtime.core.errors import NotATar
from etl_runtime.wire.batchshare import Spliced, tar_header

BLOCK = tarfile.BLOCKSIZE
Chunk = bytes | bytearray | memoryview  # a piece of the answer, handed to the server as is
Piece = Chunk | Spliced  # or bytes the server moves from a target's socket itself
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


def padding(size: int) -> int:
    return -size % BLOCK


class ArchiveWriter:
    """A TAR (or gzip'd TAR) written into a buffer; ``take()`` drains it."""

    def __init__(self, fmt: str) -> None:
        self._gz = zlib.compressobj(6, zlib.DEFLATED, 31) if fmt == ".tgz" else None
        self._out: list[Chunk] = []
        self.pending = 0  # bytes waiting in the buffer
        self._mtime = int(time.time())

    def _put(self, data: Chunk) -> None:
        if self._gz is not None:
            data = self._gz.compress(data)
        if data:
            self._out.append(data)
            self.pending += len(data)

    def header(self, name: str, size: int) -> None:
        self._put(tar_header(name, size, self._mtime))

    def data(self, chunk: Chunk) -> None:
        self._put(chunk)

    def pad(self, size: int) -> None:
        if n := padding(size):
            self._put(bytes(n))

    def entry(self, name: str, payload: bytes = b"") -> None:
        self.header(name, len(payload))
        if payload:
            self.data(payload)
            self.pad(len(payload))

    def broken_entry(self, name: str, declared: int) -> None:
        """A header promising ``declared`` bytes; the caller aborts after it."""
        self.header(name, max(declared, 1))

    def end(self) -> None:
        self._put(bytes(2 * BLOCK))
        if self._gz is not None:
            tail = self._gz.flush(zlib.Z_FINISH)
            self._gz = None
            if tail:
                self._out.append(tail)
                self.pending += len(tail)

    def take(self) -> Chunk:
        """Everything written so far (a gzip stream is sync-flushed: readable now).

        One piece is handed on as it is: a big chunk written alone is not copied."""
        if self._gz is not None:
            tail = self._gz.flush(zlib.Z_SYNC_FLUSH)
            if tail:
                self._out.append(tail)
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self.pending = 0
        return out


def _pax_records(data: bytes) -> dict[str, str]:
    """``"%d key=value\\n"`` records of a pax header (the keys Sluice needs: path, size)."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos : pos + 1] not in (b"\x00", b""):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return found


def _same(name: str, archpath: str) -> bool:
    def norm(p: str) -> str:
        while p.startswith("./"):
            p = p[2:]
        return p.lstrip("/")

    return norm(name) == norm(archpath)


class ShardReader:
    """Reads a tar (or tar.gz) shard from a byte stream, forward only."""

    def __init__(self, chunks: AsyncIterator[bytes | bytearray], what: str) -> None:
        self._it = chunks
        self._what = what  # ais://bucket/object, for errors
        self._buf = bytearray()
        self._gz: zlib._Decompress | None = None
        self._started = False
        self._head = b""

    async def _more(self) -> bool:
        async for chunk in self._it:
            if not self._started:  # gzip or not: decided on the first two bytes
                self._head += chunk
                if len(self._head) < 2:
                    continue
                chunk, self._head, self._started = bytes(self._head), b"", True
                if chunk[:2] == b"\x1f\x8b":
                    self._gz = zlib.decompressobj(31)
            if self._gz is not None:
                chunk = self._gz.decompress(chunk)
            self._buf += chunk
            return True
        if self._head:  # a one-byte stream
            self._buf += self._head
            self._head = b""
            return True
        return False

    async def _exact(self, n: int) -> bytes | None:
        while len(self._buf) < n:
            if not await self._more():
                return None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _skip(self, n: int) -> bool:
        while n > 0:
            if not self._buf and not await self._more():
                return False
            step = min(n, len(self._buf))
            del self._buf[:step]
            n -= step
        return True

    def _not_a_tar(self, why: str) -> NotATar:
        return NotATar(f"{self._what} is not a tar or tar.gz shard: {why}")

    async def find(self, archpath: str) -> int | None:
        """Position at ``archpath``'s bytes and return its size; None if it is not there."""
        long_name: str | None = None
        pax: dict[str, str] = {}
        first = True
        while True:
            block = await self._exact(BLOCK)
            if block is None:
                if first:
                    raise self._not_a_tar("it ends before its first header")
                return None  # truncated or no end marker: not in it either way
            if block == bytes(BLOCK):
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as e:
                raise self._not_a_tar(f"bad header ({e})") from None
            first = False
            size = info.size
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, *_PAX):
                data = await self._exact(size + padding(size))
                if data is None:
                    return None
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = data[:size].rstrip(b"\x00").decode("utf-8", "surrogateescape")
                elif info.type in _PAX:
                    pax = _pax_records(data[:size])
                continue
            if info.type == tarfile.XGLTYPE:  # global pax header: nothing Sluice needs
                if not await self._skip(size + padding(size)):
                    return None
                continue
            name = pax.get("path") or long_name or info.name
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise self._not_a_tar(f"bad pax size {pax['size']!r}") from None
            long_name, pax = None, {}
            if info.type in _REGULAR and _same(name, archpath):
                return size
            if info.type in _REGULAR or info.type == tarfile.GNUTYPE_SPARSE:
                if not await self._skip(size + padding(size)):
                    return None

    async def member(self, size: int, start: int = 0) -> AsyncIterator[bytes]:
        """``size`` bytes of the member found (after skipping ``start`` of them)."""
        if start and not await self._skip(start):
            raise self._not_a_tar("it ends inside the member")
        left = size
        while left > 0:
            if not self._buf and not await self._more():
                raise self._not_a_tar("it ends inside the member")
            take = min(left, len(self._buf))
            out = bytes(self._buf[:take])
            del self._buf[:take]
            left -= take
            yield out
