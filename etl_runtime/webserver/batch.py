"""``POST /_sluice/batch``: many objects transformed for one request (GetBatch through an ETL).

A target's share of a GetBatch through an object-mode ETL names many objects;
one hpush ``PUT`` per object cost the transformer more CPU (uvicorn's parse
and send, the endpoint's way in) than a cheap transform itself. This route
takes the objects of one request by path (``wire/etlbatch.py``: the request,
and the frames of the answer) and answers their outputs in request order in
one chunked answer.

Each object goes through the transformer's normal machinery: inline, the
server's threads (``InlineRunner.outcome``: ``requestSeconds`` per object, a
stuck thread replaced and the server retired); else a worker process
(``objects.object_outcome``: a worker past ``requestSeconds`` is killed and
replaced). Up to ``WINDOW_PER_THREAD`` objects per thread (or worker) are in
work while the answer is written, so the next output is ready when the
previous one went out. Outputs are gathered into one write (one HTTP chunk:
each cost both sides a send, a wake-up and a parse) while the next one is
not ready, up to ``HOLD_ITEMS`` of them or ``HOLD_SECONDS`` since the first;
an item's paths are checked with its batch's directories resolved once.

Every object keeps its own outcome: its output, or its JSON error body with
the status an hpush ``PUT`` would have answered (a transform that raised:
422; past its deadline: 504; a worker that died: its error), and the batch
goes on. A failure after an object's first chunk is its error frame too (the
target drops the pieces it got). Counters are per object, as for hpush. A
server that dies mid-batch cuts the answer: the target fails the objects it
has no whole output for. A client that leaves cancels the objects not
started. WebDataset mode has no batches (404: the target sends per object).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from etl_runtime.core.errors import InvalidRequest, NotReady, SluiceError
from etl_runtime.webserver.fqn import confine
from etl_runtime.webserver.objects import object_outcome
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.wire import etlbatch

if TYPE_CHECKING:
    from etl_runtime.webserver.transformer import Transformer

log = logging.getLogger("sluice.transformer")

WINDOW_PER_THREAD = 2  # objects in work per inline thread or worker
SEND_AT = 256 << 10  # frames gathered up to this before a write
HOLD_ITEMS = 8  # outputs held for one write while the next is not ready, up to this many
HOLD_SECONDS = 0.002  # ... or as long as this since the first of them
ALONE = 64 << 10  # an output this big is written as it is, not joined

RUN_MAX = 16  # objects handed to an inline thread at once (``inline_runs``)

Output = bytes | memoryview | AsyncIterator[bytes]
Start = Callable[[list[tuple[str, str]]], list["asyncio.Future[Output]"]]


async def batch_answer(
    transformer: Transformer, request: Request, roots: tuple[str, ...]
) -> Response:
    """Check the request; the answer streams the items' frames (see the module docstring)."""
    name = transformer.name
    if transformer.spec.mode != "object":
        body = {"error": f"ETL {name!r} is in {transformer.spec.mode} mode: no batches; "
                "send each object with PUT", "etl": name}  # fmt: skip
        return JSONResponse(body, status_code=404)
    if not transformer.ready:
        raise NotReady(transformer.fatal or f"ETL {name!r} is still starting; retry shortly")
    args, items = _parse(await request.body())
    stats = transformer.stats
    inline = transformer.inline
    window = WINDOW_PER_THREAD * (inline.threads if inline is not None else transformer.workers)

    dirs: dict[str, str] = {}

    async def one(obj: str, fqn: str) -> Output:
        real = confine(fqn, roots, dirs)
        return await object_outcome(transformer.pool, stats, obj, args, real)

    def start(run: list[tuple[str, str]]) -> list[asyncio.Future[Output]]:
        if inline is None:  # worker processes: one object per hand-off
            return [asyncio.ensure_future(one(obj, fqn)) for obj, fqn in run]
        futures: list[asyncio.Future[Output] | None] = []
        paths: list[tuple[str, str]] = []
        for obj, fqn in run:  # a path refused is that object's error
            try:
                paths.append((obj, confine(fqn, roots, dirs)))
                futures.append(None)
            except SluiceError as e:
                futures.append(_failed(e))
        ran = iter(inline.submit(stats, paths, args) if paths else ())
        return [f if f is not None else next(ran) for f in futures]

    group = 1
    if inline is not None:  # runs: as many as the threads, up to RUN_MAX objects each
        group = max(1, min(RUN_MAX, -(-len(items) // inline.threads)))
        window = max(window, group * inline.threads)
    frames: Any = _frames(items, start, group, max(window, 2), name)  # bytes and memoryviews
    return TransformedStream(frames, etlbatch.MEDIA_TYPE)


def _failed(e: Exception) -> asyncio.Future[Output]:
    future: asyncio.Future[Output] = asyncio.get_running_loop().create_future()
    future.set_exception(e)
    return future


def _parse(raw: bytes) -> tuple[str | None, list[tuple[str, str]]]:
    try:
        body = json.loads(raw)
        args, items = body.get("etl_args"), body["items"]
        if args is not None and not isinstance(args, str):
            raise TypeError("etl_args")
        pairs = [(str(obj), str(fqn)) for obj, fqn in items]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise InvalidRequest(
            f"a batch transform request is JSON {{'etl_args': str | null, 'items': "
            f"[[object, etl_fqn], ...]}} ({type(e).__name__}: {e})"
        ) from None
    return args, pairs


def _error(e: Exception, etl: str, obj: str) -> list[bytes]:
    if not isinstance(e, SluiceError):
        log.exception("batch item %s", obj, exc_info=e)
        e = SluiceError(f"transformer failed on {obj}: {type(e).__name__}: {e}")
    body = json.dumps(e.hpush_body(etl, obj)).encode()
    return [etlbatch.head(e.status, len(body)), body]


async def _frames(
    items: list[tuple[str, str]], start: Start, group: int, window: int, etl: str
) -> AsyncIterator[bytes | memoryview]:
    """Every item's frames, in order; items ahead in work meanwhile (``start``-ed
    ``group`` at a time, up to ``window`` in all)."""
    ahead: deque[asyncio.Future[Output]] = deque()
    started = 0
    out: list[bytes | memoryview] = []
    size = held = 0
    since = 0.0
    clock = asyncio.get_running_loop().time
    try:
        for obj, _ in items:
            while started < len(items) and len(ahead) + min(group, len(items) - started) <= max(
                window, group
            ):
                run = items[started : started + group]
                ahead.extend(start(run))
                started += len(run)
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
                out.append(etlbatch.head(etlbatch.LAST, len(result)))
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
                        out += [etlbatch.head(etlbatch.MORE, len(chunk)), chunk]
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
                out.append(etlbatch.head(etlbatch.LAST, 0))
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
