"""The output cache: a target keeps the answers of ``cache: true`` ETLs (issue 23).

A deterministic transform of the same object with the same spec and arguments
gives the same bytes, so a second epoch need not run it again. For an ETL
whose spec says ``cache: true`` a target keeps each complete answer in a file
beside its objects and serves the next GET of it as it serves a plain GET.

**Key.** An entry is the file ``DATA/.etlcache/<etl>/<spec hash>/<bucket>/
<n[:2]>/<n>/<k>`` (``cacheindex.py``): ``n`` hashes the object name, ``k`` the
object's ETag (its MD5) and size and ``etl_args`` (absent and empty apart).
``DATA/.etlcache`` is never listed (objects live in ``DATA/buckets/``). A
changed object, spec or argument is another path, so a lookup is one
``open`` and a failed one is a miss; entries of an old spec or an old object
are garbage that nothing reads and eviction reclaims. Overwriting or deleting
an object (by any writer of the store: PUTs, copies, rebalance, remote-bucket
fills and evictions) drops its entries at once (``ObjectStore.on_change`` ->
``drop``: one ``listdir`` per spec generation present).

**Hit.** The lookup runs on the event loop, as the 307's stat and realpath
do: it opens the object, reads its ETag from its extended attribute
(``open_if_tagged``; without one, the lookup goes to a thread, where the
store hashes the file) and opens the entry. A hit is a ``FileRangeResponse``
(zero-copy, ``Content-Length``) with ``X-Sluice-Etl-Cache: hit``: no thread
hop, so less work than a plain GET; callers in the process (offline
transforms, pipelines) get the file as a stream. The hit only queues a
``touch`` for the LRU order: the loop never waits for the index's lock.

**Miss.** The answer is relayed, never redirected (its bytes must pass through
the target), and teed into a temp file in ``DATA/.tmp``. The entry is
published (fsync, rename) by the cache's own threads after the last byte went
out, and only if the transformer's answer ended cleanly (an error or a break
keeps nothing), the transformer runs the spec of the key (its answers carry
``X-Sluice-Spec-Hash``; during a rollover an old transformer may still
answer) and the object is still the file the lookup opened (same inode, held
open meanwhile: an object replaced during the transform leaves nothing). A
client that leaves early leaves nothing either. The fsync keeps a power loss
from leaving a torn entry; the directory is not fsynced (a lost entry is only
a miss). With ``BACKLOG`` answers waiting to be published, more misses are
served but not kept (bounded memory and open files when the disk is slow).

**Budget.** ``SLUICE_ETL_CACHE_BYTES`` (bytes with an optional K/M/G/T
suffix, powers of 1024, or ``N%`` of the data filesystem; default ``10%``;
``0``: no cache) bounds the entries of all ETLs on this target. Past it the
least recently used go first (a hit is a use; after a restart the order is
rebuilt from the files' times, in the background). An answer bigger than the
budget is not kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio.to_thread
from fastapi.responses import Response, StreamingResponse

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.errors import SluiceError
from etl_runtime.core.spec import SPEC_HASH_HEADER, EtlSpec
from etl_runtime.etl.cacheindex import (
    BUDGET_ENV,
    CACHE_DIR,
    CacheIndex,
    budget_from_env,
    entry_path,
)
from etl_runtime.storage.store import READ_CHUNK, ObjectStore
from etl_runtime.wire.http.zerocopy import FileRangeResponse

log = logging.getLogger(__name__)

CACHE_HEADER = "X-Sluice-Etl-Cache"
PUBLISHERS = 2  # threads that fsync and rename entries
BACKLOG = 64  # answers waiting for them; past it, misses are served but not kept


@dataclass
class Pending:
    """A miss on its way to becoming an entry."""

    etl: str
    rel: str
    bucket: str
    name: str
    obj: IO[bytes]  # the object as looked up, held open: its inode is not reused meanwhile
    tmp: Path
    f: IO[bytes] | None = None
    size: int = 0

    def discard(self) -> None:
        """Close what is open and remove the temp file (nothing is published)."""
        with contextlib.suppress(OSError):
            if self.f is not None:
                self.f.close()
        self.f = None
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)
        self.obj.close()


@dataclass
class Hit:
    file: IO[bytes]
    size: int


class OutputCache:
    def __init__(self, target_id: str, store: ObjectStore, budget: int | None = None) -> None:
        self.target_id = target_id
        self.store = store
        self.root = store.root / CACHE_DIR
        budget = budget_from_env(store.root) if budget is None else budget
        self.index = CacheIndex(target_id, self.root, budget)
        self._hashes: dict[str, tuple[EtlSpec, str]] = {}
        # Publishing (fsync, rename) and eviction: off the loop, never awaited by it.
        self._pool = ThreadPoolExecutor(PUBLISHERS, thread_name_prefix=f"etlcache-{target_id}")
        self._busy_lock = threading.Lock()
        self.busy = 0  # work submitted to the pool and not done yet
        self._touches_due = False

    @property
    def budget(self) -> int:
        return self.index.budget

    def stats(self, etl: str) -> dict[str, int]:
        return self.index.stats(etl)

    def drop(self, bucket: str, name: str | None) -> None:
        """``ObjectStore.on_change``: ``bucket/name`` (or all of ``bucket``) changed or went."""
        self.index.drop(bucket, name)

    # -- life cycle ------------------------------------------------------------

    async def start(self) -> None:
        """Index what a previous run left, in the background (hits work meanwhile)."""
        self._submit(self.index.load)

    async def stop(self) -> None:
        """Wait for the entries being published."""
        await anyio.to_thread.run_sync(self._pool.shutdown)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("ETL output cache of target %r", self.target_id)
            finally:
                with self._busy_lock:
                    self.busy -= 1

        with self._busy_lock:
            self.busy += 1
        try:
            self._pool.submit(run)
        except RuntimeError:  # shut down (the target is stopping): do it here
            run()

    # -- the data path ---------------------------------------------------------

    def spec_hash(self, record: EtlRecord) -> str:
        known = self._hashes.get(record.name)
        if known is None or known[0] is not record.spec:
            known = self._hashes[record.name] = (record.spec, record.spec.content_hash())
        return known[1]

    async def answer(
        self,
        record: EtlRecord,
        bucket: str,
        name: str,
        etl_args: str | None,
        zerocopy: bool,
        relay: Callable[[], Awaitable[Response]],
    ) -> Response:
        """The cached answer, or ``relay()``'s (the transformer's, relayed) teed into one."""
        gen = f"{record.name}/{self.spec_hash(record)}"
        found = self._lookup(record.name, gen, bucket, name, etl_args, quick=True)
        if found is None:  # no ETag beside the file, or it did not open: the store says why
            found = await anyio.to_thread.run_sync(
                self._lookup, record.name, gen, bucket, name, etl_args, False
            )
            assert found is not None
        hit, pending = found
        counters = self.index.counters[record.name]
        if hit is not None:
            counters.hits += 1
            return self._hit(record, gen, hit, zerocopy)
        assert pending is not None
        counters.misses += 1
        try:
            response = await relay()
        except BaseException:
            pending.discard()
            raise
        if f"{record.name}/{response.headers.get(SPEC_HASH_HEADER)}" != gen:
            pending.discard()  # another generation answered (a rollover): not ours to keep
            return response
        response.headers[CACHE_HEADER] = "miss"
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._tee(response.body_iterator, pending)
        elif self.busy < BACKLOG:  # read whole already: kept while it goes out
            self._submit(self._keep_whole, pending, response.body)
        else:
            pending.discard()
        return response

    def _lookup(
        self, etl: str, gen: str, bucket: str, name: str, args: str | None, quick: bool
    ) -> tuple[Hit | None, Pending | None] | None:
        if quick:
            opened = self.store.open_if_tagged(bucket, name)
            if opened is None:
                return None
        else:
            opened = self.store.open_object(bucket, name)  # ObjectNotFound: 404
        obj, info = opened
        try:
            rel = entry_path(gen, bucket, name, info.etag, info.size, args)
            try:
                f = open(self.root / rel, "rb")  # noqa: SIM115 - the response closes it
            except OSError:  # not there (or unreadable): a miss
                tmp = self.store.tmp_dir / f"etlcache-{uuid.uuid4().hex}"
                return None, Pending(etl, rel, bucket, name, obj, tmp)
        except BaseException:
            obj.close()
            raise
        obj.close()
        size = os.fstat(f.fileno()).st_size
        if self.index.touch(rel, etl, size) and not self._touches_due:
            self._touches_due = True  # many hits and no publish: apply them once
            self._submit(self._apply_touches)
        return Hit(f, size), None

    def _apply_touches(self) -> None:
        self._touches_due = False
        with self.index.lock:
            self.index.apply_touches()

    def _hit(self, record: EtlRecord, gen: str, hit: Hit, zerocopy: bool) -> Response:
        headers = {
            "Content-Length": str(hit.size),
            "X-Sluice-Etl": record.name,
            SPEC_HASH_HEADER: gen.rsplit("/", 1)[1],
            CACHE_HEADER: "hit",
        }
        media = "application/x-tar" if record.spec.mode == "wds" else "application/octet-stream"
        if zerocopy:
            return FileRangeResponse(hit.file, 0, hit.size, 200, headers, media_type=media)
        return StreamingResponse(file_chunks(hit.file), headers=headers, media_type=media)

    async def _tee(self, body: AsyncIterable[Any], p: Pending) -> AsyncIterator[Any]:
        """``body`` as it is, copied to ``p``'s temp file; published when it ended well."""
        chunks = aiter(body)
        complete = False
        try:
            if self.busy < BACKLOG:
                try:
                    p.f = open(p.tmp, "wb")  # noqa: SIM115 - closed by _publish or discard
                except OSError as e:
                    log.warning("ETL output cache: cannot write %s: %s", p.tmp, e)
            async for chunk in chunks:
                if p.f is not None:
                    self._write(p, chunk)
                yield chunk
            complete = True
        finally:
            if complete and p.f is not None:
                self._submit(self._publish, p)
            else:
                p.discard()  # a break, an error, a client gone: nothing is kept
            if (aclose := getattr(chunks, "aclose", None)) is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _write(self, p: Pending, chunk: bytes | memoryview) -> None:
        """Page-cache writes are fast (as the store's); a full disk only stops the copy."""
        assert p.f is not None
        p.size += len(chunk)
        try:
            if p.size > self.budget:
                raise OSError(f"the answer is larger than {BUDGET_ENV}={self.budget}")
            p.f.write(chunk)
        except OSError as e:
            log.info("ETL output cache: not keeping %s (%s)", p.rel, e)
            with contextlib.suppress(OSError):
                p.f.close()
            p.f = None

    def _keep_whole(self, p: Pending, body: bytes | memoryview) -> None:
        if len(body) > self.budget:
            p.discard()
            return
        try:
            p.f = open(p.tmp, "wb")  # noqa: SIM115 - closed by _publish or discard
            p.f.write(body)
        except OSError as e:
            log.info("ETL output cache: not keeping %s (%s)", p.rel, e)
            p.discard()
            return
        self._publish(p)

    def _publish(self, p: Pending) -> None:
        try:
            f, p.f = p.f, None
            assert f is not None
            with f:
                f.flush()
                os.fsync(f.fileno())  # never a torn entry after a power loss
                size = os.fstat(f.fileno()).st_size
            if size > self.budget:
                return
            was, now = os.fstat(p.obj.fileno()), os.stat(self.store.local_path(p.bucket, p.name))
            if (was.st_dev, was.st_ino) != (now.st_dev, now.st_ino):
                return  # the object was replaced while it was transformed
            dest = self.root / p.rel
            with self.index.lock:
                self.index.apply_touches()
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(p.tmp, dest)
                self.index.gens.add("/".join(p.rel.split("/", 2)[:2]))
                self.index.add(p.rel, p.etl, size)
                self.index.evict()
        except (OSError, SluiceError) as e:  # the object is gone, the disk is full...
            log.info("ETL output cache: not keeping %s (%s)", p.rel, e)
        finally:
            p.discard()


async def file_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    """The rest of ``f``, read in a thread a block at a time; closes it."""
    try:
        while chunk := await anyio.to_thread.run_sync(f.read, READ_CHUNK):
            yield chunk
    finally:
        f.close()
