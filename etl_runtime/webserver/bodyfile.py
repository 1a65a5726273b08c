"""A blocking file object over an async request body, for ``tarfile`` in a thread.

``tarfile`` (and so webdataset's tar iterators) reads from a blocking file.
``RequestBodyFile.readinto`` runs in the shard's parser thread and pulls the
next body chunk from the event loop only when the parser needs more bytes, so
the server holds at most one chunk per request and a slow consumer slows the
upload down through TCP, instead of buffering the shard.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
from collections.abc import AsyncIterator, Callable


class BodyClosed(Exception):
    """The request was abandoned while its parser still wanted bytes."""


class RequestBodyFile(io.RawIOBase):
    def __init__(
        self,
        body: AsyncIterator[bytes],
        loop: asyncio.AbstractEventLoop,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> None:
        super().__init__()
        self._body = body
        self._loop = loop
        self._on_bytes = on_bytes
        self._chunk = memoryview(b"")
        self._eof = False
        self._abandoned = False
        self._pending: concurrent.futures.Future[bytes | None] | None = None
        self.done = asyncio.Event()  # set (on the loop) once the body has ended

    def readable(self) -> bool:
        return True

    async def _next_chunk(self) -> bytes | None:
        async for chunk in self._body:
            if chunk:
                return chunk
        self.done.set()
        return None

    async def drain(self) -> None:
        """Consume what the parser left (tar padding), so the body is fully read."""
        if not self._eof:
            async for chunk in self._body:
                self._on_bytes(len(chunk))
            self._eof = True
        self.done.set()

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._chunk:
            if self._eof:
                return 0
            if self._abandoned:
                raise BodyClosed("request abandoned")
            self._pending = asyncio.run_coroutine_threadsafe(self._next_chunk(), self._loop)
            try:
                chunk = self._pending.result()
            except concurrent.futures.CancelledError:
                raise BodyClosed("request abandoned") from None
            if chunk is None:
                self._eof = True
                return 0
            self._on_bytes(len(chunk))
            self._chunk = memoryview(chunk)
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n

    def abandon(self) -> None:
        """Make the parser thread stop at its next read (safe from any thread)."""
        self._abandoned = True
        if self._pending is not None:
            self._pending.cancel()
