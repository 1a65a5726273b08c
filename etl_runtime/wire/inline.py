"""Answering a request inside uvicorn's HTTP protocol, before any ASGI: the small GET.

A 16 KiB object GET on a target is a few microseconds of work (an open, an
fstat, a getxattr, a pread) wrapped in a lot of serving: uvicorn builds a
scope and starts a task for the request, the task runs on the next loop
iteration, and the answer goes through four middlewares, Starlette's
``Request`` and ``Response`` and uvicorn's per-header checks. Timed inside
the owner of an S3 GetObject relayed by the gateway (the 16 KiB row of issue
22, boto3 one request at a time, so every process wakes cold), the target
took 600–680 µs from the request's bytes to its answer's, and uvicorn's
bare protocol with a one-line app takes 30–40 µs (docs/benchmarks.md, "S3
API": "Small GETs answered inline").

So a server may give ``http_protocol(..., answerer=)`` a function that looks
at a request's scope as soon as its head is parsed and either returns the
whole answer (status, headers, body), written at once, or ``None``: then the
request goes the ASGI way as before. The answerer must be quick and must not
block (it runs on the event loop, inside ``data_received``), and must answer
exactly what the ASGI route would: it declines whatever it does not handle
itself (``storage_target/inline.py`` declines everything but a plain GET of
a small local object, with no query, no conditional headers and no body).

A server may also give a ``starter``: called with each request's scope as
soon as its head is parsed, before the ASGI task is made, it may start work
the app will need and leave it in the scope (the gateway sends a plain S3
GetObject to the owner there, ``gateway/s3/early.py``), and returns what to
call once the app is done with the request (to drop what the app did not use).

Only uvicorn's httptools protocol has the hook (``_start_asgi_task``, which
``zerocopy.py`` overrides too); under h11 no request is answered inline.
A request with a body (``Content-Length`` other than 0, or
``Transfer-Encoding``) is never answered inline, nor one past a connection
cap (its app is uvicorn's 503), nor one that arrives while the connection's
writing is paused (a client that pipelines requests and does not read its
answers): the ASGI way waits for it, so answers never pile up in memory.
A pipelined request that uvicorn starts from inside an inline answer's
completion goes the ASGI way too (answering it there would nest one call per
pipelined request: a burst of them was a ``RecursionError``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.flow_control import service_unavailable

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]  # lower-case names, as ASGI's
Answer = tuple[int, Headers, bytes]
Answerer = Callable[[dict[str, Any]], Answer | None]
# Called with a request's scope before its ASGI task is made: it may start work the app
# will use (put in the scope) and return what to call once the app is done, or None.
Starter = Callable[[dict[str, Any]], Callable[[], None] | None]

_BODY_HEADERS = (b"content-length", b"transfer-encoding")

try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE
except ImportError:  # no httptools: nothing is answered inline
    STATUS_LINE = {}


def has_hook(base: type) -> bool:
    """Whether ``base`` (a uvicorn HTTP protocol class) can answer inline."""
    return hasattr(base, "_start_asgi_task") and bool(STATUS_LINE)


def _without_body(headers: Headers) -> bool:
    for name, value in headers:
        if name in _BODY_HEADERS and (name != b"content-length" or value.strip() != b"0"):
            return False
    return True


class InlineAnswers:
    """Mixed in before uvicorn's httptools protocol: ``answerer`` first, ASGI otherwise."""

    answerer: ClassVar[tuple[Answerer, ...]] = ()  # one function (a tuple: no binding)
    starter: ClassVar[tuple[Starter, ...]] = ()
    answered_inline = False  # set when a request was answered during data_received
    _inlining = False  # inside an inline answer's completion
    app: Any
    transport: Any
    server_state: Any
    flow: Any

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if app is not service_unavailable:
            # Not from inside an inline answer's completion (a pipelined request uvicorn
            # starts there): that would nest one call per pipelined request.
            if self.answerer and not self._inlining and self._inline(cycle):
                return
            if self.starter:
                app = self._started(cycle.scope, app)
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def _started(self, scope: dict[str, Any], app: Any) -> Any:
        try:
            done = self.starter[0](scope)
        except Exception:  # the app does the work itself
            log.exception("starting %s %s early failed", scope["method"], scope["path"])
            return app
        if done is None:
            return app

        async def app_then_done(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            finally:
                done()

        return app_then_done

    def _inline(self, cycle: Any) -> bool:
        scope = cycle.scope
        if self.flow.write_paused or not _without_body(scope["headers"]):
            # A client that does not read: the ASGI way waits for it (and stops reading
            # its pipelined requests) where answers written here would pile up unsent.
            return False
        try:
            answer = self.answerer[0](scope)
        except Exception:  # the ASGI route answers, with its error handling
            log.exception("answering %s %s inline failed", scope["method"], scope["path"])
            return False
        if answer is None:
            return False
        status, headers, body = answer
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", body]
        cycle.response_started = cycle.response_complete = True
        self.answered_inline = True
        self.transport.write(b"".join(head))
        if not cycle.keep_alive:
            self.transport.close()
        self._inlining = True
        try:
            self.on_response_complete()  # type: ignore[attr-defined]  # keep-alive, pipelining
        finally:
            self._inlining = False
        return True
