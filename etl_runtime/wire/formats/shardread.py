"""Reading files out of a TAR (or gzip'd TAR) shard as it streams in, forward only.

``ShardReader`` parses headers as they pass (ustar, GNU long names, pax
``path``/``size``), skips members nobody wants and hands on a wanted member's
bytes without reading the rest of the shard: ``find(archpath)`` for one file
(the gateway's GetBatch item read with a GET), ``next()`` member by member
(a target picking several files out of one transformed shard). The simplest
correct way: a file at the end of a big shard costs reading the whole shard
(an index with byte offsets and a ``Range`` would not).
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import AsyncIterator

from etl_runtime.core.errors import NotATar

BLOCK = tarfile.BLOCKSIZE
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


def padding(size: int) -> int:
    return -size % BLOCK


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


def same_path(name: str, archpath: str) -> bool:
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
        self._first = True

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
        while (found := await self.next()) is not None:
            name, size = found
            if same_path(name, archpath):
                return size
            if not await self.skip_member(size):
                return None
        return None

    async def skip_member(self, size: int) -> bool:
        """Past the member ``next()`` found (not read); False if the shard ends in it."""
        return await self._skip(size + padding(size))

    async def next(self) -> tuple[str, int] | None:
        """The next regular file's (name, size), positioned at its bytes; None at the end
        (or where a cut shard ends). Read it with ``member(size)`` (then ``skip_padding``)
        or pass it with ``skip_member(size)``."""
        long_name: str | None = None
        pax: dict[str, str] = {}
        while True:
            block = await self._exact(BLOCK)
            if block is None:
                if self._first:
                    raise self._not_a_tar("it ends before its first header")
                return None  # truncated or no end marker: not in it either way
            if block == bytes(BLOCK):
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as e:
                raise self._not_a_tar(f"bad header ({e})") from None
            self._first = False
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
            if info.type in _REGULAR:
                return name, size
            if info.type == tarfile.GNUTYPE_SPARSE and not await self._skip(size + padding(size)):
                return None

    async def skip_padding(self, size: int) -> bool:
        """After ``member(size)`` was read whole: past its padding, to the next header."""
        return await self._skip(padding(size))

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
