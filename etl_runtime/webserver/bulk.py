"""``POST /_sluice/batch``: many objects transformed for one request (GetBatch through an ETL).

A target's share of a GetBatch through an object-mode ETL names many objects;
one hpush ``PUT`` per object cost the transformer more CPU (uvicorn's parse
and send, the endpoint's way in) than a cheap transform itself. This route
takes the objects of one request by path (``wire/formats/bulk.py``: the request,
and the frames of the answer) and answers their outputs in request order in
one chunked answer.

Each object goes through the transformer's normal machinery: inline, the
server's threads, handed runs of consecutive objects (``InProcessRunner.submit``,
``inprocess_runs``: one hand-off for up to ``RUN_MAX`` objects and ``RUN_BYTES``
of files, ``requestSeconds`` per object, a stuck thread replaced and the
server retired); else a worker process (``objects.object_outcome``: a worker
past ``requestSeconds`` is killed and replaced). Up to ``WINDOW_PER_THREAD``
objects (inline: runs) per thread or worker are in work while the answer is
written, so the next output is ready when the previous one went out.
Outputs are gathered into one write (one HTTP chunk: each cost both sides a
send, a wake-up and a parse) while the next one is not ready, up to
``HOLD_ITEMS`` of them or ``HOLD_SECONDS`` since the first; an item's paths
are checked with its batch's directories resolved once.

Every object keeps its own outcome: its output, or its JSON error body with
the status an hpush ``PUT`` would have answered (a transform that raised:
422; past its deadline: 422 ``TransformTimeout``; a worker that died: its error), and the batch
goes on. A failure after an object's first chunk is its error frame too (the
target drops the pieces it got). Counters are per object, as for hpush. A
server that dies mid-batch cuts the answer: the target fails the objects it
has no whole output for. A client that leaves cancels the objects not
started. WebDataset mode has no batches (404: the target sends per object).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from etl_runtime.core.errors import InvalidRequest, NotReady, SluiceError
from etl_runtime.etl import grants
from etl_runtime.webserver.fqn import FqnAccess, released
from etl_runtime.webserver.objects import object_outcome
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.wire.formats import bulk

if TYPE_CHECKING:
    from etl_runtime.webserver.transformer import Transformer

log = logging.getLogger("sluice.transformer")

WINDOW_PER_THREAD = 2  # objects (inline: runs of them) in work per thread or worker
SEND_AT = 256 << 10  # frames gathered up to this before a write
HOLD_ITEMS = 8  # outputs held for one write while the next is not ready, up to this many
HOLD_SECONDS = 0.002  # ... or as long as this since the first of them
ALONE = 64 << 10  # an output this big is written as it is, not joined

RUN_MAX = 16  # objects handed to an inline thread at once (``inprocess_runs``) ...
RUN_BYTES = 1 << 20  # ... and their files' bytes, at most (a bigger file: a run of its own)

Output = bytes | memoryview | AsyncIterator[bytes]
Start = Callable[[int, int], list["asyncio.Future[Output]"]]  # (first, count) -> futures


async def batch_answer(transformer: Transformer, request: Request, access: FqnAccess) -> Response:
    """Check the request; the answer streams the items' frames (see the module docstring)."""
    name = transformer.name
    if transformer.spec.mode != "object":
        body = {"error": f"ETL {name!r} is in {transformer.spec.mode} mode: no batches; "
                "send each object with PUT", "etl": name}  # fmt: skip
        return JSONResponse(body, status_code=404)
    if not transformer.ready:
        raise NotReady(transformer.fatal or f"ETL {name!r} is still starting; retry shortly")
    args, asked = _parse(await request.body())
    items = [(obj, fqn) for obj, fqn, _ in asked]
    stats = transformer.stats
    inline = transformer.inline
    window = WINDOW_PER_THREAD * (inline.threads if inline is not None else transformer.workers)
    held: list[int] = []  # handed files (fqn.FqnAccess), closed once the answer is done
    try:
        paths = await access.many(asked, held)
    except BaseException:
        grants.close_all(held)
        raise

    async def one(obj: str, path: str | SluiceError) -> Output:
        if isinstance(path, SluiceError):
            raise path
        return await object_outcome(transformer.pool, stats, obj, args, path)

    if inline is None:  # worker processes: one object per hand-off
        plan = [1] * len(items)

        def start(first: int, count: int) -> list[asyncio.Future[Output]]:
            return [asyncio.ensure_future(one(items[first][0], paths[first]))]

    else:  # an inline thread takes a run of objects at once
        plan = _runs(paths, inline.threads)

        def start(first: int, count: int) -> list[asyncio.Future[Output]]:
            futures: list[asyncio.Future[Output] | None] = []
            run: list[tuple[str, str]] = []
            for (obj, _), real in zip(items[first : first + count], paths[first:], strict=False):
                if isinstance(real, SluiceError):  # a path refused is that object's error
                    futures.append(_failed(real))
                else:
                    run.append((obj, real))
                    futures.append(None)
            ran = iter(inline.submit(stats, run, args) if run else ())
            return [f if f is not None else next(ran) for f in futures]

    frames: Any = _frames(items, start, plan, max(window, 2), name)  # bytes and memoryviews
    return released(TransformedStream(frames, bulk.MEDIA_TYPE), held)


def _runs(paths: list[str | SluiceError], threads: int) -> list[int]:
    """The lengths of the runs the objects (their checked paths, or why each is refused)
    go to the threads in: consecutive objects, the batch spread over the
    threads, at most ``RUN_MAX`` objects and ``RUN_BYTES`` of files (a bigger
    file is a run of its own), so what is in work stays as bounded as before."""
    most = max(1, min(RUN_MAX, -(-len(paths) // max(threads, 1))))
    plan: list[int] = []
    count = nbytes = 0
    for path in paths:
        size = 0
        if not isinstance(path, SluiceError):
            with contextlib.suppress(OSError):  # the thread's read says why
                size = os.stat(path).st_size
        if count and (count == most or nbytes + size > RUN_BYTES):
            plan.append(count)
            count = nbytes = 0
        count += 1
        nbytes += size
    if count:
        plan.append(count)
    return plan


def _failed(e: Exception) -> asyncio.Future[Output]:
    future: asyncio.Future[Output] = asyncio.get_running_loop().create_future()
    future.set_exception(e)
    return future


def _parse(raw: bytes) -> tuple[str | None, list[tuple[str, str, str | None]]]:
    try:
        body = json.loads(raw)
        args, items = body.get("etl_args"), body["items"]
        if args is not None and not isinstance(args, str):
            raise TypeError("etl_args")
        asked = [_item(*item) for item in items]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise InvalidRequest(
            f"a batch transform request is JSON {{'etl_args': str | null, 'items': "
            f"[[object, etl_fqn(, etl_grant)], ...]}} ({type(e).__name__}: {e})"
        ) from None
    return args, asked


def _item(obj: object, fqn: object, grant: object = None) -> tuple[str, str, str | None]:
    return str(obj), str(fqn), None if grant is None else str(grant)


def _error(e: Exception, etl: str, obj: str) -> list[bytes]:
    if not isinstance(e, SluiceError):
        log.exception("batch item %s", obj, exc_info=e)
        e = SluiceError(f"transformer failed on {obj}: {type(e).__name__}: {e}")
    body = json.dumps(e.hpush_body(etl, obj)).encode()
    return [bulk.head(e.status, len(body)), body]


async def _frames(
    items: list[tuple[str, str]], start: Start, plan: list[int], window: int, etl: str
) -> AsyncIterator[bytes | memoryview]:
    """Every item's frames, in order; items ahead in work meanwhile: ``start``-ed in
    the runs of ``plan`` (lengths), up to ``window`` runs not yet answered."""
    ahead: deque[asyncio.Future[Output]] = deque()
    runs = iter(plan)
    ends: deque[int] = deque()  # where each run in work ends
    started = 0
    out: list[bytes | memoryview] = []
    size = held = 0
    since = 0.0
    clock = asyncio.get_running_loop().time
    try:
        for index, (obj, _) in enumerate(items):
            while ends and ends[0] <= index:
                ends.popleft()
            while started < len(items) and len(ends) < window:
                count = next(runs)
                ahead.extend(start(started, count))
                started += count
                ends.append(started)
            job = ahead.popleft()
            if out and not job.done():  # about to wait: send what is ready, unless it is
                if held >= HOLD_ITEMS or clock() - since >= HOLD_SECONDS:  # little and new
                    yield b"".join(out)
                    out, size, held = [], 0, 0
            if not held:
                since = clock()
            held += 1
            try:
                result = await job
            except Exception as e:
                out += _error(e, etl, obj)
                size += len(out[-1])
                continue
            if not isinstance(result, AsyncIterator):
                out.append(bulk.head(bulk.LAST, len(result)))
                if len(result) >= ALONE:
                    yield b"".join(out)
                    yield result
                    out, size, held = [], 0, 0
                else:
                    out.append(result)
                    size += len(result)
            else:
                mark = len(out)
                try:
                    async for chunk in result:
                        out += [bulk.head(bulk.MORE, len(chunk)), chunk]
                        size += len(chunk)
                        if size >= SEND_AT or clock() - since >= HOLD_SECONDS:
                            yield b"".join(out)
                            out, size, mark, held = [], 0, 0, 0
                            since = clock()
                except Exception as e:
                    del out[mark:]  # pieces not sent yet: the error frame voids them anyway
                    out += _error(e, etl, obj)
                    continue
                finally:
                    await result.aclose()  # type: ignore[attr-defined]
                out.append(bulk.head(bulk.LAST, 0))
            if size >= SEND_AT:
                yield b"".join(out)
                out, size, held = [], 0, 0
        if out:
            yield b"".join(out)
    finally:
        for job in ahead:
            job.cancel()
        for job in ahead:  # outputs never sent: their streams release what they hold
            if job.done() and not job.cancelled() and job.exception() is None:
                unsent: Any = job.result()
                if isinstance(unsent, AsyncIterator):
                    await unsent.aclose()  # type: ignore[attr-defined]
