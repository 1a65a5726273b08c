"""When and how long the SDK waits before it tries a call again.

A cluster is briefly unavailable in ordinary operation: an ETL's transformers
are still starting, an object's owner target is restarting (the gateway then
answers 503 with ``Retry-After`` and names the target), a proxy sheds load with
429, a connection is reset. ``Client`` retries such answers itself, like the
official aistore SDK does, so these periods are invisible to callers:

* what: a 503 or 429 answer, and a failure to connect or a connection reset
  before the answer's head arrived. Not a read timeout (the server is alive and
  slow; trying again multiplies the wait), not a body that breaks after it
  was handed to the caller (``StreamError``), and never a 507
  (``InsufficientStorage``: the target's disk is full, and stays full until
  someone frees space) nor any other 4xx/5xx;
* how long: the server's ``Retry-After`` when it sends one, else exponential
  back-off (``backoff``, doubling, with jitter); one wait is at most
  ``max_delay`` seconds;
* how often: at most ``retries`` more tries; then the last error is raised,
  its message saying how many tries were made and over how long.

Request bodies are re-sent only when they can be: bytes, JSON, and files (the
SDK reopens them); a body streamed from an iterator is not retried once sending
it began.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from dataclasses import dataclass

import httpx

from etl_runtime.sdk.errors import SluiceError

log = logging.getLogger("etl_runtime.sdk")

RETRY_STATUSES = frozenset({429, 503})  # never 507: a full disk stays full

# Failures before the server could have acted on the request (or after it
# reset the connection): a new try cannot do harm twice. httpx raises
# RemoteProtocolError for "server disconnected without sending a response".
RETRY_TRANSPORT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` more tries after the first (0: none), ``backoff`` seconds first."""

    retries: int = 5
    backoff: float = 0.5
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    def delay(self, retry: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        wanted = parse_retry_after(retry_after)
        if wanted is None:
            wanted = self.backoff * 2 ** (retry - 1) * random.uniform(0.5, 1.0)
        return max(0.0, min(wanted, self.max_delay))


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Attempts:
    """The retry budget of one SDK call.

    ``again(error, retry_after)`` sleeps and returns True while tries are left;
    ``exhausted(error)`` is the error to raise, naming the tries made.
    """

    def __init__(self, policy: RetryPolicy, what: str) -> None:
        self.policy = policy
        self.what = what
        self.made = 1
        self.started = time.monotonic()

    def again(self, error: SluiceError, retry_after: str | None = None) -> bool:
        if self.made > self.policy.retries:
            return False
        wait = self.policy.delay(self.made, retry_after)
        log.info(
            "%s: %s; try %d of %d in %.1fs",
            self.what,
            error,
            self.made + 1,
            self.policy.retries + 1,
            wait,
        )
        time.sleep(wait)
        self.made += 1
        return True

    def exhausted(self, error: SluiceError) -> SluiceError:
        if self.made > 1:
            error.message = (
                f"{error.message} (gave up after {self.made} tries over "
                f"{time.monotonic() - self.started:.1f}s)"
            )
            error.args = (error.message,)
        error.tries = self.made
        return error
