"""The jobs of one target: start, run, persist, resume after a restart, abort."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.core import auth, tls
from etl_runtime.core.errors import (
    Conflict,
    InsufficientStorage,
    JobNotFound,
    SluiceError,
    Unavailable,
)
from etl_runtime.core.eventloop import cancel_and_wait
from etl_runtime.jobs.context import JobAborted, JobContext, JobFailed, Target
from etl_runtime.jobs.kinds import get_kind
from etl_runtime.jobs.state import ABORTED, FAILED, FINISHED, RUNNING, TERMINAL, JobFiles, JobPart
from etl_runtime.storage.peers import INTERNAL_HEADER
from etl_runtime.storage.store import NO_SPACE

log = logging.getLogger(__name__)
FLUSH_SECONDS = 0.5
KEEP_ENDED = 1000  # ended jobs kept per target (listed by GET /v1/jobs)


def target_timeout_from_env() -> float:
    try:
        return max(1.0, float(os.environ.get("SLUICE_JOB_TARGET_TIMEOUT", "60")))
    except ValueError:
        return 60.0


class JobManager:
    def __init__(self, target: Target, data_dir: Path | str, cmap: ClusterMapStore | None) -> None:
        self.target = target
        self.cmap = cmap
        self.files = JobFiles(data_dir)
        self.target_timeout = target_timeout_from_env()
        self.parts: dict[str, JobPart] = {}
        self.contexts: dict[str, JobContext] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        key = target.cluster_key
        self.headers = {INTERNAL_HEADER: auth.internal_token(key)} if key else {}

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                trust_env=False,
                verify=tls.client_context(),  # SLUICE_CA (core/tls.py)
                headers=self.headers,
                timeout=httpx.Timeout(60.0, connect=5.0),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            )
        return self._http

    def url(self, part: JobPart, target: str) -> str:
        """Where ``target`` listens now: the cluster map's URL, else the one at start."""
        url = self.cmap.get().urls.get(target) if self.cmap is not None else None
        url = url or part.members.get(target)
        if not url:
            raise JobFailed(f"target {target!r} has no known address")
        return url.rstrip("/")

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        parts = await anyio.to_thread.run_sync(self.files.load_all)
        ended = sorted((p for p in parts if p.state in TERMINAL), key=lambda p: p.ended or 0)
        for old in ended[: max(0, len(ended) - KEEP_ENDED)]:  # the newest KEEP_ENDED stay
            await anyio.to_thread.run_sync(self.files.remove, old.id)
            parts.remove(old)
        for part in parts:
            self.parts[part.id] = part
            if part.state != RUNNING:
                continue
            kind = get_kind_or_none(part.kind)
            part.restarts += 1
            if kind is None or not kind.resumable:
                part.finish(
                    FAILED,
                    f"target {self.target.id!r} restarted while the job ran and a "
                    f"{part.kind!r} job cannot resume",
                )
                await self.persist(part)
                continue
            log.info("resuming job %s (%s) after a restart", part.id, part.kind)
            self._launch(part, resumed=True)
        self._flusher = asyncio.create_task(self._flush_loop())

    async def stop(self) -> None:
        """Stop running jobs without ending them: they resume when the target starts again."""
        for task in list(self.tasks.values()):
            await cancel_and_wait(task)
        await cancel_and_wait(self._flusher)
        await self._flush()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self._flush()
            except (OSError, InsufficientStorage) as e:
                log.warning("saving job state failed: %s", e)

    async def _flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for job_id in dirty:
            if job_id in self.parts:
                await self.persist(self.parts[job_id])

    def mark_dirty(self, job_id: str) -> None:
        self._dirty.add(job_id)

    async def persist(self, part: JobPart) -> None:
        """Save ``part``; a full disk (or spent quota) is the 507 naming target and job."""
        try:
            await anyio.to_thread.run_sync(self.files.save, part)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise InsufficientStorage(
                f"target {self.target.id!r} has no space left to record job {part.id!r} "
                f"({os.strerror(e.errno)}): free space or add capacity, then try again",
                target=self.target.id,
                job=part.id,
            ) from e

    # -- the API the routes call ----------------------------------------------------

    async def create(self, doc: dict[str, Any]) -> JobPart:
        job_id = str(doc["id"])
        if job_id in self.parts:
            return self.parts[job_id]  # the gateway retried its start
        get_kind(str(doc["kind"]))  # 400 for a kind this target does not know
        part = JobPart(
            id=job_id,
            kind=str(doc["kind"]),
            spec=dict(doc.get("spec") or {}),
            members=dict(doc.get("members") or {}),
            target=self.target.id,
        )
        self.parts[job_id] = part
        await self.persist(part)
        self._launch(part, resumed=False)
        return part

    def get(self, job_id: str) -> JobPart:
        part = self.parts.get(job_id)
        if part is None:
            raise JobNotFound(
                f"job {job_id!r} is not known on target {self.target.id!r}",
                job=job_id,
                target=self.target.id,
            )
        return part

    async def end(self, job_id: str, state: str, reason: str) -> JobPart:
        """Abort (or fail) this target's part; a no-op once it has ended."""
        part = self.get(job_id)
        if part.state in TERMINAL:
            return part
        part.finish(state, reason)
        ctx = self.contexts.get(job_id)
        if ctx is not None:
            ctx.aborted.set()
        task = self.tasks.get(job_id)
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)
        await self.persist(part)
        return part

    async def receive(
        self, job_id: str, sender: str, meta: dict[str, Any], body: AsyncIterator[bytes]
    ) -> Any:
        part = self.get(job_id)
        ctx = self.contexts.get(job_id)
        if part.state == RUNNING and ctx is None:  # created, not launched yet: the sender retries
            raise Unavailable(f"job {job_id!r} is starting on target {self.target.id!r}", 1)
        if part.state != RUNNING or ctx is None:
            why = f": {part.reason}" if part.reason else ""  # the cause travels to the sender
            raise Conflict(
                f"job {job_id!r} is {part.state} on target {self.target.id!r}{why}",
                job=job_id,
                target=self.target.id,
            )
        kind = get_kind(part.kind)
        if kind.receive is None:
            raise Conflict(f"jobs of kind {part.kind!r} take no data from other targets")
        return await kind.receive(ctx, sender, meta, body)

    def phase(self, job_id: str, name: str) -> dict[str, Any]:
        part = self.get(job_id)
        return {"reached": name in part.phases, "state": part.state, "reason": part.reason}

    # -- running ----------------------------------------------------------------------

    def _launch(self, part: JobPart, resumed: bool) -> None:
        ctx = JobContext(self, self.target, part, resumed)
        self.contexts[part.id] = ctx
        self.tasks[part.id] = asyncio.create_task(self._run(ctx), name=f"job-{part.id}")

    async def _run(self, ctx: JobContext) -> None:
        part = ctx.part
        kind = get_kind(part.kind)
        try:
            await kind.run(ctx)
            part.finish(FINISHED)
        except JobAborted:
            part.finish(ABORTED, part.reason or "aborted")
        except JobFailed as e:
            part.finish(FAILED, str(e))
        except asyncio.CancelledError:
            if part.state == RUNNING:  # the target stops: resume on restart
                raise
        except SluiceError as e:
            part.finish(FAILED, e.message)
        except Exception as e:  # a bug or an I/O error: the job fails, with the reason
            log.exception("job %s (%s) failed", part.id, part.kind)
            part.finish(FAILED, f"{type(e).__name__}: {e}")
        finally:
            self.tasks.pop(part.id, None)
            if part.state in TERMINAL:
                self.contexts.pop(part.id, None)
                with contextlib.suppress(OSError):
                    await anyio.to_thread.run_sync(
                        lambda: shutil.rmtree(self.files.workdir(part.id), ignore_errors=True)
                    )
                try:
                    await self.persist(part)
                except InsufficientStorage as e:  # the outcome stays in memory, and is served
                    log.warning("%s", e)


def get_kind_or_none(name: str) -> Any:
    try:
        return get_kind(name)
    except SluiceError:
        return None
