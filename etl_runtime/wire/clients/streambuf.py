"""``ReceiveStream``: an asyncio stream reader that can receive into the caller's buffer.

``asyncio.StreamReader`` copies every byte twice on the way in: the transport
receives into a fresh ``bytes``, ``feed_data`` appends it to the reader's
buffer, and ``read``/``readexactly`` copy it out again. On the data path
(target <-> transformer, transformer <-> worker) those copies of every object
were the largest CPU cost after the kernel's own. ``ReceiveStream`` is a
``BufferedProtocol``: small reads (headers, chunk lines) go through one
internal buffer, and ``readexactly(n)`` of a large ``n`` lets the socket
``recv_into`` the returned ``bytearray`` directly (no copy in user space).

It offers the part of the ``StreamReader`` API the data path uses (``read``,
``readexactly``, ``readuntil``, ``at_eof``, ``exception``) with the same
exceptions (``IncompleteReadError``, ``LimitOverrunError``) and flow control
(reading pauses while more than ``2 * limit`` bytes are buffered). Writing
uses a normal ``asyncio.StreamWriter`` (``open_connection`` /
``open_unix_connection`` below), so ``drain()`` backpressure is unchanged.

It runs on asyncio's loop and on uvloop alike (uvicorn picks uvloop when it is
installed). Two things matter there: uvloop's transports are not
``asyncio.Transport`` subclasses, so only their methods are relied on; and
uvloop treats a protocol that is also an ``asyncio.Protocol`` as a plain one
(it calls ``data_received``), so the write-side flow control that
``StreamWriter.drain()`` awaits is written out here instead of inheriting
asyncio's ``FlowControlMixin``, which is an ``asyncio.Protocol``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_
from typing import cast

SCRATCH = 64 << 10  # one recv when no read waits with its own buffer (kept per connection)
DIRECT_MIN = 64 << 10  # readexactly of at least this much receives in place


class ReceiveStream(asyncio.BufferedProtocol):
    def __init__(self, limit: int = 1 << 20) -> None:
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._buffer = bytearray()
        self._scratch = bytearray(SCRATCH)
        self._scratch_view = memoryview(self._scratch)
        self._target: memoryview | None = None  # a readexactly's destination
        self._filled = 0
        self._into_target = False  # the last get_buffer handed out the target
        self._eof = False
        self._exception: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._lost = False
        self._closed: asyncio.Future[None] = self._loop.create_future()

    # -- protocol side -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's transports have the same methods but do not
        # subclass ``asyncio.Transport`` (uvicorn picks uvloop when installed).
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        self._into_target = self._target is not None and self._filled < len(self._target)
        if self._into_target:
            assert self._target is not None
            return self._target[self._filled :]
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_target:
            assert self._target is not None
            self._filled += nbytes
            if self._filled < len(self._target):
                return
        else:
            self._buffer += self._scratch_view[:nbytes]
            if len(self._buffer) > 2 * self._limit:
                self._pause()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return True  # like StreamReaderProtocol: the writer may still write; the owner closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._eof = True
        if exc is not None:
            self._exception = exc
        self._wake()
        self._wake_drain(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    # -- write flow control: what ``StreamWriter.drain()``/``wait_closed()`` call --

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drain(None)

    def _wake_drain(self, exc: Exception | None) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    async def _drain_helper(self) -> None:
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()

    async def _wait(self) -> None:
        if self._exception is not None:
            raise self._exception
        if self._eof:
            return
        self._resume()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._exception is not None:
            raise self._exception

    # -- reader side -----------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._exception is not None:
            raise self._exception

    def exception(self) -> BaseException | None:
        return self._exception

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) <= self._limit:
            self._resume()
        return data

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one), ``b""`` at EOF."""
        while not self._buffer:
            if self._exception is not None:
                raise self._exception  # a reset is not a clean end
            if self._eof:
                return b""
            await self._wait()
        return self._take(n)

    async def readexactly(self, n: int) -> bytes | bytearray:
        """Exactly ``n`` bytes; a large ``n`` is received straight into the result."""
        if len(self._buffer) >= n:
            return self._take(n)
        if n < DIRECT_MIN:
            while len(self._buffer) < n:
                if self._eof:
                    self._raise_if_failed()
                    raise asyncio.IncompleteReadError(self._take(len(self._buffer)), n)
                await self._wait()
            return self._take(n)
        out = bytearray(n)
        view = memoryview(out)
        have = len(self._buffer)
        view[:have] = self._buffer
        self._buffer.clear()
        self._target, self._filled = view, have
        try:
            while self._filled < n:
                if self._eof:
                    self._raise_if_failed()
                    raise asyncio.IncompleteReadError(bytes(view[: self._filled]), n)
                await self._wait()
        finally:
            self._target = None
        return out

    async def readuntil(self, separator: bytes) -> bytes:
        """Up to and including ``separator``; ``LimitOverrunError`` past ``limit``."""
        start = 0
        while True:
            i = self._buffer.find(separator, start)
            if i >= 0:
                return self._take(i + len(separator))
            if len(self._buffer) > self._limit:
                raise asyncio.LimitOverrunError("separator not found within the limit", 0)
            if self._eof:
                self._raise_if_failed()
                raise asyncio.IncompleteReadError(self._take(len(self._buffer)), None)
            start = max(0, len(self._buffer) - len(separator) + 1)
            await self._wait()


def _streams(
    transport: asyncio.BaseTransport, protocol: ReceiveStream
) -> tuple[ReceiveStream, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    return protocol, asyncio.StreamWriter(transport, protocol, None, loop)  # type: ignore[arg-type]


async def open_connection(
    host: str, port: int, limit: int = 1 << 20, ssl: ssl_.SSLContext | None = None
) -> tuple[ReceiveStream, asyncio.StreamWriter]:
    """A connection to ``host:port``; with ``ssl``, TLS verified for ``host``."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(
        lambda: ReceiveStream(limit), host, port, ssl=ssl, server_hostname=host if ssl else None
    )
    return _streams(transport, protocol)


async def open_unix_connection(
    sock: socket.socket, limit: int = 1 << 20
) -> tuple[ReceiveStream, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_unix_connection(lambda: ReceiveStream(limit), sock=sock)
    return _streams(transport, protocol)
