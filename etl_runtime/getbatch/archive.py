"""The two archive halves of GetBatch: writing the answer, reading a file out of a shard.

``ArchiveWriter`` builds the answer's TAR (gzip'd for ``.tgz``) entry by
entry into a small buffer the caller drains (``take``) whenever it would
otherwise wait, so bytes leave as soon as they are known and memory stays
bounded. ``broken_entry`` is how a stream that cannot be completed ends: a
header that declares more bytes than will ever follow, after which the caller
aborts the connection, so no tar reader can mistake the rest for a whole
archive.

``ShardReader`` (``wire/formats/shardread.py``, shared with the targets, which read
files out of transformed shards) finds one file (``archpath``) in a shard
while it streams in.
"""

from __future__ import annotations

import tarfile
import time
import zlib

from etl_runtime.getbatch.exchange import Moved, placeholder_header, tar_header
from etl_runtime.wire.formats.shardread import ShardReader

__all__ = ["ArchiveWriter", "ShardReader", "Chunk", "Piece", "BLOCK", "padding"]

BLOCK = tarfile.BLOCKSIZE
Chunk = bytes | bytearray | memoryview  # a piece of the answer, handed to the server as is
Piece = Chunk | Moved  # or bytes the server moves itself (a target's socket, a file)


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

    def placeholder(self, name: str, error: str) -> None:
        """A failed item's zero-size entry, its error in the header (never as data)."""
        self._put(placeholder_header(name, error, self._mtime))

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
