"""Running a Sluice server process: uvicorn plus the start/stop of its collaborators.

Shared by ``python -m etl_runtime.storage_target`` and ``python -m etl_runtime.gateway``:
background parts (a health loop, a local ETL controller, a Kubernetes watch)
start before uvicorn accepts requests and stop after it drained them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import uvicorn

from etl_runtime.core import heap
from etl_runtime.core.eventloop import loop_factory, loop_from_env
from etl_runtime.wire.http import connections, zerocopy
from etl_runtime.wire.http.connections import Limits
from etl_runtime.wire.http.inprotocol import Answerer, Starter

Hook = Callable[[], Any]  # plain or async function
Server = uvicorn.Server  # one server process's uvicorn (webserver/servers.py runs them)

# uvicorn closes a connection idle for longer than this. Its default (5 s) is
# shorter than a GC pause, a SIGSTOP or a node hiccup: when the process resumed,
# every pooled client connection was past it and was closed as the client sent
# its next request on it, which the client saw as "connection reset by peer".
# 75 s is nginx's default; clients' pools (httpx: 5 s, requests: none) expire first.
# Connections that have not sent a whole request head get SLUICE_HEADER_TIMEOUT
# instead, and the oldest idle ones make room past SLUICE_MAX_CONNECTIONS
# (wire/http/connections.py).
KEEP_ALIVE_SECONDS = 75


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising SIGTERM/SIGINT once it has drained.

    uvicorn re-raises the signal it caught so the default handler kills the
    process; that would skip our ``on_stop`` hooks (stopping transformers,
    watches, health loops). We exit normally after running them instead.
    """

    def __init__(self, config: uvicorn.Config, before_exit: Hook | None = None) -> None:
        super().__init__(config)
        self._before_exit = before_exit
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        """With ``before_exit``, the first signal runs it while still serving, then exits;
        a second signal exits at once."""
        if self._before_exit is None or self._draining is not None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_draining, loop)

    def _start_draining(self, loop: asyncio.AbstractEventLoop) -> None:
        async def drain() -> None:
            try:
                assert self._before_exit is not None
                await _call(self._before_exit)
            finally:
                self.should_exit = True

        if self._draining is None:
            self._draining = loop.create_task(drain(), name="sluice-before-exit")

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


async def _call(hook: Hook) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result


async def _serve(
    app: Any,
    host: str,
    port: int,
    on_start: Sequence[Hook],
    on_stop: Sequence[Hook],
    before_exit: Hook | None = None,
    limits: Limits | None = None,
    answerer: Answerer | None = None,
    starter: Starter | None = None,
) -> None:
    started: list[Hook] = []
    limits = limits or Limits()
    try:
        for hook, stop in zip(on_start, on_stop, strict=True):
            await _call(hook)
            started.append(stop)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            # plain GETs by os.sendfile (SLUICE_SENDFILE); header timeout, connection cap
            **connections.server_options(zerocopy.http_protocol(), limits, answerer, starter),
        )
        connections.log.info("%s", limits.describe())
        await _Server(config, before_exit).serve()
    finally:
        for stop in reversed(started):
            await _call(stop)


def run_server(
    app: Any,
    host: str,
    port: int,
    on_start: Sequence[Hook] = (),
    on_stop: Sequence[Hook] = (),
    loop: str | None = None,
    before_exit: Hook | None = None,
    answerer: Answerer | None = None,
    starter: Starter | None = None,
) -> None:
    """Serve ``app``; ``on_start[i]`` runs first and ``on_stop[i]`` runs at exit.

    ``before_exit`` runs on SIGTERM/SIGINT while the server still serves (a
    target hands its objects over there before it leaves); then it stops.

    ``loop`` is ``auto``/``asyncio``/``uvloop`` (default: ``$SLUICE_LOOP``,
    else ``auto``); the hooks and uvicorn share that loop.

    The open-files limit is raised to the hard limit first, malloc keeps the
    memory it gets and the GC walks less (``core/heap.py``), and connections
    follow ``SLUICE_HEADER_TIMEOUT`` and ``SLUICE_MAX_CONNECTIONS``
    (``wire/http/connections.py``). ``answerer`` answers the requests it can before
    ASGI, ``starter`` starts work for them (``wire/http/inprotocol.py``).
    """
    try:
        if loop is None:
            loop = loop_from_env()
        zerocopy.enabled()  # a bad SLUICE_SENDFILE stops the process with its name
        limits = connections.setup()
    except ValueError as e:
        raise SystemExit(f"sluice: {e}") from None
    heap.tune()
    heap.collect_less()  # the app is built: what it made is never walked again
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(
            _serve(app, host, port, on_start, on_stop, before_exit, limits, answerer, starter)
        )


def noop() -> None:
    return None
