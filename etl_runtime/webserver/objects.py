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
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from etl_runtime.webserver import ipc
from etl_runtime.webserver.errors import TransformerError, WorkerDied
from etl_runtime.webserver.pool import OBJECT_TASK, Task, WorkerPool
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.webserver.stats import Stats

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
        await _send_input(task, stats, request, fqn)
        kind, first = await task.next_frame()
        length = None
        if kind == ipc.SIZE:  # a bytes result: its length is known up front
            length = ipc.LENGTH.unpack(first)[0]
            kind, first = await task.next_frame()
    except TransformerError as e:
        task.release()
        stats.error(obj, None, e.message)
        stats.transform_seconds += time.perf_counter() - started
        raise
    except BaseException:
        task.release()
        raise
    if kind == ipc.END:
        stats.objects += 1
        stats.transform_seconds += time.perf_counter() - started
        return Response(b"", media_type=MEDIA_TYPE)
    chunks = _result_stream(task, stats, obj, first, started)
    return TransformedStream(chunks, MEDIA_TYPE, length=length)


async def _send_input(task: Task, stats: Stats, request: Request, fqn: str | None) -> None:
    try:
        await task.send(ipc.OBJECT, pickle.dumps((request.query_params.get("etl_args"), fqn)))
        if fqn is not None:
            try:
                stats.bytes_in += os.path.getsize(fqn)
            except OSError:
                pass  # the worker reports the missing file
            return
        try:
            async for chunk in request.stream():
                if chunk:
                    stats.bytes_in += len(chunk)
                    await task.send(ipc.DATA, chunk)
        except BaseException:
            # The worker holds half an object and waits for the rest: it cannot
            # be reused, so it is replaced.
            task.worker.kill()
            raise
        await task.send(ipc.DATA_END)
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
    except TransformerError as e:
        stats.error(obj, None, e.message)
        log.error("ETL failed on %s after streaming began (connection aborted): %s", obj, e)
        raise
    finally:
        task.release()
        stats.transform_seconds += time.perf_counter() - started
