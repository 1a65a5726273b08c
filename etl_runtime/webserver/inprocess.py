"""``--inline`` (``SLUICE_INLINE=1``): object-mode code run in the server process.

A worker process costs every object two trips through a Unix socket and the
event-loop wake-ups that come with them; for a cheap, byte-heavy transform
that hand-off, not the function, is the work. Inline, each server process
loads the user's code itself and calls it in its own small thread pool
(``threads`` = the workers of this server), never on the event loop: the
request body (or the ``etl_fqn`` file, read in the thread) goes to the
function as it is, and a bytes result is answered with ``Content-Length`` from
the same buffer. An iterable result is pulled one chunk at a time in the pool,
so a slow client still holds the function back (backpressure) and memory stays
bounded. Errors keep their rules: before the first byte they are JSON (the
status of the error), after it the connection is aborted.

What a process boundary gave, and how inline keeps it (``servers``): a
transform that crashes the interpreter takes its server process down, its
in-flight requests end without an answer (their callers see an error, never
data), and the supervisor starts a new server in its place. A transform past
``spec.timeouts.requestSeconds`` is answered 422 (``TransformTimeout``); its thread cannot be
killed, so a new thread takes its place at once and the server retires: it
stops taking connections, finishes the others, and exits (or the kernel ends
it ``RETIRE_GRACE_SECONDS`` later), and the supervisor replaces it. This is
the default for object mode (``sizing``); WebDataset mode always uses
workers (per-sample parallelism inside a shard).

The hand-off to a thread is the cheapest Python has: the threads take
``(future, function, arguments)`` from one ``SimpleQueue`` and settle the
loop's own future with ``call_soon_threadsafe``; the deadline is one timer
on the loop. ``run_in_executor`` under ``asyncio.timeout`` did the same with
a ``concurrent.futures.Future``, its lock and condition, the chaining of two
futures and a timeout context: about twice the CPU per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from etl_runtime.core.errors import (
    CodeLoadError,
    SluiceError,
    StartupError,
    TransformTimeout,
)
from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver import calls
from etl_runtime.webserver.code import load_transform, takes_args
from etl_runtime.webserver.inprocess_runs import Run
from etl_runtime.webserver.objects import DISCONNECT_WATCH_AFTER, disconnected
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.webserver.stats import LogBuffer, Stats

log = logging.getLogger("sluice.transformer")

MEDIA_TYPE = "application/octet-stream"
_DONE = object()


class InProcessRunner:
    """The user's function, loaded in this process, and the threads that call it."""

    def __init__(self, spec: EtlSpec, threads: int, deps_dir: str | None, logs: LogBuffer):
        self.spec = spec
        self.threads = threads
        self.deps_dir = deps_dir
        self.logs = logs
        self.timeout = spec.request_timeout_seconds
        self.fn: Callable[..., Any] | None = None
        self.with_args = False
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.pool = [self._thread(i) for i in range(threads)]
        # Called on the loop when a call outlived its deadline in a thread (see Transformer).
        self.on_stuck: Callable[[str], None] = lambda reason: None

    def _thread(self, n: int) -> threading.Thread:
        return threading.Thread(
            target=_serve_calls, args=(self.work,), daemon=True, name=f"sluice-inline-{n}"
        )

    def _expired(self, call: _Call) -> None:
        """On the loop: ``call`` passed its deadline."""
        if call.future.done():
            return
        reason = f"transform took longer than {self.timeout:.0f}s (spec.timeouts.requestSeconds)"
        call.future.set_exception(TransformTimeout(reason))
        self._abandon(call, f"{reason} in an inline thread")

    def _abandon(self, call: _Call, reason: str) -> None:
        """Nobody waits for ``call`` any more. If a thread is inside it, that thread
        is lost to us: another takes its place, and the server is told (it retires,
        so the process, and the thread with it, is replaced)."""
        if not call.started or call.expired:
            call.future.cancel()  # not started: no thread will run it
            return
        call.expired = True
        self.replace_thread(reason)

    def replace_thread(self, reason: str) -> None:
        """A thread is stuck in a call nobody waits for: another takes its place."""
        thread = self._thread(len(self.pool))
        self.pool.append(thread)
        thread.start()
        self.on_stuck(reason)

    def load(self) -> None:
        """Apply ``spec.env`` and the dependencies, load the code (``StartupError``)."""
        os.environ.update(dict(self.spec.env))
        if self.deps_dir and self.deps_dir not in sys.path:
            sys.path.insert(0, self.deps_dir)
        calls.reseed_numpy()  # this server was forked from one that may hold numpy
        pid = os.getpid()
        sys.stdout = calls.LineWriter(lambda text: self.logs.worker_output(pid, text))
        try:
            fn = load_transform(self.spec)
        except StartupError:
            raise
        except BaseException as e:  # anything the user's module does on import
            raise CodeLoadError(f"code failed to load: {type(e).__name__}: {e}") from e
        self.fn = fn
        self.with_args = takes_args(fn)
        for thread in self.pool:
            thread.start()

    def close(self) -> None:
        # Daemon threads: one stuck in a transform past its deadline does not
        # hold the process at exit; the others end at their next call.
        for thread in self.pool:
            if thread.is_alive():
                self.work.put(None)

    # -- in the pool's threads --------------------------------------------------

    def _call(
        self, data: bytes | None, fqn: str | None, obj: str, args: str | None
    ) -> tuple[Any, int]:
        """The result (bytes-like, or an iterator of chunks) and the size of the file read."""
        size = 0
        assert self.fn is not None
        if fqn is not None and not isinstance(self.fn, calls.ObjectHandler):
            data, fqn = calls.read_fqn(fqn), None
            size = len(data)
        elif fqn is not None:  # the class reads the file itself
            with contextlib.suppress(OSError):
                size = os.path.getsize(fqn)
        result = calls.object_result(self.fn, self.with_args, data, fqn, obj, args)
        return (result if isinstance(result, calls.Chunk) else iter(result)), size

    def call_first(self, fqn: str, obj: str, args: str | None) -> tuple[Any, int, Any]:
        """``_call`` and, for an iterable result, its first chunk (a batch's run)."""
        result, read = self._call(None, fqn, obj, args)
        return result, read, self._next(result) if isinstance(result, Iterator) else None

    @staticmethod
    def _next(chunks: Iterator[Any]) -> Any:
        try:
            item = next(chunks)
        except StopIteration:
            return _DONE
        except SluiceError:
            raise
        except Exception as e:
            raise calls.raised(e) from e
        return calls.chunk_of(item)

    # -- on the event loop ------------------------------------------------------

    async def _in_pool(
        self, fn: Callable[..., Any], *args: Any, watch: Request | None = None
    ) -> Any:
        """``fn(*args)`` in a thread. With ``watch``, a call still running after
        ``DISCONNECT_WATCH_AFTER`` is raced against that client leaving (its body
        was read whole, so its next ``receive()`` returns only then): abandoned
        work must not hold a thread, as it must not hold a worker (``objects``).
        Most calls end sooner and cost two loop timers, no task."""
        loop = asyncio.get_running_loop()
        call = _Call(loop.create_future(), fn, args)
        self.work.put(call)
        deadline = loop.call_later(self.timeout, self._expired, call)
        watcher: asyncio.Task[None] | None = None

        def watch_client() -> None:
            nonlocal watcher
            if watch is not None and not call.future.done():
                watcher = loop.create_task(self._watch(call, watch))

        soon = loop.call_later(DISCONNECT_WATCH_AFTER, watch_client) if watch else None
        try:
            return await call.future
        except asyncio.CancelledError:
            if not call.started:
                call.future.cancel()  # its request is gone: no thread will run it
            raise
        finally:
            deadline.cancel()
            if soon is not None:
                soon.cancel()
            if watcher is not None and not watcher.done():
                watcher.cancel()

    async def _watch(self, call: _Call, request: Request) -> None:
        await disconnected(request)
        if not call.future.done():
            call.future.set_exception(ClientDisconnect())
            self._abandon(call, "client left before the inline transform answered")

    async def transform(
        self, stats: Stats, request: Request, obj: str, args: str | None, fqn: str | None
    ) -> Response:
        data = None
        if fqn is None:
            data = await _body(request)
            stats.bytes_in += len(data)
        result = await self.outcome(stats, data, fqn, obj, args, watch=request)
        if not isinstance(result, AsyncIterator):
            return Response(result, media_type=MEDIA_TYPE)
        return TransformedStream(result, MEDIA_TYPE)

    async def outcome(
        self,
        stats: Stats,
        data: bytes | None,
        fqn: str | None,
        obj: str,
        args: str | None,
        watch: Request | None = None,
    ) -> memoryview | AsyncIterator[bytes]:
        """One object's output: whole (a bytes result), or its chunks as the function
        yields them. Raises the ``SluiceError`` of a failure before the first byte
        (counted); the chunks raise one after it. Also a batch's item (``bulk``)."""
        started = time.perf_counter()
        try:
            result, read = await self._in_pool(self._call, data, fqn, obj, args, watch=watch)
            stats.bytes_in += read
            first = None
            if isinstance(result, Iterator):
                first = await self._in_pool(self._next, result)
        except SluiceError as e:
            stats.error(obj, None, e.message)
            stats.transform_seconds += time.perf_counter() - started
            raise
        return self.output(stats, obj, started, result, first)

    def submit(
        self, stats: Stats, objects: list[tuple[str, str]], args: str | None
    ) -> list[asyncio.Future[Any]]:
        """Objects ``(object, fqn)`` to one thread as a run (``inprocess_runs``): each
        future gets what ``outcome`` returns or raises for that object."""
        return Run(self, stats, objects, args).start()

    def output(
        self, stats: Stats, obj: str, started: float, result: Any, first: Any
    ) -> memoryview | AsyncIterator[bytes]:
        """An object's output once its call (and first chunk) returned: counted."""
        if not isinstance(result, Iterator):
            stats.objects += 1
            stats.bytes_out += len(result)
            stats.transform_seconds += time.perf_counter() - started
            return memoryview(result).cast("B")
        if first is _DONE:
            stats.objects += 1
            stats.transform_seconds += time.perf_counter() - started
            return memoryview(b"")
        return self._stream(result, first, stats, obj, started)

    async def _stream(
        self, chunks: Iterator[Any], first: Any, stats: Stats, obj: str, started: float
    ) -> AsyncIterator[bytes]:
        try:
            item = first
            while item is not _DONE:
                stats.bytes_out += len(item)
                yield item
                item = await self._in_pool(self._next, chunks)
            stats.objects += 1
        except SluiceError as e:
            stats.error(obj, None, e.message)
            log.error("ETL failed on %s after streaming began (connection aborted): %s", obj, e)
            raise
        finally:
            stats.transform_seconds += time.perf_counter() - started


async def _body(request: Request) -> bytes:
    """The request body: ``Request.body()`` without its async generator; a body
    that came in one piece is not copied. (Joined here, not in the thread: on
    2 cores a 1 MiB join in the thread, GIL released, cost 10-20% more CPU per
    request at 16 in flight, see docs/benchmarks.md.)"""
    parts: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] != "http.request":  # http.disconnect
            raise ClientDisconnect()
        body = message.get("body", b"")
        if body:
            parts.append(body)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


class _Call:
    """One call handed to the threads; ``started``/``expired`` tell a stuck thread."""

    __slots__ = ("future", "fn", "args", "started", "expired")

    def __init__(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: Any) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.started = False
        self.expired = False


def _serve_calls(work: queue.SimpleQueue[Any]) -> None:
    """An inline thread: run each queued call, settle its future on the loop."""
    while True:
        call = work.get()
        if call is None:
            return
        if isinstance(call, Run):  # a batch's objects, one after another
            if not call.run():
                return
            continue
        future = call.future
        if future.done():  # its request is gone or timed out (a stale read is harmless)
            continue
        call.started = True
        try:
            result, error = call.fn(*call.args), None
        except Exception as e:
            result, error = None, e
        except BaseException as e:  # SystemExit, KeyboardInterrupt: not the server's
            result, error = None, calls.raised(e)
        if call.expired:  # another thread took this one's place meanwhile
            return
        try:
            future.get_loop().call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:  # the loop is closed: the server is stopping
            return


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # timed out or cancelled meanwhile
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
