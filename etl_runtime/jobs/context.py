"""What a job kind's runner gets: ``JobContext`` (one per job on each target)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote

import anyio
import anyio.to_thread
import httpx

from etl_runtime.cluster.clustermap import hrw_order
from etl_runtime.core.access import object_url
from etl_runtime.core.errors import InsufficientStorage, Unavailable
from etl_runtime.jobs.state import ABORTED, FAILED, MAX_ERRORS, TERMINAL, JobPart

if TYPE_CHECKING:
    from etl_runtime.etl.forward import EtlForwarder
    from etl_runtime.jobs.manager import JobManager
    from etl_runtime.providers.cache import RemoteCache
    from etl_runtime.storage.copies import Placement
    from etl_runtime.storage.store import ObjectStore

T = TypeVar("T")
Body = bytes | AsyncIterable[bytes] | Callable[[], AsyncIterable[bytes]]
META_HEADER = "X-Sluice-Job-Meta"
FROM_HEADER = "X-Sluice-Job-From"


class Target(Protocol):
    """What a job needs of the target it runs on (``storage_target.context.Target`` is one).

    Jobs see this much and no more of the service that mounts them.
    """

    id: str
    store: ObjectStore
    forwarder: EtlForwarder
    token: str | None
    cluster_key: str | None
    placement: Placement | None
    read_token: str | None
    remote: RemoteCache | None
    events: Any  # Kubernetes Events on the target's pod (cluster/kube/events.py), or None


class JobAborted(Exception):
    """The job was aborted (``POST /v1/jobs/{id}/abort``) while this target ran it."""


class JobFailed(Exception):
    """Raise from a runner to end the job as ``Failed`` with this message as the reason."""


class Progress:
    def __init__(self, part: JobPart, dirty: Callable[[], None]) -> None:
        self._part, self._dirty = part, dirty

    def add(self, objects: int = 0, bytes: int = 0, records: int = 0, skipped: int = 0) -> None:
        p = self._part.progress
        p["objects"] = p.get("objects", 0) + objects
        p["bytes"] = p.get("bytes", 0) + bytes
        p["records"] = p.get("records", 0) + records
        p["skipped"] = p.get("skipped", 0) + skipped
        self._dirty()

    def get(self) -> dict[str, int]:
        return dict(self._part.progress)


class JobContext:
    """One target's view of one job; see ``etl_runtime.jobs`` for the API."""

    def __init__(self, manager: JobManager, target: Target, part: JobPart, resumed: bool) -> None:
        self.manager = manager
        self.target = target
        self.part = part
        self.id, self.kind, self.spec = part.id, part.kind, part.spec
        self.target_id = target.id
        self.members: list[str] = sorted(part.members)
        self.store = target.store
        self.placement = target.placement
        self.forwarder = target.forwarder
        self.resumed = resumed
        self.aborted = asyncio.Event()
        self.progress = Progress(part, self.dirty)
        self.workdir: Path = manager.files.workdir(part.id)

    # -- state --------------------------------------------------------------------

    def dirty(self) -> None:
        self.manager.mark_dirty(self.part.id)

    def error(self, obj: str | None, message: str) -> None:
        """Count a per-object failure and list it (the first ``MAX_ERRORS`` per target)."""
        self.part.error_count += 1
        if len(self.part.errors) < MAX_ERRORS:
            self.part.errors.append(
                {"time": time.time(), "target": self.target_id, "object": obj, "error": message}
            )
        self.dirty()

    @property
    def checkpoint(self) -> dict[str, Any]:
        return self.part.checkpoint

    async def save_checkpoint(self, checkpoint: dict[str, Any] | None = None) -> None:
        """Persist ``checkpoint`` (or the current one) now: a restarted target sees it."""
        if checkpoint is not None:
            self.part.checkpoint = checkpoint
        await self.manager.persist(self.part)

    def set_output(self, **output: Any) -> None:
        self.part.output.update(output)
        self.dirty()

    def check(self) -> None:
        """Raise ``JobAborted`` once the job was aborted; call it between units of work."""
        if self.aborted.is_set():
            raise JobAborted(self.part.reason or "aborted")

    # -- objects ------------------------------------------------------------------

    def owners(self, bucket: str, name: str) -> list[str]:
        cmap = self.manager.cmap.get() if self.manager.cmap is not None else None
        if cmap is None or cmap.version == 0 or not cmap.members:
            # No shared map (Kubernetes without one): HRW over the job's members, as
            # the gateway places over its live targets.
            return hrw_order(self.members, f"{bucket}/{name}")[:1] or [self.target_id]
        return cmap.owners(bucket, name)

    def owns(self, bucket: str, name: str) -> bool:
        """True if this target is the first (primary) owner: the one that processes it."""
        return self.owners(bucket, name)[0] == self.target_id

    async def owned_objects(self, bucket: str, prefix: str = "") -> AsyncIterator[str]:
        """Names of ``bucket`` this target holds and is the primary owner of, in order."""
        start_after = ""
        while True:
            page, nxt = await anyio.to_thread.run_sync(
                self.store.list_objects, bucket, prefix, start_after, 1000
            )
            for info in page:
                if self.owns(bucket, info.name):
                    yield info.name
            if nxt is None or not page:
                return
            start_after = page[-1].name

    async def put_object(self, bucket: str, name: str, body: AsyncIterable[bytes] | bytes) -> int:
        """Store ``bucket/name`` at its HRW owner (with its copies); returns the size.

        Written here directly when this target is the only owner; otherwise the
        body is kept first (in memory up to 4 MiB, else in ``workdir``) so the
        write can be retried while an owner is away (up to ``target_timeout``).
        """
        owners = self.owners(bucket, name)
        if owners == [self.target_id] or self.placement is None:
            info = await self.store.write_object(bucket, name, _as_stream(body))
            assert info is not None
            return info.size
        with self.store.full_disk_is_507(bucket, name):  # the spool is on this disk
            kept = await _keep(body, self.workdir)
        try:
            return await self.retrying(
                f"PUT {bucket}/{name}", lambda: self._put(bucket, name, kept)
            )
        finally:
            if isinstance(kept, Path):
                kept.unlink(missing_ok=True)

    async def _put(self, bucket: str, name: str, kept: bytes | Path) -> int:
        owners = self.owners(bucket, name)
        if self.target_id in owners and self.placement is not None:
            others = self.placement.check_owner(bucket, name)
            copies = self.placement.write_through(bucket, name, others)
            info = await self.store.write_object(bucket, name, _replay(kept), before_publish=copies)
            assert info is not None
            return info.size
        url = object_url(self.manager.url(self.part, owners[0]), bucket, name)
        headers = {"Authorization": f"Bearer {self.target.token}"} if self.target.token else {}
        r = await self.manager.http.put(url, content=_replay(kept), headers=headers)
        if r.status_code == 503:
            raise Unavailable(f"target {owners[0]!r} answered 503: {r.text[:300]}")
        if r.status_code == InsufficientStorage.status:  # its disk is full: no retry helps
            try:
                error = str(r.json()["error"])
            except (ValueError, KeyError, TypeError):
                error = f"target {owners[0]!r} has no space left for {bucket}/{name}"
            raise InsufficientStorage(
                error,
                target=owners[0],
                bucket=bucket,
                object=name,
            )
        if r.status_code != 200:
            raise OSError(f"PUT {bucket}/{name} on target {owners[0]!r}: {r.status_code} {r.text}")
        return int(r.json().get("size", 0))

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, again while a target is unreachable or busy (503), up to the timeout."""
        deadline = time.monotonic() + self.manager.target_timeout
        delay = 0.1
        while True:
            self.check()
            try:
                return await call()
            except (httpx.TransportError, Unavailable) as e:
                if time.monotonic() > deadline:
                    raise OSError(f"{what}: {e}") from None
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def map(
        self,
        items: AsyncIterable[T] | Iterable[T],
        fn: Callable[[T], Awaitable[None]],
        workers: int,
    ) -> None:
        """``fn(item)`` for every item, at most ``workers`` at once; stops on abort."""
        queue: asyncio.Queue[T | None] = asyncio.Queue(maxsize=workers * 2)

        async def worker() -> None:
            while (item := await queue.get()) is not None:
                self.check()
                await fn(item)

        tasks = [asyncio.create_task(worker()) for _ in range(max(1, workers))]
        try:
            if isinstance(items, AsyncIterable):
                async for item in items:
                    await _put(queue, item, tasks)
            else:
                for item in items:
                    await _put(queue, item, tasks)
            for _ in tasks:
                await _put(queue, None, tasks)
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- across targets -----------------------------------------------------------

    async def barrier(self, name: str, timeout: float | None = None) -> None:
        """Wait until every member target has reached phase ``name`` (persisted).

        Raises ``JobFailed`` if a member's part failed or aborted, or a member
        stays unreachable longer than ``timeout`` (default: the manager's
        ``target_timeout``, ``SLUICE_JOB_TARGET_TIMEOUT``).
        """
        if name not in self.part.phases:
            self.part.phases.append(name)
            await self.manager.persist(self.part)
        limit = self.manager.target_timeout if timeout is None else timeout
        waiting = {t for t in self.members if t != self.target_id}
        away_since: dict[str, float] = {}
        delay = 0.05
        while waiting:
            self.check()
            for t in sorted(waiting):
                try:
                    r = await self.manager.http.get(
                        self.manager.url(self.part, t)
                        + f"/v1/_jobs/{quote(self.id)}/phase/{quote(name)}",
                        timeout=5.0,
                    )
                    doc = r.json() if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError, OSError):
                    doc = None
                if doc is None:
                    since = away_since.setdefault(t, time.monotonic())
                    if time.monotonic() - since > limit:
                        raise JobFailed(
                            f"target {t!r} did not reach phase {name!r}: not reachable "
                            f"(or without this job) for {limit:.0f}s"
                        )
                    continue
                away_since.pop(t, None)
                if doc.get("state") in (FAILED, ABORTED):
                    raise JobFailed(
                        f"target {t!r} {doc['state'].lower()} the job: {doc.get('reason')}"
                    )
                if doc.get("reached"):
                    waiting.discard(t)
            if waiting:
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def send(
        self, target: str, meta: dict[str, Any], body: Body, timeout: float | None = None
    ) -> Any:
        """Stream ``body`` to ``target``'s part of this job (its kind's ``receive``).

        ``body`` is bytes, an async iterable (sent once, no retry) or a function
        returning a fresh async iterable (retried while ``target`` is away, up to
        ``timeout``). Returns what the receiver returned. To this target itself,
        ``receive`` is called directly.
        """
        if target == self.target_id:
            return await self.manager.receive(self.id, self.target_id, meta, _stream_of(body))
        limit = self.manager.target_timeout if timeout is None else timeout
        replayable = not isinstance(body, AsyncIterable)
        started = time.monotonic()
        delay = 0.1
        while True:
            self.check()
            problem: str
            try:
                r = await self.manager.http.post(
                    self.manager.url(self.part, target) + f"/v1/_jobs/{quote(self.id)}/recv",
                    content=_stream_of(body),
                    headers={META_HEADER: json.dumps(meta), FROM_HEADER: self.target_id},
                    timeout=httpx.Timeout(600.0, connect=5.0),
                )
                if r.status_code == 200:
                    return r.json().get("result")
                problem = f"answered {r.status_code}: {r.text[:300]}"
                if r.status_code not in (404, 503):
                    raise JobFailed(f"sending to target {target!r} failed: {problem}")
            except (httpx.HTTPError, OSError) as e:
                problem = f"not reachable ({e!r})"
            if not replayable or time.monotonic() - started > limit:
                raise JobFailed(f"sending to target {target!r} failed: {problem}")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)


async def _put(queue: asyncio.Queue[Any], item: Any, tasks: list[asyncio.Task[None]]) -> None:
    """Queue ``item``; re-raise a worker's error instead of blocking on a full queue.

    ``asyncio.timeout``, not ``wait_for``: on Python 3.11 a cancel that lands as
    the put completes is lost in ``wait_for``, and a stopping target's part then
    runs on beside its restarted self (tests/dsort/test_stop_mid_job.py).
    """
    while True:
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        try:
            async with asyncio.timeout(0.5):
                await queue.put(item)
            return
        except TimeoutError:
            continue


def _stream_of(body: Body) -> AsyncIterator[bytes]:
    if isinstance(body, bytes):
        return _one(body)
    if isinstance(body, AsyncIterable):
        return aiter(body)
    return aiter(body())


SPOOL_MEMORY = 4 << 20


async def _keep(body: AsyncIterable[bytes] | bytes, workdir: Path) -> bytes | Path:
    """The whole body, in memory if small, else in a file under ``workdir``."""
    if isinstance(body, bytes):
        return body
    buf = bytearray()
    f = None
    path = workdir / f"out-{uuid.uuid4().hex}"
    try:
        async for chunk in body:
            if f is None and len(buf) + len(chunk) <= SPOOL_MEMORY:
                buf += chunk
                continue
            if f is None:
                workdir.mkdir(parents=True, exist_ok=True)
                f = await anyio.open_file(path, "wb")
                await f.write(bytes(buf))
            await f.write(chunk)
    except BaseException:
        if f is not None:
            await f.aclose()
            path.unlink(missing_ok=True)
        raise
    if f is None:
        return bytes(buf)
    await f.aclose()
    return path


async def _replay(kept: bytes | Path) -> AsyncIterator[bytes]:
    if isinstance(kept, bytes):
        yield kept
        return
    async with await anyio.open_file(kept, "rb") as f:
        while chunk := await f.read(1 << 20):
            yield chunk


def _as_stream(body: AsyncIterable[bytes] | bytes) -> AsyncIterator[bytes]:
    return _one(body) if isinstance(body, bytes) else aiter(body)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


__all__ = ["JobAborted", "JobContext", "JobFailed", "Progress", "TERMINAL"]
