"""Reading files out of a TAR (or gzip'd TAR) shard as it streams in, forward only.

``ShardReader`` parses headers as they pass (ustar, GNU long names, pax
``path``/``size``), skips members nobody wants and hands on a wanted member's
bytes without reading the rest of the shard: ``find(archpath)`` for one file
(the gateway's GetBatch item read with a GET), ``next()`` member by member
(a target picking several files out of one transformed shard). The simplest
correct way: a file at the end of a big shard costs reading the whole shard
(an index with byte offsets and a ``Range`` would not).

A shard that is not whole is an error naming it (``NotATar``), never a
"not in shard": one that ends inside a header, a member or its compressed
data, or without its end-of-archive blocks; a bad header; compressed data
that does not inflate. A pax or GNU long-name header over ``HEADER_MAX``
(1 MiB) is refused as its header block goes by (``UnsafeShard``), and gzip is
inflated in bounded steps (``targuard.Decompressor``), so memory stays bounded
whatever the shard holds.
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator

from etl_runtime.core.errors import NotATar, UnsafeShard
from etl_runtime.wire.formats.targuard import HEADER_MAX, Decompressor, pax_records

BLOCK = tarfile.BLOCKSIZE
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


def padding(size: int) -> int:
    return -size % BLOCK


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
        self._dec: Decompressor | None = None
        self._head = b""
        self._ended = False
        self._first = True

    async def _more(self) -> bool:
        """More bytes in ``_buf``; False at the end of the stream."""
        while True:
            if self._dec is not None and self._dec.has_more():
                if out := self._step():
                    self._buf += out
                    return True
                continue
            if self._ended:
                return False
            chunk = await anext(self._it, None)  # type: ignore[call-overload]
            if chunk is None:
                self._ended = True
                if self._dec is None and self._head:  # a one-byte stream
                    self._dec = Decompressor(self._head)
                    self._dec.feed(self._head)
                    continue
                if self._dec is not None and not self._dec.complete():
                    raise self._broken(f"its {self._dec.kind} data ends early")
                return False
            if self._dec is None:  # compressed or not: decided on the first bytes
                self._head += chunk
                if len(self._head) < 6:
                    continue
                chunk, self._head = self._head, b""
                self._dec = Decompressor(bytes(chunk))
            self._dec.feed(bytes(chunk))

    def _step(self) -> bytes:
        assert self._dec is not None
        try:
            return self._dec.step()
        except ValueError as e:
            raise self._broken(str(e)) from None

    async def _exact(self, n: int) -> bytes | None:
        while len(self._buf) < n:
            if not await self._more():
                return None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _skip(self, n: int) -> None:
        while n > 0:
            if not self._buf and not await self._more():
                raise self._broken("it ends inside a member (truncated)")
            step = min(n, len(self._buf))
            del self._buf[:step]
            n -= step

    def _broken(self, why: str) -> NotATar:
        if self._first:
            return NotATar(f"{self._what} is not a tar or tar.gz shard: {why}")
        return NotATar(f"{self._what} is a broken tar shard: {why}")

    async def find(self, archpath: str) -> int | None:
        """Position at ``archpath``'s bytes and return its size; None if the (whole)
        shard does not hold it. A broken shard raises ``NotATar`` naming it."""
        while (found := await self.next()) is not None:
            name, size = found
            if same_path(name, archpath):
                return size
            await self.skip_member(size)
        if self._dec is not None and not self._dec.plain:  # its end was seen: whole?
            while await self._more():
                self._buf.clear()
        return None

    async def skip_member(self, size: int) -> bool:
        """Past the member ``next()`` found (not read); ``NotATar`` if the shard ends in it."""
        await self._skip(size + padding(size))
        return True

    async def next(self) -> tuple[str, int] | None:
        """The next regular file's (name, size), positioned at its bytes; None at the
        end-of-archive blocks. Read it with ``member(size)`` (then ``skip_padding``)
        or pass it with ``skip_member(size)``. A shard that ends anywhere else, or
        a bad header, raises ``NotATar``; an extended header over ``HEADER_MAX``,
        ``UnsafeShard``."""
        long_name: str | None = None
        pax: dict[str, str] = {}
        while True:
            block = await self._exact(BLOCK)
            if block is None:
                if self._first:
                    raise self._broken("it ends before its first header")
                if self._buf:
                    raise self._broken("it ends inside a header (truncated)")
                raise self._broken("it ends without its end-of-archive blocks (truncated)")
            if block == bytes(BLOCK):
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as e:
                raise self._broken(f"bad header ({e})") from None
            self._first = False
            size = info.size
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, *_PAX):
                if size > HEADER_MAX:
                    kind = "pax" if info.type in _PAX else "GNU long-name"
                    raise UnsafeShard(
                        f"{self._what}: a {kind} header of {size} bytes is over the "
                        f"{HEADER_MAX >> 20} MiB limit on tar extended headers"
                    )
                data = await self._exact(size + padding(size))
                if data is None:
                    raise self._broken("it ends inside a header (truncated)")
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = data[:size].rstrip(b"\x00").decode("utf-8", "surrogateescape")
                elif info.type in _PAX:
                    pax = pax_records(data[:size])
                continue
            if info.type == tarfile.XGLTYPE:  # global pax header: nothing Sluice needs
                if size > HEADER_MAX:
                    raise UnsafeShard(
                        f"{self._what}: a global pax header of {size} bytes is over the "
                        f"{HEADER_MAX >> 20} MiB limit on tar extended headers"
                    )
                await self._skip(size + padding(size))
                continue
            name = pax.get("path") or long_name or info.name
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise self._broken(f"bad pax size {pax['size']!r}") from None
            long_name, pax = None, {}
            if info.type in _REGULAR:
                return name, size
            if info.type == tarfile.GNUTYPE_SPARSE:
                await self._skip(size + padding(size))

    async def skip_padding(self, size: int) -> bool:
        """After ``member(size)`` was read whole: past its padding, to the next header."""
        await self._skip(padding(size))
        return True

    async def member(self, size: int, start: int = 0) -> AsyncIterator[bytes]:
        """``size`` bytes of the member found (after skipping ``start`` of them)."""
        if start:
            await self._skip(start)
        left = size
        while left > 0:
            if not self._buf and not await self._more():
                raise self._broken("it ends inside a member (truncated)")
            take = min(left, len(self._buf))
            out = bytes(self._buf[:take])
            del self._buf[:take]
            left -= take
            yield out
