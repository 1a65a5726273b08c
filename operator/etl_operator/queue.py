"""Coalescing work queue: at most one reconcile per ETL at a time, none lost.

Pod and ETL events arrive in bursts (a rollout touches every transformer pod
several times). ``ReconcileQueue.request(key)`` starts a reconcile of that
key if none is running; otherwise it marks the key dirty so exactly one more
run follows the current one. Different ETLs reconcile concurrently, bounded
by ``max_workers`` threads (the Kubernetes client is blocking).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from etl_operator import metrics

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Work = Callable[[str, str], Any]


class ReconcileQueue:
    """Runs ``work(namespace, name)`` in threads, coalescing repeated requests per key."""

    def __init__(self, work: Work, max_workers: int = 8, retry_seconds: float = 2.0) -> None:
        self._work = work
        self._slots = asyncio.Semaphore(max_workers)
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self._retry = retry_seconds
        self.runs = 0  # reconciles performed, for tests and the benchmark

    def request(self, namespace: str, name: str) -> None:
        """Ask for a reconcile of one ETL soon (never blocks, never runs twice at once)."""
        key = (namespace, name)
        if key in self._running:
            self._dirty.add(key)
            return
        self._running[key] = asyncio.get_running_loop().create_task(self._loop(key))

    async def _loop(self, key: Key) -> None:
        try:
            while True:
                self._dirty.discard(key)
                pause = await self._run_once(key)
                if key in self._dirty:
                    continue
                if pause is None:
                    return
                # Waiting on something that may send no event (a failed call,
                # pods still being deleted for a finalizer, a rollout's
                # switch-over): look again then.
                await asyncio.sleep(pause)
        finally:
            self._running.pop(key, None)

    async def _run_once(self, key: Key) -> float | None:
        """One reconcile; the pause after which to run it again, if it should be."""
        async with self._slots:
            self.runs += 1
            metrics.RECONCILES.inc()
            started = time.perf_counter()
            try:
                outcome = await asyncio.to_thread(self._work, *key)
            except Exception:
                metrics.RECONCILE_ERRORS.inc()
                log.exception("reconcile of ETL %s/%s failed; retrying", *key)
                return self._retry
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
        pauses = [getattr(outcome, "recheck", None)]
        if getattr(outcome, "deleted", 0) and not getattr(outcome, "settled", True):
            pauses.append(self._retry)
        return min((p for p in pauses if p is not None), default=None)

    async def drain(self) -> None:
        """Wait until nothing is running (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)
