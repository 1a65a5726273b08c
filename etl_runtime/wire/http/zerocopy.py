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

How the bytes go, after the status line and headers were written (the
same code on asyncio and uvloop):

* The transport holds nothing (the usual case: both loops try to write at
  once): ``os.sendfile`` on the socket right away, as long as it takes bytes;
  an object that fits the socket buffer takes one system call.
* The rest, or everything when the transport still holds bytes: reading is
  paused (so nothing else, a 400 for a bad pipelined request say, writes to
  the socket between our bytes), the transport's buffer is left to empty
  (high-water mark 0, then uvicorn's ``drain``), and ``os.sendfile`` runs
  whenever the socket is writable. Both loops refuse to watch a file
  descriptor that one of their transports owns, so a ``dup`` of the socket
  is watched (``add_writer``). asyncio's ``loop.sendfile`` does these steps
  too but re-arms the selector after every call; uvloop has none.
* ``os.sendfile`` missing, or refused before the first byte (a file system
  without it): the file is read in 1 MiB blocks in a thread and written
  through the transport.

A client that goes away mid-answer ends the answer quietly (no traceback):
the connection is closed, the app's ``send`` returns and the file is closed
by the response. A file that ends before ``count`` (it cannot: objects are
immutable) also closes the connection, so the client sees a short body, never
a complete-looking one. ``sluice_sendfile_bytes_total`` and
``sluice_sendfile_responses_total`` (``SendfileCollector``) count what went
by ``os.sendfile``.

``SLUICE_SENDFILE=0`` turns the extension off (uvicorn's own protocol, the
app reads and copies as before), e.g. to compare (``bench/sendfile.py``). It
is off as well without ``httptools`` (uvicorn then speaks h11), on TLS, and
with a uvicorn whose protocol has no ``_start_asgi_task`` (written against
0.54, whose request-response cycle it drives: ``response_started``,
``expected_content_length``, ``flow``, ``send``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any, cast

import anyio
import anyio.to_thread
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from etl_runtime.core import tls
from etl_runtime.wire.http import splice

EXTENSION = "http.response.zerocopysend"
ENV = "SLUICE_SENDFILE"
COPY_BLOCK = 1 << 20  # the fallback's read size

# os.sendfile's answers that mean "not for this file": copy it instead
_REFUSED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}

# besides ConnectionError (EPIPE, ECONNRESET, ...): what a vanished client looks like
_CLIENT_GONE = {errno.ENOTCONN, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}

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
    if not enabled(environ) or ZeroCopyHttpToolsProtocol is None or tls.serving(environ):
        return "auto"
    return ZeroCopyHttpToolsProtocol


def offers_zerocopy(scope: Scope) -> bool:
    """Whether the server answers ``http.response.zerocopysend`` on this request."""
    return EXTENSION in (scope.get("extensions") or {})


class FileRangeResponse(Response):
    """``count`` bytes of the open ``file`` from ``offset``, sent zero-copy.

    On a server that does not ``offers_zerocopy`` (TLS: the bytes must go
    through the transport to be encrypted) the range is read in ``COPY_BLOCK``
    blocks in a thread and sent as body messages; a file that ends early raises,
    so the connection drops short of the Content-Length. ``headers`` must hold
    the Content-Length. The response closes ``file`` when it is done.
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
            if offers_zerocopy(scope):
                message = {"type": EXTENSION, "file": self.file, "offset": self.offset}
                await send({**message, "count": self.count})
            elif scope.get("method") == "HEAD":
                await send({"type": "http.response.body", "body": b""})
            else:
                await self._copy_until_gone(receive, send)
        if self.background is not None:
            await self.background()

    async def _copy_until_gone(self, receive: Receive, send: Send) -> None:
        """``_copy``, stopped when the client goes away (uvicorn's ``send`` then returns
        without a word: the rest of a big file would be read for nobody)."""
        async with anyio.create_task_group() as tg:

            async def gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(gone)
            await self._copy(send)
            tg.cancel_scope.cancel()

    async def _copy(self, send: Send) -> None:
        fd, offset, left = self.file.fileno(), self.offset, self.count
        while left:
            block = await anyio.to_thread.run_sync(os.pread, fd, min(COPY_BLOCK, left), offset)
            if not block:  # objects are replaced by rename, never cut: a disk fault
                raise OSError(f"the file ended {left} bytes before its Content-Length")
            offset += len(block)
            left -= len(block)
            await send({"type": "http.response.body", "body": block, "more_body": bool(left)})
        if not self.count:
            await send({"type": "http.response.body", "body": b""})


class SendfileCollector:
    """``sluice_sendfile_{bytes,responses}_total{target}``: what this process sent by
    ``os.sendfile``, labelled like the target's other figures."""

    def __init__(self, target_id: str) -> None:
        self.target_id = target_id

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for name, text, value in (
            ("bytes", "Response bytes sent zero-copy by os.sendfile (plain GETs).", COUNTERS.bytes),
            ("responses", "Responses whose body was sent with os.sendfile.", COUNTERS.responses),
        ):
            family = CounterMetricFamily(f"sluice_sendfile_{name}", text, labels=["target"])
            family.add_metric([self.target_id], value)
            yield family


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
        except OSError as e:
            # The client went away: end quietly, as uvicorn does. Anything else
            # (a disk error) is logged; either way the client sees a short body.
            if not isinstance(e, ConnectionError) and e.errno not in _CLIENT_GONE:
                log.error("GET %s failed after its headers: %s", cycle.scope["path"], e)
            cycle.disconnected = True
            transport.close()
            return
        cycle.expected_content_length -= sent
        if sent < count:
            log.error(
                "GET %s: the file ended %d bytes before its Content-Length",
                cycle.scope["path"],
                count - sent,
            )
            cycle.disconnected = True
            transport.close()
            return
    await cycle.send(
        {"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)}
    )


async def _send_range(
    transport: asyncio.Transport, flow: Any, file: IO[bytes], offset: int, count: int
) -> int:
    """Bytes of ``file`` sent: by ``os.sendfile`` where the platform and file allow, else copied."""
    return await _FileSend(transport, flow, file.fileno(), offset, count).run()


class _Refused(Exception):
    """``os.sendfile`` does not take this file (before its first byte): copy it."""


class _FileSend:
    """``count`` bytes of the file ``in_fd`` from ``offset`` to the transport's socket."""

    def __init__(
        self, transport: asyncio.Transport, flow: Any, in_fd: int, offset: int, count: int
    ) -> None:
        self.transport, self.flow = transport, flow
        self.in_fd, self.offset, self.count = in_fd, offset, count
        self.sent = 0

    async def run(self) -> int:
        if self.transport.is_closing():
            raise ConnectionResetError("the connection is closing")
        sock = self.transport.get_extra_info("socket")
        try:
            if sock is None or not hasattr(os, "sendfile"):
                raise _Refused
            # The headers are in the kernel already (the usual case): send now;
            # a range that fits the socket's buffer takes one system call.
            if self.transport.get_write_buffer_size() or self._sendfile(sock.fileno()):
                await self._sendfile_when_writable(sock)
        except _Refused:
            await self._copy()
        return self.sent

    def _sendfile(self, out_fd: int) -> bool:
        """Send until the range is done or the file ended (False), or the socket is full (True)."""
        while self.sent < self.count:
            try:
                n = os.sendfile(out_fd, self.in_fd, self.offset + self.sent, self.count - self.sent)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:
                if not self.sent and e.errno in _REFUSED:
                    raise _Refused from e
                raise  # the client went away (EPIPE, ECONNRESET, ENOTCONN)
            if n == 0:
                break  # the file ended early
            if not self.sent:
                COUNTERS.responses += 1
            self.sent += n
            COUNTERS.bytes += n
        return False

    async def _sendfile_when_writable(self, sock: Any) -> None:
        """The rest of the range, waiting for room in the socket as often as needed.

        Reading is paused meanwhile, so nothing else (a 400 for a bad pipelined
        request, say) writes to the socket between our bytes. The loops refuse
        to watch a file descriptor a transport owns: we watch a ``dup`` of it.
        """
        loop = asyncio.get_running_loop()
        transport = self.transport
        reading = transport.is_reading()
        if reading:
            transport.pause_reading()
        try:
            await _flushed(transport, self.flow)
            if transport.is_closing():
                raise ConnectionResetError("the connection is closing")
            with sock.dup() as out:
                while self._sendfile(out.fileno()):
                    await _writable(loop, out.fileno())
        finally:
            if reading and not transport.is_closing():
                transport.resume_reading()

    async def _copy(self) -> None:
        """The fallback: read blocks in a thread, write them through the transport."""
        while self.sent < self.count:
            block = await anyio.to_thread.run_sync(
                os.pread,
                self.in_fd,
                min(COPY_BLOCK, self.count - self.sent),
                self.offset + self.sent,
            )
            if not block:
                break
            if self.flow.write_paused:
                await self.flow.drain()
            if self.transport.is_closing():
                raise ConnectionResetError("the connection is closing")
            self.transport.write(block)
            self.sent += len(block)


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


def _with_zerocopy(app: ASGIApp, cycle: Any) -> ASGIApp:
    async def app_with_zerocopy(scope: Scope, receive: Receive, send: Send) -> None:
        if cycle.transport.get_extra_info("sslcontext") is None:
            scope.setdefault("extensions", {})[EXTENSION] = {}
            if splice.available():
                scope["extensions"][splice.MESSAGE] = {}

        async def send_or_sendfile(message: Message) -> None:
            if message["type"] == EXTENSION:
                await _send_file(cycle, message)
            elif message["type"] == splice.MESSAGE:  # wire/http/splice.py: socket to socket
                await splice.send_spliced(cycle, message)
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
    # An older uvicorn without the hook: GETs are copied (hooks.py says so at start-up).
    class _ZeroCopyHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, answering ``http.response.zerocopysend`` too."""

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            # Every request starts here, pipelined ones included.
            super()._start_asgi_task(cycle, cast(Any, _with_zerocopy(app, cycle)))

    ZeroCopyHttpToolsProtocol = (
        _ZeroCopyHttpToolsProtocol if hasattr(HttpToolsProtocol, "_start_asgi_task") else None
    )
