"""Hedged reads: a read sent to a target that has not answered in time is asked again.

With ``copies >= 2`` an object lives on more than one target. A GET or HEAD
the gateway redirected (307) to a target that has not answered within
``after`` seconds (``SLUICE_HEDGE_AFTER``, default 1; ``0`` or ``off``: never)
is asked again at the gateway, which by then routes reads away from a target
that stopped answering its probes (suspect after about 0.5 s,
docs/placement.md); when the gateway sends it elsewhere, both requests run
and the first answer wins. The other is closed as soon as it arrives (a
thread blocked on a paused target's socket cannot be interrupted; its
connection is dropped when it answers or times out). While the gateway still
names the same target it is asked again every ``after`` seconds, ``ASKS``
times; then the first request goes on alone. A target that answers the
gateway's probes but is slow to serve is not avoided (the gateway has no
other copy to name first).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Callable

import httpx

log = logging.getLogger(__name__)

HEDGE_ENV = "SLUICE_HEDGE_AFTER"
HEDGE_AFTER = 1.0
ASKS = 5  # times the gateway is asked for another target, ``after`` seconds apart
# Threads for the requests a hedge runs side by side; a request to a paused target
# holds one until it answers or times out, so there are many, made as needed.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="sluice-hedge")


def hedge_after_from_env(value: str | None = None) -> float | None:
    """``$SLUICE_HEDGE_AFTER`` in seconds (default 1); None: no hedging (0, off)."""
    raw = (os.environ.get(HEDGE_ENV, "") if value is None else value).strip().lower()
    if not raw:
        return HEDGE_AFTER
    if raw in ("off", "never", "0"):
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{HEDGE_ENV}={raw!r}: give a number of seconds, or 'off'") from None
    return seconds if seconds > 0 else None


def _close(future: concurrent.futures.Future[httpx.Response | None]) -> None:
    """The losing request's answer, closed when it comes (an error is the loser's)."""
    try:
        response = future.result()
    except Exception as e:
        log.debug("hedged request lost with %r", e)
        return
    if response is not None:
        response.close()


def first_answer(
    first: Callable[[], httpx.Response],
    second: Callable[[], httpx.Response | None],
    after: float,
) -> httpx.Response:
    """``first()``'s answer if it comes within ``after`` seconds; else ``second()`` runs
    beside it (None: it had nowhere else to ask) and the first answer of the two wins;
    the other is closed when it arrives. An error is raised only when both failed."""
    started = _POOL.submit(first)
    try:
        return started.result(timeout=after)
    except concurrent.futures.TimeoutError:
        pass
    one: concurrent.futures.Future[httpx.Response | None] = started  # type: ignore[assignment]
    pending = {one, _POOL.submit(second)}
    error: BaseException | None = None
    while pending:
        done, pending = concurrent.futures.wait(
            pending, return_when=concurrent.futures.FIRST_COMPLETED
        )
        winner: httpx.Response | None = None
        for future in done:
            try:
                response = future.result()
            except Exception as e:
                error = error or e
                continue
            if response is None:
                continue
            if winner is None:
                winner = response
            else:
                response.close()
        if winner is not None:
            for future in pending:
                future.add_done_callback(_close)
            return winner
    assert error is not None  # ``first`` returns a response or raises
    raise error
