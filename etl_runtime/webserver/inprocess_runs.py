"""A run of a batch's objects handed to one inline thread at once (``InProcessRunner.submit``).

``POST /_sluice/batch`` (``webserver/bulk.py``) used to hand each object to
the inline threads on its own: a queue put, a thread woken, its result
settled on the loop with ``call_soon_threadsafe`` (a loop woken). On the
2-core VM that hand-off cost more CPU than a cheap transform: in-process,
reading a 10 KiB file and reversing it took 20 µs in a thread, and 190 µs per
object in all when each object was handed over on its own (4 in flight on 2
threads). A run of the batch's objects is now one hand-off: the thread takes
them one after another and settles what it finished in one loop call when the
run ends, or as soon as ``FLUSH_SECONDS`` passed since its last settlement
(a slow transform's outputs still go out one by one). Under
``bench/batch.py``'s ETL row the transformers' CPU per batch item went from
0.20–0.22 ms to 0.10 ms (``git show
f8a3f49:docs/benchmarks.md``, "Batched objects in runs").

Each object keeps the rules of ``outcome``: its own output or error, counted
the same, and ``requestSeconds`` from its own start (a run waiting in the
queue: from its hand-off). One timer per run follows the object in work; when
that one passes its deadline it is answered 422 (``TransformTimeout``), the objects finished before
it are settled, the thread is given up and replaced (the server retires, as
for a single object), and the objects not started go to the threads as a new
run. Objects whose futures are done before they start (the batch's client
left) are skipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from etl_runtime.core.errors import SluiceError, TransformTimeout
from etl_runtime.webserver import calls

if TYPE_CHECKING:
    from etl_runtime.webserver.inprocess import InProcessRunner
    from etl_runtime.webserver.stats import Stats

FLUSH_SECONDS = 0.002  # outputs finished are settled at least this often

# (index, started, ended, (result, bytes read, first chunk) or None, error or None)
Finished = tuple[int, float, float, Any, BaseException | None]


class Run:
    """Objects by path for one thread, in order; ``futures[i]`` gets object i's output."""

    __slots__ = (
        "runner", "stats", "loop", "objects", "args", "futures", "submitted",
        "started", "expired", "current", "since", "finished", "timer",
    )  # fmt: skip

    def __init__(
        self,
        runner: InProcessRunner,
        stats: Stats,
        objects: list[tuple[str, str]],
        args: str | None,
        futures: list[asyncio.Future[Any]] | None = None,
    ) -> None:
        self.runner, self.stats, self.objects, self.args = runner, stats, objects, args
        self.loop = asyncio.get_running_loop()
        self.futures = futures or [self.loop.create_future() for _ in objects]
        self.submitted = time.monotonic()
        self.started = False  # a thread took it
        self.expired = False  # its thread was given up (stuck past a deadline)
        self.current = 0  # the object in work; len(objects) once all are done
        self.since = 0.0  # when that one started (time.monotonic, as the timer reads it)
        self.finished: list[Finished] = []  # done, not settled yet
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> list[asyncio.Future[Any]]:
        """Hand the run to the threads; its objects' futures, in order."""
        self.runner.work.put(self)
        self.timer = self.loop.call_later(self.runner.timeout, self._check)
        return self.futures

    # -- in a pool thread -------------------------------------------------------

    def run(self) -> bool:
        """Every object in turn; False if this thread was given up meanwhile (it ends)."""
        self.started = True
        runner, args = self.runner, self.args
        flushed = time.perf_counter()
        for i, (obj, fqn) in enumerate(self.objects):
            if self.futures[i].done():  # the client left, or the run timed out waiting
                continue
            self.since = time.monotonic()  # first: whoever sees the new index sees its start
            self.current = i
            began = time.perf_counter()
            try:
                value, error = runner.call_first(fqn, obj, args), None
            except Exception as e:
                value, error = None, e
            except BaseException as e:  # SystemExit, KeyboardInterrupt: not the server's
                value, error = None, calls.raised(e)
            if self.expired:  # another thread took this one's place meanwhile
                return False
            ended = time.perf_counter()
            self.finished.append((i, began, ended, value, error))
            if ended - flushed >= FLUSH_SECONDS:
                self._flush()
                flushed = ended
        self.current = len(self.objects)
        self._flush()
        return True

    def _flush(self) -> None:
        finished, self.finished = self.finished, []
        if finished:
            try:
                self.loop.call_soon_threadsafe(self._settle, finished)
            except RuntimeError:  # the loop is closed: the server is stopping
                pass

    # -- on the event loop ------------------------------------------------------

    def _settle(self, finished: list[Finished]) -> None:
        for i, began, ended, value, error in finished:
            future = self.futures[i]
            if future.done():  # cancelled or timed out meanwhile
                continue
            obj = self.objects[i][0]
            if error is not None:
                if isinstance(error, SluiceError):
                    self.stats.error(obj, None, error.message)
                self.stats.transform_seconds += ended - began
                future.set_exception(error)
                continue
            result, read, first = value
            self.stats.bytes_in += read
            future.set_result(self.runner.output(self.stats, obj, began, result, first))
        if self.current >= len(self.objects) and self.timer is not None:
            self.timer.cancel()

    def _check(self) -> None:
        """The timer: the object in work (or the run, still queued) past its deadline?"""
        if self.expired or self.current >= len(self.objects):
            return
        timeout = self.runner.timeout
        left = (self.since if self.started else self.submitted) + timeout - time.monotonic()
        if left > 0:
            self.timer = self.loop.call_later(left, self._check)
            return
        reason = f"transform took longer than {timeout:.0f}s (spec.timeouts.requestSeconds)"
        if not self.started:  # no thread took it in time: every object is late
            for (obj, _), future in zip(self.objects, self.futures, strict=True):
                if not future.done():
                    self.stats.error(obj, None, reason)  # counted as outcome() counts it
                    future.set_exception(TransformTimeout(reason))
            return  # a thread that takes it later skips the done futures
        self.expired = True
        stuck = self.current
        finished, self.finished = self.finished, []
        self._settle(finished)  # the outputs done before the stuck object
        late = self.futures[stuck]
        if not late.done():
            self.stats.error(self.objects[stuck][0], None, reason)
            late.set_exception(TransformTimeout(reason))
        rest = [i for i in range(stuck + 1, len(self.objects)) if not self.futures[i].done()]
        if rest:  # not started: to the other threads, as a run of their own
            Run(
                self.runner,
                self.stats,
                [self.objects[i] for i in rest],
                self.args,
                [self.futures[i] for i in rest],
            ).start()
        self.runner.replace_thread(f"{reason} in an inline thread")
