"""Answering a request inside uvicorn's HTTP protocol, before any ASGI: the small GET and share.

A 16 KiB object GET on a target is a few microseconds of work (an open, an
fstat, a getxattr, a pread) wrapped in a lot of serving: uvicorn builds a
scope and starts a task for the request, the task runs on the next loop
iteration, and the answer goes through four middlewares, Starlette's
``Request`` and ``Response`` and uvicorn's per-header checks. Timed inside
the owner of an S3 GetObject relayed by the gateway (the 16 KiB row of issue
22, boto3 one request at a time, so every process wakes cold), the target
took 600–680 µs from the request's bytes to its answer's, and uvicorn's
bare protocol with a one-line app takes 30–40 µs (``git show
f8a3f49:docs/benchmarks.md``, "Small GETs answered inline").

So a server may give ``http_protocol(..., answerer=)`` a function that looks
at a request's scope as soon as its head is parsed and either returns the
whole answer (status, headers, body), written at once, or ``None``: then the
request goes the ASGI way as before. The answerer must be quick and must not
block (it runs on the event loop, inside ``data_received``), and must answer
exactly what the ASGI route would: it declines whatever it does not handle
itself (``storage_target/inprotocol.py`` declines everything but a plain GET of
a small local object, with no query, no conditional headers and no body).

A server may also give a ``starter``: called with each request's scope as
soon as its head is parsed, before the ASGI task is made, it may start work
the app will need and leave it in the scope (the gateway sends a plain S3
GetObject to the owner there, ``gateway/s3/early.py``), and returns what to
call once the app is done with the request (to drop what the app did not use).

A request with a small body (a ``Content-Length`` of at most ``BODY_MAX``,
uvicorn's read high-water mark, so reading never pauses for it; not chunked,
no ``Expect``) may be answered once the body is in: the answerer returns a
function instead of an answer, no ASGI task is made, and when the body is
complete (``on_message_complete``, still inside ``data_received``) that
function gets it and returns the answer, or ``None``: then the ASGI task
starts after all and its ``receive()`` finds the body whole. The target's
small GetBatch share is answered this way (``storage_target/inprotocol.py``): a
share request through uvicorn, the middleware and the route cost the target
285–300 µs of CPU for a one-item share, replayed back to back.

Only uvicorn's httptools protocol has the hook (``_start_asgi_task``, which
``zerocopy.py`` overrides too); under h11 no request is answered inline.
Any other request with a body is never answered inline, nor one past a
connection cap (its app is uvicorn's 503), nor one that arrives while the
connection's writing is paused (a client that pipelines requests and does
not read its answers): the ASGI way waits for it, so answers never pile up
in memory.
A pipelined request that uvicorn starts from inside an inline answer's
completion goes the ASGI way too (answering it there would nest one call per
pipelined request: a burst of them was a ``RecursionError``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.flow_control import service_unavailable

from etl_runtime.core import auth

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]  # lower-case names, as ASGI's
# The body whole, or in pieces (a GetBatch share: its manifest, then every entry's header,
# bytes and padding), written with ``writelines``: uvloop sends them with one ``writev``
# instead of two joins of the whole answer (asyncio's transport joins them itself)
Answer = tuple[int, Headers, bytes | list[bytes]]
# For a request with a small body: what answers it once the body is in (or None).
WithBody = Callable[[bytes], Answer | None]
Answerer = Callable[[dict[str, Any]], Answer | WithBody | None]
BODY_MAX = 64 << 10  # uvicorn's HIGH_WATER_LIMIT: a body up to this never pauses reading
# Called with a request's scope before its ASGI task is made: it may start work the app
# will use (put in the scope) and return what to call once the app is done, or None.
Starter = Callable[[dict[str, Any]], Callable[[], None] | None]


try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE
except ImportError:  # no httptools: nothing is answered inline
    STATUS_LINE = {}


def has_hook(base: type) -> bool:
    """Whether ``base`` (a uvicorn HTTP protocol class) can answer inline."""
    return hasattr(base, "_start_asgi_task") and bool(STATUS_LINE)


def may_read(scope: dict[str, Any], read_token: str | None, token: str | None) -> bool:
    """The request's ``Authorization`` lets it read (``core/auth.py``'s ``read_ok``): an
    answerer that finds it does not declines, and the route answers the 401."""
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
    return auth.read_ok(authorization, read_token, token)


def _body_length(headers: Headers) -> int | None:
    """The request body's length from its head: 0 for none, None when it is not a
    ``Content-Length`` of at most ``BODY_MAX`` (chunked, ``Expect``, too big)."""
    length = 0
    for name, value in headers:
        if name == b"content-length":
            raw = value.strip()
            if not raw.isdigit() or int(raw) > BODY_MAX:
                return None
            length = int(raw)
        elif name in (b"transfer-encoding", b"expect"):
            return None
    return length


class InProtocolAnswers:
    """Mixed in before uvicorn's httptools protocol: ``answerer`` first, ASGI otherwise."""

    answerer: ClassVar[tuple[Answerer, ...]] = ()  # one function (a tuple: no binding)
    starter: ClassVar[tuple[Starter, ...]] = ()
    answered_in_protocol = False  # set when a request was answered during data_received
    _answering_here = False  # inside an inline answer's completion
    # a request whose answer waits for its body: (cycle, app, what answers it)
    _waiting: tuple[Any, Any, WithBody] | None = None
    app: Any
    transport: Any
    server_state: Any
    flow: Any

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if app is not service_unavailable:
            # Not from inside an inline answer's completion (a pipelined request uvicorn
            # starts there): that would nest one call per pipelined request.
            if self.answerer and not self._answering_here and self._answer_here(cycle, app):
                return
        self._start_task(cycle, app)

    def _start_task(self, cycle: Any, app: Any) -> None:
        if self.starter and app is not service_unavailable:
            app = self._started(cycle.scope, app)
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return
        cycle, app, with_body = waiting
        answer = None
        if not cycle.disconnected and not self.flow.write_paused:
            try:
                answer = with_body(bytes(cycle.body))
            except Exception:  # the ASGI route answers, with its error handling
                log.exception("answering %s %s inline failed", *_what(cycle.scope))
        if answer is None:
            self._start_task(cycle, app)  # its receive() finds the body whole
        else:
            self._write(cycle, answer)

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

    def _answer_here(self, cycle: Any, app: Any) -> bool:
        scope = cycle.scope
        length = _body_length(scope["headers"])
        if self.flow.write_paused or length is None:
            # A client that does not read: the ASGI way waits for it (and stops reading
            # its pipelined requests) where answers written here would pile up unsent.
            return False
        try:
            answer = self.answerer[0](scope)
        except Exception:  # the ASGI route answers, with its error handling
            log.exception("answering %s %s inline failed", *_what(scope))
            return False
        if answer is None:
            return False
        if callable(answer):  # answered once the body is in (``on_message_complete``)
            if not length:
                return False
            self._waiting = (cycle, app, answer)
            return True
        if length:
            return False
        self._write(cycle, answer)
        return True

    def _write(self, cycle: Any, answer: Answer) -> None:
        status, headers, body = answer
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        cycle.response_started = cycle.response_complete = True
        self.answered_in_protocol = True
        if isinstance(body, list):
            self.transport.writelines([b"".join(head), *body])
        else:
            head.append(body)
            self.transport.write(b"".join(head))
        if not cycle.keep_alive:
            self.transport.close()
        self._answering_here = True
        try:
            self.on_response_complete()  # type: ignore[attr-defined]  # keep-alive, pipelining
        finally:
            self._answering_here = False


def _what(scope: dict[str, Any]) -> tuple[str, str]:
    return scope["method"], scope["path"]
