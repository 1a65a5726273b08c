"""Zero-copy file answers: uvicorn with the ASGI ``http.response.zerocopysend`` extension.

uvicorn sends only the bytes an app hands it, so a plain GET used to read the
object into Python (``pread`` in a thread, or 1 MiB chunks) and copy it into
the socket. ``ZeroCopyHttpToolsProtocol`` (uvicorn's ``http=``, set by
``target.serving``) advertises the ASGI spec's *Zero Copy Send* extension in
``scope["extensions"]`` and answers its message,
``{"type": "http.response.zerocopysend", "file": f, "offset": o, "count": n}``,
by ``os.sendfile`` from the open file to the socket: the kernel moves the
bytes, no Python buffer holds them. ``FileRangeResponse`` is the Starlette
response that sends it; the target's plain GET uses it for whole objects and
ranges alike. The open file, not a path, travels in the message: an object
replaced by rename meanwhile does not change the bytes behind the headers
(ETag, Content-Length) already sent.

How the bytes go, after the status line and headers were written:

* asyncio: ``loop.sendfile(transport, ...)``, the standard library's own
  zero-copy send; it pauses reading, waits until the transport's buffer is
  empty and calls ``os.sendfile`` whenever the socket is writable.
* uvloop has no ``loop.sendfile`` and refuses to watch a file descriptor one
  of its transports owns. The same steps here: pause reading, wait until the
  buffer is empty (high-water mark 0, then uvicorn's own ``drain``), then
  ``os.sendfile`` on a ``dup`` of the socket, waiting for writability on that
  dup with ``add_writer``. Reading stays paused, so nothing else (a 400 for a
  bad pipelined request, say) writes to the socket meanwhile.
* Anything else (a platform without ``os.sendfile``, a file system that
  refuses it before the first byte): the file is read in 1 MiB blocks in a
  thread and written through the transport, as before.

A client that goes away mid-answer ends the answer quietly (no traceback):
the connection is closed, the app's ``send`` returns and the file is closed
by the response. A file that ends before ``count`` (it cannot: objects are
immutable) also closes the connection, so the client sees a short body, never
a complete-looking one. ``sluice_sendfile_bytes_total`` and
``sluice_sendfile_responses_total`` (``SendfileCollector``) count what went
by ``os.sendfile``.

``SLUICE_SENDFILE=0`` turns the extension off (uvicorn's own protocol, the
app reads and copies as before), e.g. to compare (``bench/sendfile.py``). It
is off as well without ``httptools`` (uvicorn then speaks h11) and on TLS.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any, cast

import anyio.to_thread
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EXTENSION = "http.response.zerocopysend"
ENV = "SLUICE_SENDFILE"
COPY_BLOCK = 1 << 20  # the fallback's read size

# os.sendfile's answers that mean "not for this file": copy it instead
_REFUSED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}

log = logging.getLogger("sluice.zerocopy")


class Counters:
    """What this process sent with ``os.sendfile`` (all its servers together)."""

    def __init__(self) -> None:
        self.responses = 0
        self.bytes = 0


COUNTERS = Counters()


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """``SLUICE_SENDFILE``: on unless ``0``, ``false``, ``off``, ``no``; else ``ValueError``."""
    raw = environ.get(ENV, "")
    value = raw.strip().lower()
    if value in ("", "1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{ENV}={raw!r} is not a switch: use 1 (default) or 0")


def http_protocol(environ: Mapping[str, str] = os.environ) -> type[asyncio.Protocol] | str:
    """uvicorn's ``http=``: the zero-copy protocol, or ``"auto"`` (off, or no httptools)."""
    if not enabled(environ) or ZeroCopyHttpToolsProtocol is None:
        return "auto"
    return ZeroCopyHttpToolsProtocol


def offers_zerocopy(scope: Scope) -> bool:
    """Whether the server answers ``http.response.zerocopysend`` on this request."""
    return EXTENSION in (scope.get("extensions") or {})


class FileRangeResponse(Response):
    """``count`` bytes of the open ``file`` from ``offset``, sent zero-copy.

    Only for a server that ``offers_zerocopy``; ``headers`` must hold the
    Content-Length. The response closes ``file`` when it is done.
    """

    def __init__(
        self,
        file: IO[bytes],
        offset: int,
        count: int,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        background: BackgroundTask | None = None,
    ) -> None:
        super().__init__(None, status_code, headers, media_type, background)
        self.file, self.offset, self.count = file, offset, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.file:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            await send(
                {"type": EXTENSION, "file": self.file, "offset": self.offset, "count": self.count}
            )
        if self.background is not None:
            await self.background()


class SendfileCollector:
    """``sluice_sendfile_{bytes,responses}_total``: what this process sent by ``os.sendfile``."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "sluice_sendfile_bytes",
            "Response bytes sent zero-copy with os.sendfile (plain GETs).",
            value=COUNTERS.bytes,
        )
        yield CounterMetricFamily(
            "sluice_sendfile_responses",
            "Responses whose body was sent with os.sendfile.",
            value=COUNTERS.responses,
        )


async def _send_file(cycle: Any, message: Message) -> None:
    """Answer one ``zerocopysend`` message on uvicorn's request-response ``cycle``."""
    if not cycle.response_started or cycle.response_complete:
        raise RuntimeError(f"'{EXTENSION}' outside of a started response")
    if cycle.chunked_encoding:
        raise RuntimeError(f"'{EXTENSION}' needs a response with a Content-Length")
    file: IO[bytes] = message["file"]
    offset = message.get("offset")
    count = message.get("count")
    if offset is None:
        offset = file.tell()
    if count is None:
        count = os.fstat(file.fileno()).st_size - offset
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    if count and cycle.scope["method"] != "HEAD":
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        transport: asyncio.Transport = cycle.transport
        try:
            sent = await _send_range(transport, cycle.flow, file, offset, count)
        except OSError:  # the client went away: end quietly, as uvicorn does
            cycle.disconnected = True
            transport.close()
            return
        cycle.expected_content_length -= sent
        if sent < count:
            log.error("file ended %d bytes before the promised Content-Length", count - sent)
            cycle.disconnected = True
            transport.close()
            return
    await cycle.send(
        {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
    )


async def _send_range(
    transport: asyncio.Transport, flow: Any, file: IO[bytes], offset: int, count: int
) -> int:
    """Bytes of ``file`` sent: by sendfile where the loop and file allow, else copied."""
    loop = asyncio.get_running_loop()
    if transport.is_closing():
        raise ConnectionResetError("the connection is closing")
    if isinstance(loop, asyncio.BaseEventLoop):
        try:
            sent = await loop.sendfile(transport, file, offset, count, fallback=False)
        except OSError:
            # It leaves the file's position after the last byte it sent.
            COUNTERS.bytes += max(0, file.tell() - offset)
            raise
        except asyncio.SendfileNotAvailableError:
            # Also what a client gone before the first byte looks like.
            if transport.is_closing():
                raise ConnectionResetError("the connection is closing") from None
        else:
            COUNTERS.responses += 1
            COUNTERS.bytes += sent
            return sent
    else:
        done = await _sendfile_on_dup(loop, transport, flow, file, offset, count)
        if done is not None:
            return done
    return await _copy(transport, flow, file, offset, count)


async def _flushed(transport: asyncio.Transport, flow: Any) -> None:
    """Wait until the transport's write buffer (the status line and headers) is empty."""
    if not transport.get_write_buffer_size():
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0)  # pause_writing now, resume_writing once empty
    try:
        while transport.get_write_buffer_size() and not transport.is_closing():
            if flow.write_paused:
                await flow.drain()
            else:  # not paused though not empty: should not happen, poll gently
                await asyncio.sleep(0.001)
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


async def _sendfile_on_dup(
    loop: asyncio.AbstractEventLoop,
    transport: asyncio.Transport,
    flow: Any,
    file: IO[bytes],
    offset: int,
    count: int,
) -> int | None:
    """``os.sendfile`` to a dup of the transport's socket; None if sendfile is refused at once."""
    if not hasattr(os, "sendfile"):
        return None
    reading = transport.is_reading()
    if reading:
        transport.pause_reading()
    try:
        await _flushed(transport, flow)
        if transport.is_closing():
            raise ConnectionResetError("the connection is closing")
        sock = transport.get_extra_info("socket").dup()
        sent = 0
        with sock:
            out_fd, in_fd = sock.fileno(), file.fileno()
            while sent < count:
                try:
                    n = os.sendfile(out_fd, in_fd, offset + sent, count - sent)
                except (BlockingIOError, InterruptedError):
                    await _writable(loop, out_fd)
                    continue
                except OSError as e:
                    if sent or e.errno not in _REFUSED:
                        raise  # the client went away (EPIPE, ECONNRESET, ENOTCONN)
                    return None  # a file system without sendfile: copy instead
                if n == 0:
                    break  # the file ended early
                if not sent:
                    COUNTERS.responses += 1
                sent += n
                COUNTERS.bytes += n
        return sent
    finally:
        if reading and not transport.is_closing():
            transport.resume_reading()


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


async def _copy(
    transport: asyncio.Transport, flow: Any, file: IO[bytes], offset: int, count: int
) -> int:
    """The fallback: read blocks in a thread, write them through the transport."""
    sent = 0
    while sent < count:
        block = await anyio.to_thread.run_sync(
            os.pread, file.fileno(), min(COPY_BLOCK, count - sent), offset + sent
        )
        if not block:
            break
        if flow.write_paused:
            await flow.drain()
        if transport.is_closing():
            raise ConnectionResetError("the connection is closing")
        transport.write(block)
        sent += len(block)
    return sent


def _with_zerocopy(app: ASGIApp, cycle: Any) -> ASGIApp:
    async def app_with_zerocopy(scope: Scope, receive: Receive, send: Send) -> None:
        if cycle.transport.get_extra_info("sslcontext") is None:
            scope.setdefault("extensions", {})[EXTENSION] = {}

        async def send_or_sendfile(message: Message) -> None:
            if message["type"] == EXTENSION:
                await _send_file(cycle, message)
            else:
                await send(message)

        await app(scope, receive, send_or_sendfile)

    return app_with_zerocopy


ZeroCopyHttpToolsProtocol: type[asyncio.Protocol] | None
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn speaks h11, without the extension
    ZeroCopyHttpToolsProtocol = None
else:

    class _ZeroCopyHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, answering ``http.response.zerocopysend`` too."""

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            # Every request starts here, pipelined ones included.
            super()._start_asgi_task(cycle, cast(Any, _with_zerocopy(app, cycle)))

    ZeroCopyHttpToolsProtocol = _ZeroCopyHttpToolsProtocol
