"""Running a Sluice server process: uvicorn plus the start/stop of its collaborators.

Shared by ``python -m etl_runtime.target`` and ``python -m etl_runtime.gateway``:
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

from etl_runtime.eventloop import loop_factory, loop_from_env

Hook = Callable[[], Any]  # plain or async function

# uvicorn closes a connection idle for longer than this. Its default (5 s) is
# shorter than a GC pause, a SIGSTOP or a node hiccup: when the process resumed,
# every pooled client connection was past it and was closed as the client sent
# its next request on it, which the client saw as "connection reset by peer".
# 75 s is nginx's default; clients' pools (httpx: 5 s, requests: none) expire first.
KEEP_ALIVE_SECONDS = 75


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising SIGTERM/SIGINT once it has drained.

    uvicorn re-raises the signal it caught so the default handler kills the
    process; that would skip our ``on_stop`` hooks (stopping transformers,
    watches, health loops). We exit normally after running them instead.
    """

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
    app: Any, host: str, port: int, on_start: Sequence[Hook], on_stop: Sequence[Hook]
) -> None:
    started: list[Hook] = []
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
        )
        await _Server(config).serve()
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
) -> None:
    """Serve ``app``; ``on_start[i]`` runs first and ``on_stop[i]`` runs at exit.

    ``loop`` is ``auto``/``asyncio``/``uvloop`` (default: ``$SLUICE_LOOP``,
    else ``auto``); the hooks and uvicorn share that loop.
    """
    if loop is None:
        try:
            loop = loop_from_env()
        except ValueError as e:
            raise SystemExit(f"sluice: {e}") from None
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(_serve(app, host, port, on_start, on_stop))


def noop() -> None:
    return None
