"""Object mode: one object in, the user function's result streamed out.

The request body is forwarded to a worker frame by frame as it arrives (the
server never holds the whole object); with ``etl_fqn`` the worker reads the
file itself. The HTTP status is chosen only once the first result frame is
known, so an error before the first byte is a JSON answer; an error after it
aborts the connection (the generator raises, uvicorn drops the socket without
the final chunk) so a client can never take a truncated result for a whole one.
When the function returned bytes (not an iterable) the worker announces the
length first (``SIZE``) and the answer carries ``Content-Length`` instead of
chunked encoding; a break then still shows as a body shorter than announced.
A bytes result that fits one frame arrives whole, with its ``END``: it is
answered from memory like any small response, without a stream to pump.

Frames are batched both ways (``ipc.write_frames``, ``FrameSocket.send_frames``):
a small object goes to its worker in one write, and its result comes back in
one send, instead of a syscall per frame header and payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from etl_runtime.core.errors import SluiceError, WorkerDied
from etl_runtime.webserver import ipc
from etl_runtime.webserver.pool import OBJECT_TASK, Task, WorkerPool
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.webserver.stats import Stats

# A transform still running this long is watched for a client that left.
DISCONNECT_WATCH_AFTER = 0.5

log = logging.getLogger("sluice.transformer")

MEDIA_TYPE = "application/octet-stream"


async def transform_object(
    pool: WorkerPool,
    stats: Stats,
    request: Request,
    obj: str,
    args: str | None,
    fqn: str | None,
) -> Response:
    task = await pool.acquire(OBJECT_TASK)
    started = time.perf_counter()
    try:
        await _send_input(task, stats, request, obj, fqn)
        kind, first = await _first_frame(task, request)
        kind, first, length, whole = await _settle(task, stats, kind, first, started)
    except SluiceError as e:
        task.release()
        stats.error(obj, None, e.message)
        stats.transform_seconds += time.perf_counter() - started
        raise
    except BaseException:
        task.release()
        raise
    if whole:  # one answer from memory, no stream to pump
        return Response(memoryview(first), media_type=MEDIA_TYPE)
    if kind == ipc.END:
        return Response(b"", media_type=MEDIA_TYPE)
    chunks = _result_stream(task, stats, obj, first, started)
    return TransformedStream(chunks, MEDIA_TYPE, length=length)


async def object_outcome(
    pool: WorkerPool, stats: Stats, obj: str, args: str | None, fqn: str
) -> bytes | AsyncIterator[bytes]:
    """One object by path through a worker, for a batch (``bulk``): its whole output
    (a bytes result that came in one frame), or its chunks. Raises the ``SluiceError``
    of a failure before the first byte; the chunks raise one after it."""
    task = await pool.acquire(OBJECT_TASK)
    started = time.perf_counter()
    try:
        await task.send((ipc.OBJECT, pickle.dumps((args, fqn, obj))))
        with contextlib.suppress(OSError):
            stats.bytes_in += os.path.getsize(fqn)
        kind, first = await task.next_frame()
        kind, first, _, whole = await _settle(task, stats, kind, first, started)
    except SluiceError as e:
        task.release()
        stats.error(obj, None, e.message)
        stats.transform_seconds += time.perf_counter() - started
        raise
    except ConnectionError as e:
        task.release()
        raise WorkerDied(f"worker process {task.worker.pid} went away: {e}") from e
    except BaseException:
        task.release()
        raise
    if whole:
        return first
    if kind == ipc.END:
        return b""
    return _result_stream(task, stats, obj, first, started)


async def _settle(
    task: Task, stats: Stats, kind: int, first: bytes, started: float
) -> tuple[int, bytes, int | None, bool]:
    """After the worker's first reply: ``(kind, first, length, whole)``.

    A bytes result announces its ``length`` (a SIZE frame) before its first
    chunk, which is read here. ``whole``: that chunk is all of it (its END read
    too, the task done and counted); an empty result (END) is counted too.
    Anything else is a stream the caller pumps from ``first``."""
    length = None
    if kind == ipc.SIZE:
        length = ipc.LENGTH.unpack(first)[0]
        kind, first = await task.next_frame()
        if kind == ipc.CHUNK and len(first) == length:
            # The whole result, and its END came in the same send
            await task.next_frame()
            task.release()
            stats.objects += 1
            stats.bytes_out += length
            stats.transform_seconds += time.perf_counter() - started
            return kind, first, length, True
    if kind == ipc.END:  # the task is finished: nothing to release
        stats.objects += 1
        stats.transform_seconds += time.perf_counter() - started
    return kind, first, length, False


async def _first_frame(task: Task, request: Request) -> tuple[int, bytes]:
    """The worker's first reply; if the client leaves before it, the worker is
    killed (and replaced), so abandoned work never holds it.

    A transform that answers within ``DISCONNECT_WATCH_AFTER`` (most) costs only
    a timer. A longer one is raced against the client's ``http.disconnect``:
    the body was read whole, so the next ``receive()`` returns only when the
    connection is gone. (``Channel.get`` loses no frame when cancelled.)
    """
    if task.channel.items:
        return await task.next_frame()
    try:
        async with asyncio.timeout(DISCONNECT_WATCH_AFTER):
            return await task.next_frame()
    except TimeoutError:
        pass
    frame = asyncio.ensure_future(task.next_frame())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({frame, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (frame, gone):
            if not t.done():
                t.cancel()
    if frame.done() and not frame.cancelled():
        return frame.result()
    task.worker.kill()
    log.warning("client left before worker %d answered: worker restarted", task.worker.pid)
    raise ClientDisconnect()


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _send_input(
    task: Task, stats: Stats, request: Request, obj: str, fqn: str | None
) -> None:
    """OBJECT, then the body as it arrives: each piece of it as a DATA frame, the
    last with DATA_END, sent together with the frames before it (one write for
    a small object)."""
    head = (ipc.OBJECT, pickle.dumps((request.query_params.get("etl_args"), fqn, obj)))
    try:
        if fqn is not None:
            await task.send(head)
            try:
                stats.bytes_in += os.path.getsize(fqn)
            except OSError:
                pass  # the worker reports the missing file
            return
        frames = [head]
        try:
            while True:
                message = await request.receive()
                if message["type"] != "http.request":  # http.disconnect
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                if chunk:
                    stats.bytes_in += len(chunk)
                    frames.append((ipc.DATA, chunk))
                more = message.get("more_body", False)
                if not more:
                    frames.append((ipc.DATA_END, b""))
                if frames:
                    await task.send(*frames)
                    frames = []
                if not more:
                    return
        except BaseException:
            # The worker holds half an object and waits for the rest: it cannot
            # be reused, so it is replaced.
            task.worker.kill()
            raise
    except ConnectionError as e:
        raise WorkerDied(f"worker process {task.worker.pid} went away: {e}") from e


async def _result_stream(
    task: Task, stats: Stats, obj: str, first: bytes, started: float
) -> AsyncIterator[bytes]:
    try:
        stats.bytes_out += len(first)
        yield first
        while True:
            kind, chunk = await task.next_frame()
            if kind == ipc.END:
                stats.objects += 1
                return
            if chunk:
                stats.bytes_out += len(chunk)
                yield chunk
    except SluiceError as e:
        stats.error(obj, None, e.message)
        log.error("ETL failed on %s after streaming began (connection aborted): %s", obj, e)
        raise
    finally:
        task.release()
        stats.transform_seconds += time.perf_counter() - started
