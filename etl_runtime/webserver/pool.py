"""The pool of worker processes that run user code, and how tasks reach them.

User code never runs in the server process: ``WorkerPool`` starts N workers
(forked by the ``forker`` helper: safe next to threads and the event loop, and
each worker starts with webdataset/torch already imported), waits until each
has loaded the code, and hands tasks to them over their own socket (``ipc``).

A request ``acquire``s a ``Task`` on a worker with spare capacity, sends its
frames, then reads reply frames from the task's bounded ``Channel``. One reader
coroutine per worker routes the worker's frames to the task at the head of its
queue; when a channel is full it stops reading, the socket fills and the worker
blocks: backpressure all the way to the user's generator. Object tasks take an
idle worker; sample tasks may queue one more behind a running sample so a
worker never waits for the server between samples. A worker that dies fails
its tasks with ``WorkerDied`` and is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from etl_runtime.core.errors import (
    CodeLoadError,
    SluiceError,
    TransformTimeout,
    WorkerDied,
    from_wire,
)
from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver import ipc
from etl_runtime.webserver.forker import Forker
from etl_runtime.webserver.sizing import usable_cpus
from etl_runtime.webserver.worker import worker_main
from etl_runtime.wire.clients import streambuf
from etl_runtime.wire.clients.streambuf import ReceiveStream

log = logging.getLogger("sluice.transformer")

OBJECT_TASK, SAMPLE_TASK = "object", "sample"
SAMPLES_PER_WORKER = 2  # running + one queued in the worker's socket
CHANNEL_FRAMES = 8  # result frames (<= 1 MiB each) buffered per task
SOCKET_BUFFER = 2 << 20  # SO_SNDBUF of each end of a worker socket


class Channel:
    """A bounded frame queue from a worker's reader to one task; abandonable."""

    def __init__(self, maxsize: int = CHANNEL_FRAMES) -> None:
        self.items: deque[tuple[int, Any]] = deque()
        self.maxsize = maxsize
        self.abandoned = False
        self._data = asyncio.Event()
        self._space = asyncio.Event()

    async def put(self, item: tuple[int, Any]) -> None:
        while len(self.items) >= self.maxsize and not self.abandoned:
            self._space.clear()
            await self._space.wait()
        if not self.abandoned:
            self.items.append(item)
            self._data.set()

    def put_final(self, item: tuple[int, Any]) -> None:
        if not self.abandoned:
            self.items.append(item)
            self._data.set()

    async def get(self) -> tuple[int, Any]:
        while not self.items:
            self._data.clear()
            await self._data.wait()
        return self.get_nowait()

    def get_nowait(self) -> tuple[int, Any]:
        """The next item; ``IndexError`` when there is none."""
        item = self.items.popleft()
        self._space.set()
        return item

    def abandon(self) -> None:
        self.abandoned = True
        self.items.clear()
        self._space.set()


class Task:
    """One unit of work on one worker: send frames, then read reply frames."""

    def __init__(self, pool: WorkerPool, worker: Worker, kind: str) -> None:
        self.pool = pool
        self.worker = worker
        self.kind = kind
        self.channel = Channel()
        self.finished = False

    async def send(self, *frames: tuple[int, ipc.Payload]) -> None:
        """Send ``(kind, payload)`` frames to the worker (see ``ipc.write_frames``)."""
        ipc.write_frames(self.worker.writer, *frames)
        await self.worker.writer.drain()

    async def next_frame(self) -> tuple[int, bytes]:
        """Next reply: (SIZE|CHUNK, bytes), (END, b""), (RESULT, bytes); raises on ERROR."""
        # ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for``
        # returns the frame and swallows a cancellation that arrives as the frame
        # does (a response whose client left would go on pulling frames); it also
        # costs a task per frame. A frame already there needs no wait, nor a timer.
        try:
            if self.channel.items:
                kind, payload = self.channel.get_nowait()
            else:
                async with asyncio.timeout(self.pool.request_timeout):
                    kind, payload = await self.channel.get()
        except TimeoutError:
            self.worker.kill()
            raise TransformTimeout(
                f"transform took longer than {self.pool.request_timeout:.0f}s "
                "(spec.timeouts.requestSeconds); its worker was restarted"
            ) from None
        if kind in (ipc.END, ipc.RESULT, ipc.ERROR):
            self.finished = True
        if kind == ipc.ERROR:
            raise payload if isinstance(payload, SluiceError) else from_wire(payload)
        return kind, payload

    def release(self) -> None:
        """Stop listening; replies still on their way are discarded."""
        if not self.finished:
            self.channel.abandon()


class Worker:
    """One worker process and the server's end of its socket."""

    def __init__(self, process: Any, reader: ReceiveStream, writer: asyncio.StreamWriter):
        self.process = process
        self.reader = reader
        self.writer = writer
        self.pid: int = process.pid
        self.pending: deque[Task] = deque()
        self.alive = True

    def capacity_for(self, kind: str) -> bool:
        if not self.alive:
            return False
        if kind == OBJECT_TASK:
            return not self.pending
        return len(self.pending) < SAMPLES_PER_WORKER and all(
            t.kind == SAMPLE_TASK for t in self.pending
        )

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()


class WorkerPool:
    """N worker processes with the user's code loaded; see the module docstring."""

    def __init__(
        self,
        spec: EtlSpec,
        size: int,
        deps_dir: str | None = None,
        on_log: Callable[[int, str], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.size = size
        self.deps_dir = deps_dir
        self.request_timeout = spec.request_timeout_seconds
        self.on_log = on_log or (lambda pid, text: None)
        self.on_fatal = on_fatal or (lambda reason: None)
        self.workers: list[Worker] = []
        self.closing = False
        self._changed = asyncio.Condition()
        self._background: set[asyncio.Task[Any]] = set()
        preload = ["etl_runtime.webserver.worker"]
        if spec.mode == "wds":
            preload.append("etl_runtime.webserver.samples")  # webdataset's codecs, not torch
        self.forker = Forker(preload)

    def start_forker(self) -> None:
        """Fork the workers' helper now: call while this process has one thread
        (``create_app``, before the server runs); ``start()`` does it otherwise."""
        if not self.forker.pid:
            self.forker.start()

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.alive]

    async def start(self) -> None:
        """Start every worker and wait until all loaded the code (``CodeLoadError``)."""
        self.start_forker()
        results = await asyncio.gather(
            *(self._spawn() for _ in range(self.size)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for r in results:
            if isinstance(r, Worker):
                self._adopt(r)
        if errors:
            raise errors[0]

    async def _spawn(self) -> Worker:
        ours, theirs = socket.socketpair()
        for end in (ours, theirs):
            # Room for a whole result frame in flight: the worker's sendall and
            # the server's writes then take a syscall or two instead of many
            # wake-ups (the kernel caps this at net.core.wmem_max; still bounded).
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        process = self.forker.process(worker_main, (theirs, self.spec.to_json(), self.deps_dir))
        await asyncio.to_thread(process.start)
        theirs.close()
        # ReceiveStream: a result frame is received straight into its own buffer.
        reader, writer = await streambuf.open_unix_connection(ours, limit=ipc.MAX_CHUNK)
        worker = Worker(process, reader, writer)
        try:
            while True:  # the init timeout bounds each wait (``asyncio.timeout``: see next_frame)
                async with asyncio.timeout(self.spec.init_timeout_seconds):
                    kind, payload = await ipc.read_frame(reader)
                if kind != ipc.LOG:
                    break
                self.on_log(worker.pid, payload.decode("utf-8", "replace"))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
            worker.kill()
            writer.close()
            raise CodeLoadError(
                f"worker process exited while loading the code (exit code "
                f"{process.exitcode}): {type(e).__name__}"
            ) from e
        if kind == ipc.LOAD_ERROR:
            writer.close()
            await asyncio.to_thread(process.join, 5)
            raise CodeLoadError(pickle.loads(payload))
        return worker

    def _adopt(self, worker: Worker) -> None:
        self.workers.append(worker)
        reader_task = asyncio.create_task(self._read_replies(worker))
        self._background.add(reader_task)
        reader_task.add_done_callback(self._background.discard)

    async def _read_replies(self, worker: Worker) -> None:
        try:
            while True:
                kind, payload = await ipc.read_frame(worker.reader)
                if kind == ipc.LOG:
                    self.on_log(worker.pid, payload.decode("utf-8", "replace"))
                    continue
                task = worker.pending[0]
                if kind in (ipc.CHUNK, ipc.SIZE):
                    await task.channel.put((kind, payload))
                    continue
                worker.pending.popleft()
                if kind == ipc.ERROR:
                    task.channel.put_final((kind, pickle.loads(payload)))
                else:
                    task.channel.put_final((kind, payload))
                async with self._changed:
                    self._changed.notify_all()
        except (asyncio.IncompleteReadError, ConnectionError, IndexError):
            pass
        await self._lost(worker)

    async def _lost(self, worker: Worker) -> None:
        worker.alive = False
        worker.writer.close()
        await asyncio.to_thread(worker.process.join, 5)
        code = worker.process.exitcode
        died = WorkerDied(f"worker process {worker.pid} died while transforming (exit code {code})")
        while worker.pending:
            worker.pending.popleft().channel.put_final((ipc.ERROR, died))
        self.workers.remove(worker)
        if self.closing:
            return
        log.warning("worker %d exited with code %s; starting a replacement", worker.pid, code)
        try:
            self._adopt(await self._spawn())
        except Exception as e:  # the code loaded once; if it no longer does, give up
            self.on_fatal(f"replacement worker failed to start: {e}")
            return
        async with self._changed:
            self._changed.notify_all()

    async def acquire(self, kind: str) -> Task:
        """A task on the least busy worker with room for ``kind``; waits for one."""
        async with self._changed:
            while True:
                candidates = [w for w in self.workers if w.capacity_for(kind)]
                if candidates:
                    worker = min(candidates, key=lambda w: len(w.pending))
                    task = Task(self, worker, kind)
                    worker.pending.append(task)
                    return task
                await self._changed.wait()

    async def close(self) -> None:
        self.closing = True
        for worker in list(self.workers):
            worker.writer.close()
        for worker in list(self.workers):
            await asyncio.to_thread(worker.process.join, 3)
            worker.kill()
        for task in list(self._background):
            task.cancel()
        await asyncio.to_thread(self.forker.close)

    @staticmethod
    def default_size(spec: EtlSpec, override: int | None) -> int:
        return override or spec.workers or usable_cpus()
