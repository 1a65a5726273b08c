"""Which event loop a Sluice server runs on: ``SLUICE_LOOP`` = auto, asyncio or uvloop.

uvicorn runs on uvloop whenever uvloop is installed (it comes with
``uvicorn[standard]`` and many base images) and on asyncio's own loop
otherwise, so every server's code must work on both. ``auto`` (the default)
keeps that choice; ``asyncio`` or ``uvloop`` pins one, for tests that run a
server on each loop and for an operator who wants to rule one out.

The transformer's ``__main__`` hands the choice to uvicorn (``loop=``);
``target.serving.run_server`` (target, gateway) runs uvicorn inside its own
``asyncio.Runner`` and builds that loop with ``loop_factory()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import Callable, Mapping

ENV = "SLUICE_LOOP"
LOOPS = ("auto", "asyncio", "uvloop")


def loop_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The validated ``SLUICE_LOOP`` (``auto`` when unset); ``ValueError`` names the fix."""
    raw = environ.get(ENV, "")
    name = raw.strip().lower() or "auto"
    if name not in LOOPS:
        raise ValueError(f"{ENV}={raw!r} is not an event loop: use one of {', '.join(LOOPS)}")
    if name == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ValueError(f"{ENV}=uvloop but uvloop is not installed (pip install uvloop)")
    return name


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The new-loop function for ``asyncio.Runner`` (``auto``: uvloop if installed)."""
    if name != "asyncio":
        try:
            import uvloop
        except ImportError:
            if name == "uvloop":
                raise
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task and wait until it has ended (no-op for None)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
