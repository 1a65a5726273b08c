"""A small full-duplex HTTP/1.1 client for the target → transformer hop.

Why not httpx: httpx (httpcore) writes the *whole* request body before it reads
any of the response. A WebDataset transformer streams its output while it
still reads the shard, and stops reading when its output is not consumed
(bounded memory for 1 GB shards). With a shard bigger than the socket buffers
the two sides then wait for each other forever. Here one task writes the
request body while the caller reads the response, so both directions flow at
once.

``DuplexClient.request`` returns as soon as the response *head* arrived (the
body upload may still be going on); ``DuplexResponse.aiter_bytes`` streams the
body. Connections are HTTP/1.1 keep-alive, pooled per ``(host, port)``, and
reused only after a clean, complete exchange in both directions; anything else
(an error, a timeout, a response abandoned half-read, a server answering
before it read the whole body) closes the connection. A body that ends early
(peer closed, bad chunked framing) raises ``StreamBroken``, never a clean end.

Timeouts: ``connect_timeout`` for opening a connection; ``timeout`` bounds each
wait for progress (reading a piece of the response, writing a piece of the
body), like httpx's read/write timeouts, not the whole exchange.

Framing: h11 writes the request (``Content-Length`` for a ``bytes`` body,
chunked transfer encoding for an async iterable one, the body passed through
uncopied) and parses the response *head*, which is cut off the socket stream
first so h11 never sees body bytes. The response body is read straight from
the ``streambuf.ReceiveStream`` (``Content-Length``, chunked, or until close): h11
would copy every body byte twice (into its receive buffer and out of it), the
single most expensive step of this hop for big objects. A connection is then
reused with a fresh h11 state machine. Only ``bytes`` bodies are retried (once,
on a fresh connection) when a pooled connection turns out to be closed before
any answer; idle connections are dropped before the server's keep-alive
timeout (uvicorn: 5 s) to keep that race rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

import h11

from etl_runtime.core import tls
from etl_runtime.core.errors import ConnectError, StreamBroken, Timeout
from etl_runtime.wire.clients import streambuf
from etl_runtime.wire.clients.streambuf import ReceiveStream

READ_SIZE = 1 << 20
STREAM_LIMIT = 1 << 20  # asyncio stream buffer: pauses reading above 2x this
IDLE_SECONDS = 4.0
MAX_IDLE_PER_ENDPOINT = 64

Body = bytes | AsyncIterable[bytes]
_B = TypeVar("_B", bound=bytes | bytearray)


class _Connection:
    """One socket, its h11 state machine, and when it was last idle."""

    def __init__(self, reader: ReceiveStream, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        self.reused = False

    def usable(self) -> bool:
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and time.monotonic() - self.idle_since < IDLE_SECONDS
        )

    def close(self) -> None:
        self.writer.close()


class DuplexResponse:
    """Status and headers of an answer; the body is read with ``aiter_bytes`` or ``read``."""

    def __init__(
        self,
        client: DuplexClient,
        key: tuple[str, int],
        conn: _Connection,
        head: h11.Response,
        sender: asyncio.Task[None],
        timeout: float,
        method: bytes,
    ) -> None:
        self.status_code = head.status_code
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        self._client = client
        self._key = key
        self._conn: _Connection | None = conn
        self._sender = sender
        self._timeout = timeout
        # Body framing (RFC 9112 6.3; h11 already rejected contradictory headers).
        self._length: int | None = None  # None: chunked or until close
        self._chunked = False
        te = self.headers.get("transfer-encoding", "").lower()
        if method == b"HEAD" or self.status_code in (204, 304):
            self._length = 0
        elif te:
            self._chunked = True  # h11 accepts only "chunked" here
        elif "content-length" in self.headers:
            self._length = int(self.headers["content-length"])
        connection = {t.strip() for t in self.headers.get("connection", "").lower().split(",")}
        self._keep_alive = (
            head.http_version == b"1.1"
            and "close" not in connection
            and (self._chunked or self._length is not None)
        )

    async def aiter_bytes(self) -> AsyncIterator[bytes | bytearray]:
        """The body as it arrives; ``StreamBroken``/``Timeout`` if it does not end well."""
        conn = self._conn
        if conn is None:
            raise StreamBroken("response already consumed or closed")
        try:
            if self._chunked:
                async for chunk in self._chunks(conn.reader):
                    yield chunk
            elif self._length is None:
                while chunk := await self._io(conn.reader.read(READ_SIZE)):
                    yield chunk
            else:
                remaining = self._length
                while remaining:
                    chunk = await self._io(self._piece(conn.reader, min(remaining, READ_SIZE)))
                    if not chunk:
                        raise StreamBroken(
                            f"the server closed the connection {remaining} bytes before "
                            f"the end of a {self._length}-byte body"
                        )
                    remaining -= len(chunk)
                    yield chunk
        except BaseException:
            await self.aclose()
            raise
        await self._finish()

    async def _chunks(self, reader: ReceiveStream) -> AsyncIterator[bytes | bytearray]:
        """The data of a chunked body, in pieces of at most ``READ_SIZE``."""
        while True:
            line = await self._io(reader.readuntil(b"\r\n"))
            size_text = line.split(b";", 1)[0].strip()
            try:
                if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                    raise ValueError(size_text)
                size = int(size_text, 16)
            except ValueError:
                raise StreamBroken(f"bad chunk header {line[:40]!r}") from None
            if size == 0:
                while await self._io(reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailer fields: ignored
                return
            while size:
                chunk = await self._io(self._piece(reader, min(size, READ_SIZE)))
                if not chunk:
                    raise StreamBroken("the server closed the connection inside a chunk")
                size -= len(chunk)
                yield chunk
            if await self._io(reader.readexactly(2)) != b"\r\n":
                raise StreamBroken("bad chunked framing: no CRLF after a chunk")

    @staticmethod
    def _piece(reader: ReceiveStream, n: int) -> Awaitable[bytes | bytearray]:
        """``n`` more body bytes we know are coming: a big piece is received in place."""
        return reader.readexactly(n) if n >= streambuf.DIRECT_MIN else reader.read(n)

    async def _io(self, read: Awaitable[_B]) -> _B:
        """One read from the socket: the inactivity timeout, errors as ``DuplexError``."""
        try:
            async with asyncio.timeout(self._timeout):
                return await read
        except TimeoutError:
            raise Timeout(f"no data from the server for {self._timeout:.0f}s") from None
        except asyncio.IncompleteReadError:
            raise StreamBroken("the server closed the connection before the body ended") from None
        except asyncio.LimitOverrunError as e:
            raise StreamBroken(f"bad chunked framing: {e}") from None
        except OSError as e:
            raise StreamBroken(f"connection lost: {e!r}") from e

    async def read(self, limit: int) -> bytes | bytearray:
        """Up to ``limit`` bytes of the body; the whole body if it is no longer.

        Reading to the end keeps the connection for reuse; stopping early
        (body longer than ``limit``) closes it. A ``Content-Length`` body is
        taken out of the stream buffer in pieces of ``READ_SIZE`` (one copy
        each, the inactivity timeout per piece) and joined only when there
        are several.
        """
        conn = self._conn
        if conn is None:
            raise StreamBroken("response already consumed or closed")
        if self._length is None or self._length > limit:
            return await self._read_some(limit)
        pieces: list[bytes | bytearray] = []
        try:
            remaining = self._length
            while remaining:
                n = min(remaining, READ_SIZE)
                pieces.append(await self._io(conn.reader.readexactly(n)))
                remaining -= n
        except BaseException:
            await self.aclose()
            raise
        await self._finish()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _read_some(self, limit: int) -> bytes:
        chunks: list[bytes | bytearray] = []
        size = 0
        try:
            async for chunk in self.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    break
        finally:
            await self.aclose()
        body = b"".join(chunks)
        return body[:limit] if size > limit else body

    async def _finish(self) -> None:
        """The response ended: keep the connection if the request ended cleanly too."""
        conn, self._conn = self._conn, None
        assert conn is not None
        if not self._sender.done():
            # The server answered without reading our whole body: unusable.
            await _cancel(self._sender)
            conn.close()
            return
        if self._keep_alive and self._sender.exception() is None and conn.h11.our_state is h11.DONE:
            self._client._release(self._key, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Abandon the exchange: the connection is closed, never reused."""
        conn, self._conn = self._conn, None
        await _cancel(self._sender)
        if conn is not None:
            conn.close()


class DuplexClient:
    """HTTP/1.1 requests whose body is sent while the response is read."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._tls: dict[tuple[str, int], ssl.SSLContext | None] = {}  # https: SLUICE_CA's
        self._closed = False

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: Body = b"",
        timeout: float = 600.0,
    ) -> DuplexResponse:
        """Send ``method url``; return once the response head is in (body may still be going)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"only http:// and https:// URLs are supported, got {url!r}")
        https = parts.scheme == "https"
        key = (parts.hostname, parts.port or (443 if https else 80))
        self._tls[key] = tls.client_context() if https else None
        target = parts.path or "/"
        query = "&".join(q for q in (parts.query, urlencode(params or {})) if q)
        if query:
            target += "?" + query
        head = [("host", parts.netloc), *(headers or {}).items()]
        if isinstance(body, bytes):
            head.append(("content-length", str(len(body))))
        elif not any(k.lower() == "content-length" for k, _ in head):
            # A stream of a known size may say so (a server that reads no chunked bodies).
            head.append(("transfer-encoding", "chunked"))
        request = h11.Request(method=method, target=target, headers=head)
        for attempt in range(2):
            conn = await self._acquire(key)
            try:
                return await self._exchange(key, conn, request, body, timeout)
            except (StreamBroken, ConnectionError) as e:
                if attempt or not conn.reused or not isinstance(body, bytes):
                    raise StreamBroken(f"{method} {url}: {e}") from e
        raise AssertionError("unreachable")

    async def _exchange(
        self,
        key: tuple[str, int],
        conn: _Connection,
        request: h11.Request,
        body: Body,
        timeout: float,
    ) -> DuplexResponse:
        sender = asyncio.create_task(_send(conn, request, body, timeout))
        try:
            while True:
                event = await _next_event(conn, timeout, sender)
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    return DuplexResponse(self, key, conn, event, sender, timeout, request.method)
                raise StreamBroken(f"expected a response, got {type(event).__name__}")
        except BaseException:
            await _cancel(sender)
            conn.close()
            raise

    async def _acquire(self, key: tuple[str, int]) -> _Connection:
        if self._closed:
            raise RuntimeError("DuplexClient is closed")
        idle = self._idle.get(key, [])
        while idle:
            conn = idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await streambuf.open_connection(
                    *key, limit=STREAM_LIMIT, ssl=self._tls.get(key)
                )
        except TimeoutError:
            raise ConnectError(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as e:
            raise ConnectError(f"cannot connect to {key[0]}:{key[1]}: {e}") from e
        return _Connection(reader, writer)

    def _release(self, key: tuple[str, int], conn: _Connection) -> None:
        # The body was read past h11, which still expects it: a fresh state machine.
        conn.h11 = h11.Connection(h11.CLIENT)
        idle = self._idle.setdefault(key, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_ENDPOINT or not conn.usable():
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _send(conn: _Connection, request: h11.Request, body: Body, timeout: float) -> None:
    """Write the request head and body (the sender task); closes the socket on failure.

    ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` can swallow
    a cancellation that arrives as the awaited drain completes, and an endless
    body would then never stop.
    """
    writer = conn.writer
    try:
        writer.write(conn.h11.send(request) or b"")
        if isinstance(body, bytes):
            if body:
                _write(writer, conn.h11.send_with_data_passthrough(h11.Data(data=body)))
        else:
            async for chunk in body:
                if chunk:
                    _write(writer, conn.h11.send_with_data_passthrough(h11.Data(data=chunk)))
                    async with asyncio.timeout(timeout):
                        await writer.drain()
        writer.write(conn.h11.send(h11.EndOfMessage()) or b"")
        async with asyncio.timeout(timeout):
            await writer.drain()
    except (ConnectionError, h11.LocalProtocolError):
        # The server closed or answered early; the reader reports what it got.
        # h11 refuses to send after the server closed: nothing more to write.
        raise
    except BaseException:
        writer.close()  # a local failure (body source, timeout): the reader must fail too
        raise


def _write(writer: asyncio.StreamWriter, pieces: list[bytes] | None) -> None:
    """Write h11's pieces (framing + our data) without copying the data.

    Not ``writelines``: on Python 3.11 it joins the pieces (a copy of the whole
    body). Each piece goes as a ``memoryview``, so the part the socket does not
    take at once is copied into the transport's buffer once, not sliced first.
    """
    for piece in pieces or ():
        writer.write(memoryview(piece))


async def _next_event(
    conn: _Connection, timeout: float, sender: asyncio.Task[None] | None = None
) -> Any:
    """The next h11 event of the response head.

    h11 is fed exactly the head (up to its blank line), so the body stays in
    the stream reader for ``DuplexResponse`` to read without h11's copies.
    """
    while True:
        try:
            event = conn.h11.next_event()
        except h11.RemoteProtocolError as e:
            raise StreamBroken(f"bad HTTP from the server: {e}") from e
        if event is h11.NEED_DATA:
            eof = False
            try:
                async with asyncio.timeout(timeout):
                    data = await conn.reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                raise Timeout(f"no data from the server for {timeout:.0f}s") from None
            except asyncio.IncompleteReadError as e:
                data, eof = e.partial, True
            except asyncio.LimitOverrunError:
                raise StreamBroken("the server's response head is too long") from None
            except OSError as e:
                raise StreamBroken(f"connection lost: {e!r}") from e
            if eof and sender is not None and sender.done() and not sender.cancelled():
                failure = sender.exception()
                if failure is not None and not isinstance(failure, ConnectionError):
                    raise StreamBroken(f"sending the request failed: {failure!r}") from failure
            conn.h11.receive_data(data)
            if eof:
                conn.h11.receive_data(b"")
            continue
        if event is h11.PAUSED:
            raise StreamBroken("the server sent data after its response")
        if isinstance(event, h11.ConnectionClosed):
            raise StreamBroken("the server closed the connection before the response ended")
        return event


async def _cancel(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        await task
