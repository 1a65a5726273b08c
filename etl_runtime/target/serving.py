"""Running a Sluice server process: uvicorn plus the start/stop of its collaborators.

Shared by ``python -m etl_runtime.target`` and ``python -m etl_runtime.gateway``:
background parts (a health loop, a local ETL controller, a Kubernetes watch)
start before uvicorn accepts requests and stop after it drained them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

Hook = Callable[[], Any]  # plain or async function


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
        config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False)
        await uvicorn.Server(config).serve()
    finally:
        for stop in reversed(started):
            await _call(stop)


def run_server(
    app: Any,
    host: str,
    port: int,
    on_start: Sequence[Hook] = (),
    on_stop: Sequence[Hook] = (),
) -> None:
    """Serve ``app``; ``on_start[i]`` runs first and ``on_stop[i]`` runs at exit."""
    asyncio.run(_serve(app, host, port, on_start, on_stop))


def noop() -> None:
    return None
