"""Relaying bytes from a socket into an HTTP answer without copying them: ``os.splice``.

The gateway's GetBatch relays big items from a target's socket to the
client's. Read into Python and written out again, every byte is copied twice
(and the write often a third time, into the transport's buffer when the
socket is full); on two cores that made the gateway the bottleneck of a batch
of 1 MiB objects. ``os.splice`` moves the bytes socket → pipe → socket inside
the kernel instead.

An app asks for it with the ASGI message ``{"type": "sluice.splice", "fd":
source socket, "count": n}`` on a response that has a ``Content-Length``,
where the server offers it (``scope["extensions"]["sluice.splice"]``: the
zero-copy protocol of ``wire/http/zerocopy.py`` does on Linux). As for a
zero-copy file, the transport's buffer is emptied first and reading paused;
then both sockets are watched (the client's through a ``dup``, since the
loops refuse to watch a descriptor a transport owns) and the pipe is filled
and drained until ``n`` bytes went through.

The source ending or going silent (``timeout`` seconds without a byte; a
slow client is waited for, as uvicorn does)
raises ``SourceBroken`` to the app after the connection to the client was
closed: its answer is then short, never complete-looking. A client that went
away raises ``ClientGone``: unlike a file, the source socket is then at an
unknown place, and must not be read on (or pooled).

``{"type": "sluice.splice", "together": True}``, sent before a response starts,
asks instead that its status line, headers and body go out in one write once
the body is complete (``together``): uvicorn writes the head at once and the
body later, two system calls and, when the client reads the head first, two
wake-ups of a client that then blocks again for the body. The gateway's S3
relay of a small object sends it (``gateway/s3/spliced.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from typing import Any

from starlette.types import Message

MESSAGE = "sluice.splice"
PIPE_SIZE = 1 << 20
TIMEOUT = 120.0
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class SourceBroken(ConnectionError):
    """The socket spliced from ended or went silent before ``count`` bytes."""


class ClientGone(ConnectionError):
    """The client's connection closed before ``count`` bytes were moved: the source
    socket holds an unknown part of them, so its owner must not read it on."""


def available() -> bool:
    return hasattr(os, "splice") and hasattr(os, "SPLICE_F_NONBLOCK")


class _Together:
    """The cycle's transport while a response is held: writes are kept and go out at
    once when the response completes (``on_response``) or the connection closes."""

    def __init__(self, cycle: Any) -> None:
        self._cycle, self._transport = cycle, cycle.transport
        self._parts: list[bytes] = []
        self._on_response = cycle.on_response
        cycle.transport, cycle.on_response = self, self._complete

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if data:
            self._parts.append(data)

    def _flush(self) -> None:
        cycle, parts = self._cycle, self._parts
        if cycle.transport is self:
            cycle.transport, cycle.on_response = self._transport, self._on_response
        self._parts = []
        if parts:
            self._transport.writelines(parts)  # uvloop: one writev; asyncio joins them

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _complete(self) -> None:
        self._flush()
        self._on_response()


def together(cycle: Any) -> None:
    """Hold this response's writes until it is complete: head and body in one write."""
    if cycle.response_started or isinstance(cycle.transport, _Together):
        raise RuntimeError(f"'{MESSAGE}' with 'together' must come before the response")
    _Together(cycle)


async def send_spliced(cycle: Any, message: Message) -> None:
    """Answer one ``sluice.splice`` message on uvicorn's request-response ``cycle``."""
    from etl_runtime.wire.http.zerocopy import _flushed  # zerocopy imports this module lazily

    if message.get("together"):
        together(cycle)
        return
    if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding:
        raise RuntimeError(f"'{MESSAGE}' needs a started response with a Content-Length")
    src: int = message["fd"]
    count: int = message["count"]
    timeout: float = message.get("timeout", TIMEOUT)
    if count > cycle.expected_content_length:
        raise RuntimeError("Response content longer than Content-Length")
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        raise ClientGone("the client went away")
    transport: asyncio.Transport = cycle.transport
    reading = transport.is_reading()
    if reading:
        transport.pause_reading()
    try:
        await _flushed(transport, cycle.flow)
        sock = transport.get_extra_info("socket")
        if transport.is_closing() or sock is None:
            raise ConnectionResetError("the connection is closing")
        with sock.dup() as out:
            await _relay(src, out.fileno(), count, timeout)
    except SourceBroken:
        cycle.disconnected = True
        transport.close()
        raise
    except OSError as e:  # the client went away
        cycle.disconnected = True
        transport.close()
        raise ClientGone(f"the client went away: {e}") from e
    finally:
        if reading and not transport.is_closing():
            transport.resume_reading()
    cycle.expected_content_length -= count
    await cycle.send(
        {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
    )


async def _relay(src: int, out: int, count: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe only means more system calls
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        left, in_pipe = count, 0
        while left or in_pipe:
            moved = False
            if left:
                try:
                    n = os.splice(src, w, left, flags=_FLAGS)
                except BlockingIOError:  # nothing to read now, or the pipe is full
                    n = -1
                if n == 0:
                    raise SourceBroken(f"the source ended {left} bytes early")
                if n > 0:
                    left -= n
                    in_pipe += n
                    moved = True
            if in_pipe:
                try:
                    k = os.splice(r, out, in_pipe, flags=_FLAGS)
                except BlockingIOError:
                    k = 0
                in_pipe -= k
                moved = moved or k > 0
            if not moved:
                # the pipe holds bytes: make room first (src may be readable while the pipe
                # is full); only a silent source times out, a slow client is waited for
                if in_pipe:
                    await _either(loop, None, out, None)
                else:
                    await _either(loop, src, None, timeout)
    finally:
        os.close(r)
        os.close(w)


async def _either(
    loop: asyncio.AbstractEventLoop,
    readable: int | None,
    writable: int | None,
    timeout: float | None,
) -> None:
    """Wait until ``readable`` can be read or ``writable`` written (whichever is given)."""
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if readable is not None:
        loop.add_reader(readable, wake)
    if writable is not None:
        loop.add_writer(writable, wake)
    try:
        async with asyncio.timeout(timeout):
            await ready
    except TimeoutError:
        raise SourceBroken(f"no progress for {timeout:.0f}s") from None
    finally:
        if readable is not None:
            loop.remove_reader(readable)
        if writable is not None:
            loop.remove_writer(writable)
