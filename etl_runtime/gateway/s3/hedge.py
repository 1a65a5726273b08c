"""Hedged S3 GETs: the relay asks a copy when the owner is slow to answer.

The gateway relays a GetObject from the owner ``placement.route`` names
(``objects.py``). With ``copies >= 2``, an owner whose answer's head has not
come within ``SLUICE_HEDGE_AFTER`` seconds (default 1, as the SDK's hedged
reads, ``sdk/hedge.py``; ``0`` or ``off``: never) is raced against another
reachable owner, which holds every acknowledged write: the first head wins,
the other request is cancelled and its connection closed. Nothing of the
body has gone to the client before a winner is chosen, so no byte is sent
twice. Only the relay on raw pooled connections (``spliced.py``, the
gateway's own server) is hedged; the general-client paths (TLS, no splice)
wait for the owner as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from etl_runtime.core.access import object_url
from etl_runtime.gateway.context import Gateway

log = logging.getLogger(__name__)

HEDGE_ENV = "SLUICE_HEDGE_AFTER"  # the SDK's setting (sdk/hedge.py)
HEDGE_AFTER = 1.0

T = TypeVar("T")


def hedge_after(value: str | None = None) -> float | None:
    """``$SLUICE_HEDGE_AFTER`` in seconds (default 1); None: no hedging (0, off, or a
    value that is not a number: the relay then waits for the owner, as before)."""
    raw = (os.environ.get(HEDGE_ENV, "") if value is None else value).strip().lower()
    if not raw:
        return HEDGE_AFTER
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def has_copies(gw: Gateway, bucket: str) -> bool:
    """The bucket keeps more than one copy (a look at the map, no task)."""
    if gw.cmap is None:
        return False
    cmap = gw.cmap.get()
    return bucket in cmap.buckets and cmap.copies(bucket) >= 2


def copy_url(gw: Gateway, bucket: str, key: str, asked: str) -> str | None:
    """The object's URL on a reachable owner other than the one ``asked`` (a URL), or
    None (one copy, no map, or no other owner reachable)."""
    if gw.cmap is None:
        return None
    cmap = gw.cmap.get()
    if bucket not in cmap.buckets or cmap.copies(bucket) < 2:
        return None
    alive = gw.alive_ids()
    for tid in cmap.owners(bucket, key):
        info = gw.target_info(tid, cmap) if tid in alive else None
        if info is not None and (url := object_url(info.url, bucket, key)) != asked:
            return url
    return None


async def first_head(
    first: Awaitable[T],
    second: Callable[[], Awaitable[T] | None],
    close: Callable[[T], None],
    after: float | None,
) -> T:
    """``first``'s result if it comes within ``after`` seconds; else ``second()`` (None:
    nowhere else to ask) runs beside it and the first result of the two wins; the other
    is cancelled (or closed with ``close`` if it was done too). An error is raised only
    when both failed."""
    one: asyncio.Future[T] = asyncio.ensure_future(first)
    if after is None:
        return await one
    early, _ = await asyncio.wait({one}, timeout=after)
    if early:
        return one.result()
    ask = second()
    if ask is None:
        return await one
    two: asyncio.Future[T] = asyncio.ensure_future(ask)
    pending: set[asyncio.Future[T]] = {one, two}
    error: BaseException | None = None
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    winner = task.result()
                    for other in done - {task}:
                        if other.exception() is None:
                            close(other.result())
                    if task is two:
                        log.info("an S3 GET was answered by a copy: the owner was slow")
                    return winner
                error = task.exception()
        assert error is not None
        raise error
    finally:
        for task in pending:
            task.cancel()
            task.add_done_callback(lambda t: _close_late(t, close))


def _close_late(task: asyncio.Future[T], close: Callable[[T], None]) -> None:
    if not task.cancelled() and task.exception() is None:
        close(task.result())
