"""WebDataset mode: a tar shard in, the transformed shard streamed out.

Three stages run at once for each shard:

1. a parser thread reads the tar as it arrives (``RequestBodyFile``, or the
   ``etl_fqn`` file) and groups members into samples with webdataset's own
   ``tar_file_expander`` + ``group_by_keys``, so samples are exactly what
   ``wds.WebDataset`` would see;
2. ``_dispatch`` sends each sample to the worker pool (decode, user function,
   encode all happen in workers), at most ``window`` samples in flight;
3. the response generator awaits results in input order and forwards each
   sample's tar members, then the end-of-archive blocks.

Memory is bounded by the window whatever the shard size, and output starts as
soon as the first sample is done. With ``onError: skip`` a failing sample is
dropped and counted; with ``fail`` the object fails naming the sample: a JSON
error if nothing was sent yet, otherwise an error marker (``wire/formats/tarbreak.py``:
a member header promising more than follows) and an aborted connection, so no
tar reader takes the shorter shard for a whole one.

``etl_skip=K`` (a loader resuming mid-shard) leaves the shard's first ``K``
samples out: the parser groups them and drops them, no worker sees them, and
the answer's ``X-Sluice-Etl-Skipped`` / ``X-Sluice-Etl-Skipped-Key`` headers
say how many were left out and the key of the last one (fewer than ``K`` when
the shard is shorter), so the reader can check it resumes where it stopped.

Before ``tarfile`` sees the shard, ``GuardedTar`` (``wire/formats/targuard.py``)
inflates it and checks every header as it passes: a member name that is
absolute, has a ``..`` segment or lies below a symlink member of the shard is
refused (422 ``UnsafeShard`` naming object and sample), and so is a pax or GNU
long-name header over 1 MiB, before ``tarfile`` would read it into memory. A
refusal in the first sample is a JSON 422 before any output; later, the error
marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys
import tarfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from etl_runtime.core.errors import (
    BadRequest,
    NotATar,
    ObjectNotFound,
    SluiceError,
)
from etl_runtime.core.params import etl_skip_of
from etl_runtime.core.spec import SKIPPED_HEADER, SKIPPED_KEY_HEADER
from etl_runtime.webserver import ipc
from etl_runtime.webserver.bodyfile import BodyClosed, RequestBodyFile
from etl_runtime.webserver.pool import SAMPLE_TASK, Task
from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.wire.formats import tarbreak
from etl_runtime.wire.formats.targuard import GuardedTar

if TYPE_CHECKING:
    from etl_runtime.webserver.transformer import Transformer

log = logging.getLogger("sluice.transformer")

MEDIA_TYPE = "application/x-tar"
WINDOW_PER_WORKER = 3
_END = object()
END_OF_ARCHIVE = tarfile.NUL * (2 * tarfile.BLOCKSIZE)


def end_of_archive(written: int) -> bytes:
    """Two zero blocks, padded to a full record, as ``tarfile`` closes an archive."""
    size = written + len(END_OF_ARCHIVE)
    return END_OF_ARCHIVE + tarfile.NUL * (-size % tarfile.RECORDSIZE)


def load_tariterators() -> ModuleType:
    """``webdataset.tariterators``, imported without torch when torch is not loaded yet.

    The server only parses tars; importing ``webdataset`` normally drags in torch
    (seconds of start-up, hundreds of MB). webdataset supports a missing torch, so
    the server hides it during the import. Workers import webdataset normally.
    """
    if "webdataset" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        try:
            from webdataset import tariterators
        finally:
            del sys.modules["torch"]
    from webdataset import tariterators

    return tariterators


def iter_samples(fileobj: IO[bytes] | GuardedTar, url: str) -> Iterator[dict[str, Any]]:
    """Samples of a tar stream, grouped exactly as ``wds.WebDataset`` groups them."""
    tariterators = load_tariterators()
    files = tariterators.tar_file_expander([{"url": url, "stream": fileobj}])
    return tariterators.group_by_keys(files)


class ShardParser:
    """Runs ``iter_samples`` in a thread, handing samples to the event loop."""

    def __init__(
        self,
        fileobj: IO[bytes],
        obj: str,
        loop: asyncio.AbstractEventLoop,
        window: int,
        skip: int = 0,
    ) -> None:
        self.fileobj = fileobj
        self.obj = obj
        self.skip = skip
        self.skipped = 0  # of ``skip``, set before any sample is queued
        self.skipped_key: str | None = None
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.room = threading.Semaphore(window)
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name=f"shard {obj}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        last_key: str | None = None
        try:
            guarded = GuardedTar(self.fileobj, f"object {self.obj!r}")
            for sample in iter_samples(guarded, self.obj):
                if self.skipped < self.skip:  # grouped, never transformed nor sent
                    self.skipped += 1
                    self.skipped_key = last_key = sample["__key__"]
                    continue
                self.room.acquire()
                if self.stopped:
                    return
                last_key = sample["__key__"]
                self.loop.call_soon_threadsafe(self.queue.put_nowait, sample)
            item: Any = _END
        except BodyClosed:
            return
        except Exception as e:
            item = self._error(e, last_key)
        finally:
            if isinstance(self.fileobj, RequestBodyFile) is False:
                with contextlib.suppress(Exception):
                    self.fileobj.close()
        if not self.stopped:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def _error(self, e: Exception, last_key: str | None) -> SluiceError:
        if isinstance(e, SluiceError):
            return e
        # webdataset appends " @ <the stream>" to a message: the stream is no news
        reason = f"{type(e).__name__}: {e.args[0] if e.args else e}".split(" @ <shard of ")[0]
        if isinstance(e, tarfile.TarError) and last_key is None:
            return NotATar(
                f"object {self.obj!r} is not a tar shard ({reason}); wds mode needs a "
                "WebDataset .tar (or .tar.gz)"
            )
        after = f" after sample {last_key!r}" if last_key else ""
        return BadRequest(f"object {self.obj!r}: bad tar shard{after}: {reason}", sample=None)

    def taken(self) -> None:
        self.room.release()

    def stop(self) -> None:
        self.stopped = True
        self.room.release(1 << 16)
        if isinstance(self.fileobj, RequestBodyFile):
            self.fileobj.abandon()


def skip_of(transformer: Transformer, value: str | None, obj: str) -> int:
    """An hpush or direct request's ``etl_skip`` count; a 400 when bad or not wds."""
    skip = etl_skip_of(value)
    if skip and transformer.spec.mode != "wds":
        raise BadRequest(
            f"etl_skip={skip} on object {obj!r}: ETL {transformer.name!r} is in "
            f"{transformer.spec.mode} mode; only a wds ETL skips samples"
        )
    return skip


async def transform_shard(
    transformer: Transformer,
    request: Request,
    obj: str,
    args: str | None,
    fqn: str | None,
    skip: int = 0,
) -> Response:
    stats = transformer.stats
    loop = asyncio.get_running_loop()
    window = max(4, WINDOW_PER_WORKER * transformer.workers)
    fileobj: IO[bytes]
    body_done: asyncio.Event | None = None  # None: no body to wait for
    if fqn is not None:
        try:
            fileobj = open(fqn, "rb")  # noqa: SIM115 - closed by the parser thread
        except FileNotFoundError:
            raise ObjectNotFound(f"object {obj!r}: its file (etl_fqn): no such file") from None
        except OSError as e:  # its message names the path: only the reason goes out
            why = e.strerror or type(e).__name__
            raise BadRequest(f"object {obj!r}: cannot read its file (etl_fqn): {why}") from None
        stats.bytes_in += os.fstat(fileobj.fileno()).st_size
    else:

        def count(n: int) -> None:
            stats.bytes_in += n

        fileobj = RequestBodyFile(request.stream(), loop, on_bytes=count)  # type: ignore[assignment]
        body_done = fileobj.done  # type: ignore[attr-defined]
    parser = ShardParser(fileobj, obj, loop, window, skip)
    stream = _shard_stream(transformer, parser, obj, args)
    try:
        first = await anext(stream)
    except SluiceError as e:
        stats.error(obj, e.sample, e.message)
        raise
    response = TransformedStream(_continue(first, stream, transformer, obj), MEDIA_TYPE, body_done)
    if skip:  # the first chunk came after the skipped samples: their count is final
        response.headers[SKIPPED_HEADER] = str(parser.skipped)
        if parser.skipped_key is not None:
            response.headers[SKIPPED_KEY_HEADER] = quote(parser.skipped_key, safe="")
    return response


async def _continue(
    first: bytes, rest: AsyncIterator[bytes], transformer: Transformer, obj: str
) -> AsyncIterator[bytes]:
    stats = transformer.stats
    try:
        stats.bytes_out += len(first)
        yield first
        async for chunk in rest:
            stats.bytes_out += len(chunk)
            yield chunk
    except SluiceError as e:
        stats.error(obj, e.sample, e.message)
        log.error("ETL failed on %s after streaming began (connection aborted): %s", obj, e)
        raise
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _shard_stream(
    transformer: Transformer, parser: ShardParser, obj: str, args: str | None
) -> AsyncIterator[bytes]:
    """The output tar, sample by sample, in input order.

    Every chunk is whole tar members (``samples.tar_members``), so after any of
    them the output stands on a 512-byte boundary: an error once output began
    (``written``) puts ``tarbreak.error_marker`` there before it propagates (and
    the connection is aborted), so no tar reader takes the shorter shard for a
    whole one. Before the first byte the error alone goes up: a JSON answer.
    """
    stats = transformer.stats
    skip = transformer.spec.on_error == "skip"
    in_flight: asyncio.Queue[Any] = asyncio.Queue()
    started = time.perf_counter()
    parser.start()
    dispatch = asyncio.create_task(_dispatch(transformer, parser, args, in_flight))
    written = 0
    key: str | None = None
    try:
        while True:
            key = None
            item = await in_flight.get()
            if item is _END:
                break
            if isinstance(item, SluiceError):
                raise item
            key, task = item
            try:
                _, data = await task.next_frame()
            except SluiceError as e:
                if not skip:
                    raise
                stats.skipped += 1
                stats.error(obj, e.sample or key, e.message)
                continue
            finally:
                task.release()
                parser.taken()
            stats.samples += 1
            if data:
                written += len(data)
                yield data
        stats.objects += 1
        yield end_of_archive(written)
    except Exception as e:
        if written and written % tarfile.BLOCKSIZE == 0:
            reason = e.message if isinstance(e, SluiceError) else f"{type(e).__name__}: {e}"
            message = f"ETL {transformer.name!r}, object {obj!r}: {reason}"
            kind = e.kind if isinstance(e, SluiceError) else None
            yield tarbreak.error_marker(message, getattr(e, "sample", None) or key, kind)
        raise
    finally:
        stats.transform_seconds += time.perf_counter() - started
        parser.stop()
        dispatch.cancel()
        with contextlib.suppress(BaseException):
            await dispatch
        while not in_flight.empty():
            item = in_flight.get_nowait()
            if isinstance(item, tuple):
                item[1].release()


async def _dispatch(
    transformer: Transformer, parser: ShardParser, args: str | None, in_flight: asyncio.Queue[Any]
) -> None:
    """Hand parsed samples to workers in order; ``_END`` or an error closes the queue."""
    pool = transformer.pool
    while True:
        sample = await parser.queue.get()
        if sample is _END and isinstance(parser.fileobj, RequestBodyFile):
            await parser.fileobj.drain()
        if sample is _END or isinstance(sample, SluiceError):
            in_flight.put_nowait(sample)
            return
        task: Task = await pool.acquire(SAMPLE_TASK)
        try:
            await task.send((ipc.SAMPLE, pickle.dumps((sample, args), protocol=5)))
        except ConnectionError:
            pass  # the worker died: the task fails with WorkerDied when read
        in_flight.put_nowait((sample["__key__"], task))
