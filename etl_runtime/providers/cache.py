"""``RemoteCache``: a target's cache of the remote buckets (any provider) it owns objects of.

Cold GET. The first GET of an object that is not here starts one *fill*: a
backend GET whose bytes go into a temp file as they arrive. Every GET of that
object until its last byte is in (the first one included, any number more) is
a reader of that temp file (a later one waits for the publish: a warm GET):
it gets the headers as soon as the backend answered (size, ETag,
Last-Modified), then each byte as soon as the fill wrote it, so the first
byte does not wait for the whole object, and ten concurrent cold GETs make
one backend fetch. The fill runs to its end even when its
readers leave (it is the cache), then publishes the file into the store
(atomic rename). A fill that breaks makes its readers' answers break off
(never a short answer that looks whole) and leaves nothing in the cache.

With the bucket's ``validate_cold_get`` (AIStore's name; default false, as
there) a fill also hashes the bytes it receives with MD5 and compares the
digest with the backend's, where the backend's ETag is one: S3's and
MinIO's for an object not uploaded in parts (32 hex digits), GCS's XML API
for an object not composed, and fake-gcs-server's base64 of it. The last
chunk is held back until the digest matches, so a fill whose bytes are not
the backend's breaks its readers' answers before their last byte (a 502 for a
reader that has not started), counts ``sluice_remote_cold_mismatches``, and
caches nothing. Multipart and composite ETags and Azure's carry no digest:
those fills are served unchecked against the backend (their own XXH3 is
still stored and checked on every read). S3 objects under SSE-KMS or SSE-C
have ETags that are not MD5s either: leave the prop off for such buckets.

Durability. A fill is not fsynced (neither the file nor its directory): a
cached copy is refetchable from the backend, so it need not survive a power
loss, only never be *served* torn. It cannot be: the temp file is renamed
into place only once every byte is in, with the backend's ETag and the
copy's checksum (``integrity``: XXH3 and size) set on it before the rename,
and every read checks the bytes against that checksum. After a crash the
rename may be there without all of the data (a shorter file, or zeros where
the kernel had not written back yet): the read finds the size or the hash
wrong (before the first byte; a big object's stream is cut before its last
byte), drops the copy and fetches the object again (``refetch``); a lost
rename is a plain cold GET. User PUTs and write-through PUTs stay durable
(``ObjectStore.write_object``: fsync, rename, fsync of the directory) before
they are acknowledged. Without the fsyncs a fill waits for no disk: the
kernel writes the file back when it will (docs/benchmarks.md has the cost).

Warm GET. A cached object is served by the ordinary store path. With the
bucket's ``validate_warm_get`` it is first checked against the backend's
ETag and size (at most every ``validate_interval`` seconds): changed, it is
fetched again; gone, it is dropped and the GET is a 404.

Capacity. Cached remote objects are evicted least recently used first when
their total passes ``SLUICE_REMOTE_CACHE_BYTES`` (if set) or the data
filesystem passes ``SLUICE_REMOTE_CACHE_HIGH_WM`` percent used (default 90),
down to 90% of that mark. Objects of ``ais`` buckets are never evicted.

Writes. A PUT is written through: the body is uploaded to the backend from
the temp file before it is published here and acknowledged. A DELETE deletes
on the backend, then here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import anyio.to_thread

from etl_runtime.cluster.clustermap import BucketProps, ClusterMapStore
from etl_runtime.core.errors import BackendError, InvalidRequest, ObjectNotFound, SluiceError
from etl_runtime.providers.backend import Backend, RemoteMeta, backend_class
from etl_runtime.storage import integrity
from etl_runtime.storage.store import ETAG_XATTR, READ_CHUNK, BeforePublish, ObjectStore

log = logging.getLogger(__name__)

DEFAULT_HIGH_WM = 90.0
MEMORY_WINDOW = 8 << 20  # per fill
LOW_WM_RATIO = 0.9


@dataclass
class Counters:
    """What ``sluice_remote_*`` metrics report (etl_runtime.core.metrics.RemoteCacheCollector)."""

    hits: int = 0
    misses: int = 0
    backend_fetches: int = 0
    backend_fetch_bytes: int = 0
    backend_fetch_errors: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    validations: int = 0
    cold_checked: int = 0
    cold_mismatches: int = 0
    cached_bytes: int = 0


class Fill:
    """One backend GET of ``bucket/name`` into a temp file, and its readers' view of it."""

    def __init__(self, bucket: str, name: str, tmp: Path) -> None:
        self.bucket, self.name, self.tmp = bucket, name, tmp
        self.meta: RemoteMeta | None = None
        self.written = 0
        self.done = False
        self.check = False  # validate_cold_get: the last chunk waits for the MD5
        self.error: BaseException | None = None
        self.ready = asyncio.Event()  # meta known, or failed
        self.finished = asyncio.Event()  # published, or failed
        self._progress = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # The latest chunks, so readers that keep up take them from memory
        # (no disk read, no thread hop); one that fell behind reads the file.
        self.recent: collections.deque[tuple[int, bytes]] = collections.deque()
        self.recent_bytes = 0
        self.xxh = integrity.new_hash()  # the copy's checksum, stored when it is published

    def append(self, chunk: bytes) -> None:
        self.xxh.update(chunk)
        self.recent.append((self.written, chunk))
        self.recent_bytes += len(chunk)
        self.written += len(chunk)
        while self.recent_bytes - len(self.recent[0][1]) >= MEMORY_WINDOW:
            self.recent_bytes -= len(self.recent.popleft()[1])
        self.notify()

    def from_memory(self, offset: int) -> memoryview | None:
        """The bytes from ``offset`` up to the end of the chunk holding it, if still held."""
        for start, chunk in self.recent:
            if start <= offset < start + len(chunk):
                return memoryview(chunk)[offset - start :]
        return None

    def notify(self) -> None:
        ev, self._progress = self._progress, asyncio.Event()
        ev.set()

    async def wait_beyond(self, offset: int) -> None:
        while self.written <= offset and not self.done and self.error is None:
            await self._progress.wait()


def etag_md5(etag: str) -> bytes | None:
    """The MD5 an ETag is, if it is one: 32 hex digits (S3, MinIO and GCS's XML API for
    an object not uploaded in parts or composed), or the base64 of 16 bytes
    (fake-gcs-server). None for a multipart ETag (``-N``) or an opaque one (Azure)."""
    etag = etag.strip().strip('"')
    if len(etag) == 32:
        with contextlib.suppress(ValueError):
            return bytes.fromhex(etag)
    if len(etag) == 24 and etag.endswith("=="):
        with contextlib.suppress(binascii.Error, ValueError):
            digest = base64.b64decode(etag, validate=True)
            return digest if len(digest) == 16 else None
    return None


def _write_all(f: IO[bytes], chunk: bytes | memoryview) -> None:
    view, done = memoryview(chunk), 0
    while done < len(view):
        done += f.write(view[done:]) or 0


class RemoteCache:
    def __init__(
        self,
        target_id: str,
        store: ObjectStore,
        cmap: ClusterMapStore | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.target_id = target_id
        self.store = store
        self.cmap = cmap
        self.env = dict(os.environ if env is None else env)
        self.counters = Counters()
        self._fills: dict[tuple[str, str], Fill] = {}
        self._backends: dict[tuple[str, str, str], Backend] = {}
        self._validated: dict[tuple[str, str], float] = {}
        self._lru: collections.OrderedDict[tuple[str, str], int] | None = None
        self.capacity = int(self.env.get("SLUICE_REMOTE_CACHE_BYTES") or 0)
        self.high_wm = float(self.env.get("SLUICE_REMOTE_CACHE_HIGH_WM") or DEFAULT_HIGH_WM)
        self._evicting = False

    # -- buckets -----------------------------------------------------------------------

    def props(self, bucket: str) -> BucketProps | None:
        """The props of ``bucket`` if it is a remote bucket, else None."""
        if self.cmap is None:
            return None
        props = self.cmap.get().buckets.get(bucket)
        return props if props is not None and props.remote else None

    def backend(self, bucket: str, props: BucketProps | None = None) -> Backend:
        props = props or self.props(bucket)
        if props is None:
            raise InvalidRequest(f"bucket {bucket!r} is not a remote bucket", bucket=bucket)
        key = (props.provider, bucket, json.dumps(props.backend, sort_keys=True))
        backend = self._backends.get(key)
        if backend is None:  # new bucket, or its props changed
            backend = self._backends[key] = backend_class(props.provider).for_bucket(
                bucket, props.backend, self.env
            )
        return backend

    def is_cached(self, bucket: str, name: str) -> bool:
        try:
            return self.store.local_path(bucket, name).is_file()
        except SluiceError:
            return False

    # -- reads ---------------------------------------------------------------------------

    async def ensure_fresh(self, bucket: str, name: str, props: BucketProps) -> bool:
        """True if ``bucket/name`` is cached here (and valid); a hit is counted."""
        fill = self._fills.get((bucket, name))
        if fill is not None and fill.meta is not None and fill.written >= fill.meta.size:
            # Every byte is here and the fill is publishing (rename). A GET
            # that comes now is a warm GET, checked as the bucket says, not another
            # reader of a fetch that began before it (it served an object deleted on
            # the backend meanwhile, with validate_warm_get on).
            await fill.finished.wait()
        path = self.store.local_path(bucket, name)
        if not path.is_file():
            return False
        if props.backend.get("validate_warm_get") and not await self._still_valid(
            bucket, name, path, props
        ):
            return False
        self.counters.hits += 1
        self._touch(bucket, name, None)
        return True

    async def _still_valid(self, bucket: str, name: str, path: Path, props: BucketProps) -> bool:
        key = (bucket, name)
        interval = float(props.backend.get("validate_interval") or 0.0)
        last = self._validated.get(key)
        if last is not None and interval and time.monotonic() - last < interval:
            return True
        self.counters.validations += 1
        meta = await self.backend(bucket, props).head(name)
        try:
            local = os.getxattr(path, ETAG_XATTR).decode()
            size = path.stat().st_size
        except OSError:
            local, size = "", -1
        if meta is not None and meta.etag == local and meta.size == size:
            self._validated[key] = time.monotonic()
            return True
        self._drop(bucket, name)
        if meta is None:
            raise ObjectNotFound(
                f"object {props.provider}://{bucket}/{name} no longer exists on backend "
                f"{self.backend(bucket, props).where} (dropped from the cache)",
                bucket=bucket,
                object=name,
            )
        return False

    def fill(self, bucket: str, name: str, props: BucketProps) -> Fill:
        """The running fill of ``bucket/name``, or a new one (one backend GET at a time)."""
        key = (bucket, name)
        fill = self._fills.get(key)
        if fill is None:
            self.counters.misses += 1
            self.store.bucket_dir(bucket)  # the bucket's directory exists before we write
            fill = Fill(bucket, name, self.store.tmp_dir / f"remote-{uuid.uuid4().hex}")
            self._fills[key] = fill
            fill.check = bool(props.backend.get("validate_cold_get"))
            fill.task = asyncio.get_running_loop().create_task(
                self._run_fill(fill, self.backend(bucket, props), fill.check),
                name=f"fill {bucket}/{name}",
            )
        return fill

    async def _run_fill(self, fill: Fill, backend: Backend, check: bool = False) -> None:
        key = (fill.bucket, fill.name)
        f: IO[bytes] | None = None
        try:
            self.counters.backend_fetches += 1
            meta, chunks = await backend.open(fill.name)
            # Unbuffered: a byte readers are told of is in the file (sent from it by sendfile).
            f = open(fill.tmp, "wb", buffering=0)  # noqa: SIM115 - closed below
            fill.meta = meta
            fill.ready.set()
            expected = etag_md5(meta.etag) if check else None
            md5 = hashlib.md5(usedforsecurity=False) if expected is not None else None
            async for chunk in chunks:
                if md5 is not None:  # the last chunk waits for the digest
                    md5.update(chunk)
                    if fill.written + len(chunk) >= meta.size:
                        self._check_md5(fill, backend, meta, md5.digest(), expected)
                _write_all(f, chunk)
                self.counters.backend_fetch_bytes += len(chunk)
                fill.append(chunk)
            if fill.written != meta.size:
                raise BackendError(
                    f"backend {backend.where} sent {fill.written} of {meta.size} bytes of "
                    f"{backend.uri(fill.name)}",
                    bucket=fill.bucket,
                    object=fill.name,
                    backend=backend.where,
                )
            if md5 is not None and not meta.size:
                self._check_md5(fill, backend, meta, md5.digest(), expected)
            if self.store.local_path(fill.bucket, fill.name).parent.is_dir():
                self._publish(f, fill, meta)  # a few metadata calls: on the loop, no hop
            else:  # new directories are made durable (fsynced): in a thread
                await anyio.to_thread.run_sync(self._publish, f, fill, meta)
            f = None
            fill.done = True
            self._touch(fill.bucket, fill.name, meta.size, new=True)
            self._validated[key] = time.monotonic()
        except BaseException as e:
            self.counters.backend_fetch_errors += 1
            fill.error = (
                self.store.no_space(e, fill.bucket, fill.name, backend.provider) or e
            )  # 507: full
            if not isinstance(e, SluiceError | asyncio.CancelledError):
                log.exception("fill of %s/%s failed", fill.bucket, fill.name)
            if f is not None:
                with contextlib.suppress(OSError):  # its flush may fail again (ENOSPC)
                    f.close()
            fill.tmp.unlink(missing_ok=True)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self._fills.pop(key, None)
            fill.ready.set()
            fill.finished.set()
            fill.recent.clear()
            fill.notify()
        self._maybe_evict()

    def _check_md5(
        self,
        fill: Fill,
        backend: Backend,
        meta: RemoteMeta,
        got: bytes,
        expected: bytes | None,
    ) -> None:
        """``validate_cold_get``: the fill's digest is the backend's, or a ``BackendError``
        (502) naming the object, the backend and both digests."""
        self.counters.cold_checked += 1
        if got == expected:
            return
        self.counters.cold_mismatches += 1
        log.error("fill of %s/%s: MD5 %s, the backend's %s", fill.bucket, fill.name, got.hex(),
                  (expected or b"").hex())  # fmt: skip
        raise BackendError(
            f"the bytes backend {backend.where} sent for {backend.uri(fill.name)} have MD5 "
            f"{got.hex()}, not its ETag's {(expected or b'').hex()} (validate_cold_get): "
            "nothing was served whole or cached; the next GET fetches it again",
            bucket=fill.bucket,
            object=fill.name,
            backend=backend.where,
        )

    def _publish(self, f: IO[bytes], fill: Fill, meta: RemoteMeta) -> None:
        """The complete temp file, its ETag and checksum, renamed into place: no fsync
        (the module's docstring, "Durability", says why)."""
        try:
            os.setxattr(f.fileno(), ETAG_XATTR, meta.etag.encode())
        except OSError:
            pass
        integrity.store(f.fileno(), fill.xxh.hexdigest(), fill.written)
        if meta.last_modified:  # Last-Modified as the backend says
            os.utime(f.fileno(), (time.time(), meta.last_modified))
        f.close()
        bdir = self.store.bucket_dir(fill.bucket)
        self.store._publish(fill.tmp, bdir, fill.bucket, fill.name, False, durable=False)

    def open_fill(self, fill: Fill) -> IO[bytes] | None:
        """The fill's temp file for reading, or None once it is published (or failed)."""
        try:
            return open(fill.tmp, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            return None

    async def reader(self, fill: Fill) -> AsyncIterator[bytes | memoryview]:
        """The object's bytes as the fill writes them (call after ``fill.ready``)."""
        try:
            src: IO[bytes] | None = open(fill.tmp, "rb", buffering=0)  # noqa: SIM115
        except FileNotFoundError:
            src = None  # already published (or failed): read the cache
        if src is None:
            if fill.error is not None:
                raise fill.error
            f, _ = await anyio.to_thread.run_sync(self.store.open_object, fill.bucket, fill.name)
            with f:
                while chunk := await anyio.to_thread.run_sync(f.read, READ_CHUNK):
                    yield chunk
            return
        offset = 0
        assert fill.meta is not None
        size = fill.meta.size
        with src:
            # Done when every byte went out: the fill's publish need not
            # be waited for (they make the copy durable for later readers only).
            while offset < size:
                await fill.wait_beyond(offset)
                if fill.error is not None:
                    raise fill.error
                if fill.written <= offset:
                    continue
                data = fill.from_memory(offset)
                if data is None:
                    n = min(fill.written - offset, READ_CHUNK)
                    data = memoryview(
                        await anyio.to_thread.run_sync(os.pread, src.fileno(), n, offset)
                    )
                offset += len(data)
                yield data

    async def wait_filled(self, fill: Fill) -> None:
        await fill.finished.wait()
        if fill.error is not None:
            raise fill.error

    async def refetch(self, bucket: str, name: str, props: BucketProps) -> None:
        """After a read found the cached copy's bytes not its checksum (a fill torn by a
        crash, or a bad disk): drop it and fetch the object again (one fill at a time)."""
        fill = self._fills.get((bucket, name))
        if fill is None:
            log.warning("cached copy of %s/%s is damaged: fetched again", bucket, name)
            self._drop(bucket, name)
            fill = self.fill(bucket, name, props)
        await self.wait_filled(fill)

    async def prefetch_one(self, bucket: str, name: str, props: BucketProps) -> bool:
        """Warm ``bucket/name``; False if it was cached already."""
        if self.is_cached(bucket, name):
            return False
        await self.wait_filled(self.fill(bucket, name, props))
        return True

    # -- writes --------------------------------------------------------------------------

    def write_through(self, bucket: str, name: str, props: BucketProps) -> BeforePublish:
        backend = self.backend(bucket, props)

        async def upload(tmp: Path, etag: str, size: int) -> None:
            meta = await backend.put_file(name, tmp)
            with contextlib.suppress(OSError):  # the copy has the backend's ETag, as fetched
                os.setxattr(tmp, ETAG_XATTR, meta.etag.encode())
            self._touch(bucket, name, size, new=True)
            self._validated[(bucket, name)] = time.monotonic()

        return upload

    async def delete(self, bucket: str, name: str, props: BucketProps) -> None:
        """Delete on the backend, then here; 404 if neither has it."""
        backend = self.backend(bucket, props)
        cached = self.is_cached(bucket, name)
        if not cached and await backend.head(name) is None:
            raise ObjectNotFound(
                f"object {backend.uri(name)} does not exist on backend {backend.where}",
                bucket=bucket,
                object=name,
                backend=backend.where,
            )
        await backend.delete(name)
        self._drop(bucket, name)

    # -- eviction ------------------------------------------------------------------------

    def evict(
        self, bucket: str, prefix: str = "", names: Collection[str] | None = None
    ) -> tuple[int, int]:
        """Drop the cached copies in ``bucket`` under ``prefix`` (or of ``names``):
        (objects, bytes)."""
        objects = size = 0
        for name in list(self.store.iter_names(bucket)) if names is None else names:
            if name.startswith(prefix):
                try:
                    n = self.store.local_path(bucket, name).stat().st_size
                except OSError:
                    continue
                if self._drop(bucket, name):
                    objects, size = objects + 1, size + n
        return objects, size

    def _drop(self, bucket: str, name: str) -> bool:
        self._validated.pop((bucket, name), None)
        try:
            self.store.delete_object(bucket, name)
        except SluiceError:
            return False
        finally:
            if self._lru is not None and (n := self._lru.pop((bucket, name), None)) is not None:
                self.counters.cached_bytes -= n
        return True

    def _load_lru(self) -> collections.OrderedDict[tuple[str, str], int]:
        if self._lru is None:
            found: list[tuple[float, tuple[str, str], int]] = []
            remote = {
                b for b, p in (self.cmap.get().buckets if self.cmap else {}).items() if p.remote
            }
            for bucket in self.store.bucket_dirs():
                if bucket not in remote:
                    continue
                for name in self.store.iter_names(bucket):
                    try:
                        st = self.store.local_path(bucket, name).stat()
                    except OSError:
                        continue
                    found.append((st.st_atime, (bucket, name), st.st_size))
            found.sort()
            self._lru = collections.OrderedDict((k, n) for _t, k, n in found)
            self.counters.cached_bytes = sum(self._lru.values())
        return self._lru

    def _touch(self, bucket: str, name: str, size: int | None, new: bool = False) -> None:
        lru = self._load_lru()
        key = (bucket, name)
        if key in lru:
            lru.move_to_end(key)
            if new and size is not None:
                self.counters.cached_bytes += size - lru[key]
                lru[key] = size
        elif size is not None:
            lru[key] = size
            self.counters.cached_bytes += size
        elif new is False:
            try:
                n = self.store.local_path(bucket, name).stat().st_size
            except OSError:
                return
            lru[key] = n
            self.counters.cached_bytes += n

    def _over(self, factor: float) -> bool:
        if self.capacity and self.counters.cached_bytes > self.capacity * factor:
            return True
        try:
            usage = shutil.disk_usage(self.store.root)
        except OSError:
            return False
        return usage.used * 100.0 / max(usage.total, 1) > self.high_wm * factor

    def _maybe_evict(self) -> None:
        if self._evicting or not self._over(1.0):
            return
        self._evicting = True
        try:
            lru = self._load_lru()
            busy = set(self._fills)
            for key in list(lru):
                if not self._over(LOW_WM_RATIO):
                    break
                if key in busy:
                    continue
                n = lru[key]
                if self._drop(*key):
                    self.counters.evicted += 1
                    self.counters.evicted_bytes += n
                    log.info("evicted %s/%s (%d bytes): cache above its high-water mark", *key, n)
        finally:
            self._evicting = False
