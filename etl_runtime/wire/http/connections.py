"""Bounded, timed connections for every Sluice HTTP server (target, gateway, transformer).

Issue 20: 1,100 idle TCP connections took a server's every file descriptor
(the default soft limit is often 1024): uvicorn could accept nobody else, so
other clients' requests failed, and it closed almost none of the idle sockets,
since uvicorn (0.54) arms its keep-alive timer only after a response (a
connection that never sends a request stays open forever) and has no cap on
connections. Three parts, all set up per server process:

* ``raise_fd_limit()``: the open-files soft limit goes up to the hard limit at
  start (``RLIMIT_NOFILE``), logged.
* **Header timeout** (``SLUICE_HEADER_TIMEOUT``, default 10 s, ``0`` = off): a
  connection must send a request's whole head (request line and headers)
  within that many seconds of opening, or of the first byte of a later request
  on it; otherwise it is closed (with a ``408`` if some of the request came).
  A slow trickle does not restart the clock. It does not apply to a request's
  body, nor to a kept-alive connection between requests: that one keeps
  uvicorn's ``timeout_keep_alive`` (75 s on the target and gateway, so pooled
  clients' connections survive a paused target).
* **Head size**: a request line and headers over ``MAX_HEAD_BYTES`` (64 KiB)
  are answered ``431`` and the connection closed, before more of them is kept.
* **Connection cap** (``SLUICE_MAX_CONNECTIONS``, ``0`` = none; default from
  the open-files limit, see ``default_max_connections``): a connection that
  would exceed it makes the server close the connection idle the longest (no
  request in progress: kept-alive, never used, or still sending its head), so
  a new client is served rather than idle sockets keeping it out. When every
  connection is busy there is nothing to close: the new connection's request
  is answered ``503`` with ``Connection: close`` (uvicorn's own answer,
  ``flow_control.service_unavailable``, what its ``limit_concurrency`` sends).

Why our own code: uvicorn has no header timeout, and its ``limit_concurrency``
only answers 503 (it never closes an idle connection), so idle sockets still
hold every descriptor. Nor does it serve for the 503 past our cap: it counts
the connections we closed to make room until their close completes (a later
loop iteration on uvloop), so it refused the very client we had made room for.
``http_protocol()`` therefore subclasses the uvicorn HTTP protocol the server
would use (the zero-copy one of ``zerocopy.py``, httptools', or h11's),
touching only what both of uvicorn's protocols share (``connection_made``,
``data_received``, ``on_response_complete``, ``connection_lost``, ``cycle``,
``transport``, ``loop``, ``app``) and the loop's ``call_later``, so it runs the
same on asyncio and uvloop. Each ``http_protocol()`` call makes a class with
its own ``Tracker``: one per uvicorn server, so per process (every
``--servers`` process builds its own).

A partial next request that a client pipelined while the previous answer was
still being sent waits under the keep-alive timeout, not the header timeout
(rare, and still bounded).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import resource
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.flow_control import service_unavailable

from etl_runtime.core import tls
from etl_runtime.wire.http import hooks, inprotocol
from etl_runtime.wire.http.inprotocol import Answerer, Starter

HEADER_TIMEOUT_ENV = "SLUICE_HEADER_TIMEOUT"
MAX_CONNECTIONS_ENV = "SLUICE_MAX_CONNECTIONS"
HEADER_TIMEOUT = 10.0  # seconds: nginx's client_header_timeout is 60 s, Go's servers set 5-30
# Default cap: the soft open-files limit less a reserve for everything else a
# server holds open (object files being sent, connections to peers and
# transformers, worker pipes, logs): a quarter of it, at least 64; and at most
# 65536 connections, since each costs memory too (Kubernetes often gives 1M files).
MAX_CONNECTIONS_CEILING = 65536
WARNING_INTERVAL_SECONDS = 60.0  # at most one "at the cap" warning a minute

log = logging.getLogger("uvicorn.error")  # the server's own log, set up by uvicorn

# A request's head (request line and headers) longer than this is refused with a 431
# and the connection closed: uvicorn bounds neither (httptools kept a 64 MiB header).
# S3 allows 8 KiB of headers; a Sluice token naming a hundred buckets is about 9 KiB.
MAX_HEAD_BYTES = 64 << 10
_TOO_LARGE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 31\r\n"
    b"connection: close\r\n\r\n"
    b"Request Header Fields Too Large"
)
_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 15\r\n"
    b"connection: close\r\n\r\n"
    b"Request Timeout"
)


@dataclass(frozen=True)
class FdLimit:
    """The open-files limit before and after ``raise_fd_limit``."""

    before: int
    soft: int
    hard: int

    def describe(self) -> str:
        hard = "unlimited" if self.hard == resource.RLIM_INFINITY else str(self.hard)
        if self.soft != self.before:
            return f"open files limit raised from {self.before} to {self.soft} (hard {hard})"
        return f"open files limit {self.soft} (hard {hard})"


def raise_fd_limit() -> FdLimit:
    """Raise this process's open-files soft limit to its hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= want:
        return FdLimit(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as e:  # e.g. macOS caps it lower than the hard limit
        log.warning("cannot raise the open files limit from %d to %d: %s", soft, want, e)
        return FdLimit(soft, soft, hard)
    return FdLimit(soft, want, hard)


def default_max_connections(fd_soft: int) -> int:
    """The cap when ``SLUICE_MAX_CONNECTIONS`` is unset (1024 files: 768 connections)."""
    if fd_soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS_CEILING
    return min(MAX_CONNECTIONS_CEILING, max(16, fd_soft - max(64, fd_soft // 4)))


@dataclass(frozen=True)
class Limits:
    """What a server process allows: ``None``/``0`` turn the timeout/cap off."""

    header_timeout: float | None = HEADER_TIMEOUT
    max_connections: int = 0
    fd: FdLimit | None = None

    def describe(self) -> str:
        cap = f"at most {self.max_connections} connections" if self.max_connections else "no cap"
        head = (
            f"request heads within {self.header_timeout:g} s"
            if self.header_timeout
            else "no header timeout"
        )
        fd = f"{self.fd.describe()}; " if self.fd is not None else ""
        cap += f" (oldest idle closed first, {MAX_CONNECTIONS_ENV})"
        return f"{fd}{cap}; {head} ({HEADER_TIMEOUT_ENV})"


def limits_from_env(environ: Mapping[str, str] = os.environ, fd: FdLimit | None = None) -> Limits:
    """``SLUICE_HEADER_TIMEOUT`` and ``SLUICE_MAX_CONNECTIONS``; ``ValueError`` names a bad one."""
    raw = environ.get(HEADER_TIMEOUT_ENV, "").strip()
    try:
        timeout = float(raw) if raw else HEADER_TIMEOUT
    except ValueError:
        timeout = math.nan
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(
            f"{HEADER_TIMEOUT_ENV}={raw!r} is not a number of seconds: use e.g. 10, or 0 for none"
        )
    raw = environ.get(MAX_CONNECTIONS_ENV, "").strip()
    if raw:
        try:
            cap = int(raw)
        except ValueError:
            cap = -1
        if cap < 0:
            raise ValueError(
                f"{MAX_CONNECTIONS_ENV}={raw!r} is not a number of connections: "
                "use e.g. 10000, or 0 for no cap"
            )
    else:
        soft = fd.soft if fd is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        cap = default_max_connections(soft)
    return Limits(timeout or None, cap, fd)


def setup(environ: Mapping[str, str] = os.environ) -> Limits:
    """Once per server process, before it serves: raise the fd limit, read the env
    (``SLUICE_TLS_*``/``SLUICE_CA`` too: a bad one is a ``ValueError`` naming it)."""
    tls.check(environ)
    return limits_from_env(environ, raise_fd_limit())


def tls_options(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``uvicorn.Config`` keywords for HTTPS when ``SLUICE_TLS_CERT``/``KEY`` are set
    (``core/tls.py``: TLS 1.2+, ALPN http/1.1), else none."""
    files = tls.server_files(environ)
    if files is None:
        return {}
    return {
        "ssl_certfile": files.cert,
        "ssl_keyfile": files.key,
        "ssl_context_factory": lambda config, default: tls.server_context(files),
    }


def server_options(
    http: type[asyncio.Protocol] | str,
    limits: Limits,
    answerer: Answerer | None = None,
    starter: Starter | None = None,
) -> dict[str, Any]:
    """``uvicorn.Config`` keywords: ``http``, the guarded protocol, and HTTPS's
    (``tls_options``).

    The first call in a process says which fast paths are off (``hooks.py``)."""
    hooks.announce()
    return {"http": http_protocol(http, limits, answerer, starter), **tls_options()}


def http_protocol(
    http: type[asyncio.Protocol] | str,
    limits: Limits,
    answerer: Answerer | None = None,
    starter: Starter | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's ``http=`` protocol (a class, or ``auto``/``httptools``/``h11``), guarded;
    with ``answerer``, small requests it answers skip ASGI, and ``starter`` sees each
    request before its ASGI task is made (``wire/http/inprotocol.py``)."""
    base = _protocol_class(http)
    name = f"Guarded{base.__name__}"
    attrs: dict[str, Any] = {"tracker": Tracker(limits)}
    bases: tuple[type, ...] = (_Guard, base)
    if (answerer is not None or starter is not None) and inprotocol.has_hook(base):
        bases = (_Guard, inprotocol.InProtocolAnswers, base)
        attrs["answerer"] = (answerer,) if answerer is not None else ()
        attrs["starter"] = (starter,) if starter is not None else ()
    return cast(type[asyncio.Protocol], type(name, bases, attrs))


def _protocol_class(http: type[asyncio.Protocol] | str) -> type[asyncio.Protocol]:
    if not isinstance(http, str):
        return http
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise
        else:
            return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


class Tracker:
    """One server's open connections, and the idle ones oldest first."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: set[_Guard] = set()
        self.idle: OrderedDict[_Guard, None] = OrderedDict()  # idle since: oldest first
        self.evicted = 0  # closed to make room under the cap
        self.timed_out = 0  # closed by the header timeout
        self._warned = -math.inf

    def opened(self, conn: _Guard) -> bool:
        """Track a new connection; False if it is over the cap (every other one busy)."""
        cap = self.limits.max_connections
        if cap and len(self.open) >= cap:
            self._make_room(cap)
        room = not cap or len(self.open) < cap
        self.open.add(conn)
        self.idle[conn] = None
        return room

    def _make_room(self, cap: int) -> None:
        count, closed = len(self.open), 0
        while len(self.open) >= cap and self.idle:
            oldest, _ = self.idle.popitem(last=False)
            self.open.discard(oldest)
            oldest.transport.close()
            closed += 1
        self.evicted += closed
        now = time.monotonic()
        if now - self._warned >= WARNING_INTERVAL_SECONDS:
            self._warned = now
            what = (
                "closing the oldest idle ones"
                if closed
                else "every one is busy: new requests get 503"
            )
            log.warning(
                "%d connections open, at the cap (%s=%d): %s (%d closed so far, %d by %s)",
                count,
                MAX_CONNECTIONS_ENV,
                cap,
                what,
                self.evicted,
                self.timed_out,
                HEADER_TIMEOUT_ENV,
            )

    def busy(self, conn: _Guard) -> None:
        self.idle.pop(conn, None)

    def rested(self, conn: _Guard) -> None:
        if conn in self.open:
            self.idle[conn] = None
            self.idle.move_to_end(conn)

    def closed(self, conn: _Guard) -> None:
        self.open.discard(conn)
        self.idle.pop(conn, None)


class _Guard(asyncio.Protocol):
    """Mixed in before a uvicorn HTTP protocol class: the header timer and the tracker."""

    tracker: ClassVar[Tracker]
    transport: asyncio.Transport
    app: Any
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = False  # some of the current request's head has come
    _head_size = 0  # how much of it: at most MAX_HEAD_BYTES
    answered_in_protocol = False  # wire/http/inprotocol.py answered a request in this data_received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.tracker.opened(self):
            self.app = service_unavailable  # 503, Connection: close
        self._arm()

    def data_received(self, data: bytes) -> None:
        idle = not self._busy()
        before = getattr(self, "cycle", None)  # the last request's (uvicorn's RequestResponseCycle)
        draining = before is not None and getattr(before, "more_body", False)  # answered early
        self.answered_in_protocol = False
        super().data_received(data)
        if idle and not draining:  # these bytes were a head's, or began one
            ended = getattr(self, "cycle", None) is not before  # a head was parsed whole
            self._head_size = 0 if ended else self._head_size + len(data)
        if self._busy():
            self._head_size = 0
            self._disarm()
            self.tracker.busy(self)
        elif (
            self.answered_in_protocol
        ):  # a whole request came and was answered (wire/http/inprotocol.py)
            self._head_size = 0
            self._disarm()
        elif idle and data and not self.transport.is_closing():
            if self._head_size > MAX_HEAD_BYTES:  # still no whole head: refused
                self._refuse_head()
                return
            self._head_bytes = True
            if self._head_timer is None:  # a later request's first bytes
                self._arm()

    def on_response_complete(self) -> None:
        cast(Any, super()).on_response_complete()
        if not self.transport.is_closing() and not self._busy():
            self._head_bytes, self._head_size = False, 0
            self.tracker.rested(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._disarm()
        self.tracker.closed(self)

    def shutdown(self) -> None:
        """uvicorn's, as the server stops: an idle connection is closed. Over TLS a
        close sends close_notify and waits for the peer's (asyncio's and uvloop's SSL
        transports, up to their 30 s ``ssl_shutdown_timeout``), which an idle pooled
        client never sends, since nothing reads that connection: the server waited
        until it was killed. Nothing is in flight on it, so it is dropped instead."""
        if not self._busy() and self.transport.get_extra_info("sslcontext") is not None:
            self._disarm()
            self.transport.abort()
            return
        cast(Any, super()).shutdown()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        self._disarm()  # the connection moves to a websocket protocol: not ours any more
        self.tracker.closed(self)
        cast(Any, super()).handle_websocket_upgrade(*args)

    def _busy(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _arm(self) -> None:
        timeout = self.tracker.limits.header_timeout
        if timeout:
            loop = cast(Any, self).loop
            self._head_timer = loop.call_later(timeout, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse_head(self) -> None:
        self._disarm()
        self.tracker.closed(self)
        self.transport.write(_TOO_LARGE_431)
        self.transport.close()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._busy() or self.transport.is_closing():
            return
        self.tracker.timed_out += 1
        self.tracker.closed(self)
        if self._head_bytes:
            self.transport.write(_TIMEOUT_408)
        self.transport.close()
