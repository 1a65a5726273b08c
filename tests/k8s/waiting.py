"""Polling helpers for tests that wait on the cluster."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Call ``check`` until it returns something truthy; fail after ``timeout``.

    Exceptions raised by ``check`` count as "not yet" (the last one is chained
    into the ``TimeoutError``), so a check may read objects that do not exist yet.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_error = e
        time.sleep(interval)
    raise TimeoutError(
        f"gave up after {timeout:.0f}s waiting for {getattr(check, '__name__', check)}; "
        f"last result {last!r}"
    ) from last_error
