"""Rebalance and repair on one target: move objects to their owners under the map.

Every target runs a ``Rebalancer``. It watches the cluster map, and whenever
``rebalance_id`` changes (members joined or left, a bucket got more copies,
a member came back while a bucket keeps copies) — and once at start — it
walks the objects it holds:

* an object this target no longer owns is copied to each owner that lacks it
  (``if_absent``: an owner's own copy is as new or newer, since every write
  after the change went to it), then removed here if it did not change
  meanwhile;
* an object it owns in a bucket with ``copies > 1`` is copied to the other
  owners that lack it (repair);
* a bucket directory that the map no longer lists (deleted while this target
  was away) is removed;
* a copy is checked against its stored checksum before it is sent: a bad one
  is replaced by a good copy from another owner first, or, without one,
  counted (``corrupted`` in the status) and never sent. A bad copy on another
  owner is that owner's to find (its reads, or the ``scrub`` job).

A pass that moved something or hit an error is followed by another (writes
that were in flight during the change land in the first one's wake); the
rebalance is ``done`` for that id after a clean, empty pass. Bytes moved are
limited to ``SLUICE_REBALANCE_MBPS`` (default 128 MiB/s) so serving goes on.
``status()`` is what ``GET /v1/_rebalance`` answers; the gateway's
``RebalanceMonitor`` ends the rebalance cluster-wide when every target is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Any

import anyio.to_thread

from etl_runtime.cluster.clustermap import ClusterMap, ClusterMapStore
from etl_runtime.core.eventloop import cancel_and_wait
from etl_runtime.storage import integrity
from etl_runtime.storage.peers import PeerError, Peers
from etl_runtime.storage.store import ObjectStore

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
RETRY_SECONDS = 2.0


def rate_from_env() -> float:
    try:
        return max(1.0, float(os.environ.get("SLUICE_REBALANCE_MBPS", "128"))) * (1 << 20)
    except ValueError:
        return 128.0 * (1 << 20)


class Throttle:
    """Keep a long-run byte rate: sleep when ahead of ``rate`` bytes/s."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.sent = 0

    async def spend(self, n: int) -> None:
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            await asyncio.sleep(ahead)


class Rebalancer:
    def __init__(
        self, self_id: str, store: ObjectStore, cmap: ClusterMapStore, peers: Peers
    ) -> None:
        self.self_id = self_id
        self.store = store
        self.cmap = cmap
        self.peers = peers
        self.rate = rate_from_env()
        self._task: asyncio.Task[None] | None = None
        self._done_id: int | None = None
        self._status: dict[str, Any] = {"state": "idle", "rebalance_id": None}
        self._corrupted: set[tuple[str, str]] = set()  # bad copies here, never sent

    def status(self) -> dict[str, Any]:
        return dict(self._status, target=self.self_id)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="sluice-rebalance")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        while True:
            cmap = self.cmap.get()
            if cmap.version > 0 and cmap.members and cmap.rebalance_id != self._done_id:
                try:
                    await self.run(cmap.rebalance_id)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # report, and try again
                    log.exception("rebalance pass failed")
                    self._status.update(state="running", last_error=repr(e))
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
            await asyncio.sleep(POLL_SECONDS)

    async def run(self, rebalance_id: int) -> None:
        """Passes until a clean, empty one, or until the map moves on."""
        self._status = {
            "state": "running",
            "rebalance_id": rebalance_id,
            "started": time.time(),
            "finished": None,
            "passes": 0,
            "objects_scanned": 0,
            "objects_moved": 0,
            "objects_copied": 0,
            "bytes_moved": 0,
            "errors": 0,
            "last_error": None,
        }
        throttle = Throttle(self.rate)
        self._corrupted = set()
        while True:
            cmap = self.cmap.get()
            if cmap.rebalance_id != rebalance_id:
                return  # a newer change: the loop starts over with it
            moved, errors = await self.one_pass(cmap, throttle)
            self._status["passes"] += 1
            if not moved and not errors:
                break
            if errors:
                await asyncio.sleep(RETRY_SECONDS)
        self._status.update(state="done", finished=time.time())
        self._done_id = rebalance_id
        log.info("rebalance %d done on %s: %s", rebalance_id, self.self_id, self._status)

    async def one_pass(self, cmap: ClusterMap, throttle: Throttle) -> tuple[int, int]:
        moved = errors = 0
        for bucket in await anyio.to_thread.run_sync(self.store.bucket_dirs):
            if bucket not in cmap.buckets:
                await anyio.to_thread.run_sync(self._drop_bucket, bucket)
                continue
            names = await anyio.to_thread.run_sync(self._names, bucket)
            for name in names:
                self._status["objects_scanned"] += 1
                try:
                    moved += await self.place(cmap, bucket, name, throttle)
                except (PeerError, OSError) as e:
                    errors += 1
                    self._status["errors"] += 1
                    self._status["last_error"] = f"{bucket}/{name}: {e}"
        return moved, errors

    def _names(self, bucket: str) -> list[str]:
        return list(self.store.iter_names(bucket))

    def _drop_bucket(self, bucket: str) -> None:
        with contextlib.suppress(OSError):
            trash = self.store.tmp_dir / f"deleted-{bucket}-{time.monotonic_ns()}"
            os.rename(self.store.buckets_dir / bucket, trash)
            shutil.rmtree(trash, ignore_errors=True)

    async def _repair(self, cmap: ClusterMap, bucket: str, name: str, owners: list[str]) -> bool:
        """This target's bad copy replaced by a good one from a target that has one."""
        for t in dict.fromkeys([*owners, *cmap.previous_owners(bucket, name)]):
            if t == self.self_id:
                continue
            try:
                found = await self.peers.fetch(t, bucket, name)
                if found is None:
                    continue
                body, meta = found
                await self.store.write_object(bucket, name, body, meta=meta)
            except PeerError as e:
                log.warning("rebalance: repair of %s/%s from %s: %s", bucket, name, t, e)
                continue
            integrity.COUNTS.add("read_repairs", self.self_id)
            return True
        return False

    async def place(self, cmap: ClusterMap, bucket: str, name: str, throttle: Throttle) -> int:
        """Put one object where the map wants it; 1 if anything was sent or removed."""
        owners = cmap.owners(bucket, name)
        mine = self.self_id in owners
        if mine and len(owners) == 1:
            return 0
        path = self.store.local_path(bucket, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return 0  # deleted meanwhile
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        sent = 0
        etag: str | None = None
        for t in owners:
            if t == self.self_id or await self.peers.has(t, bucket, name):
                continue
            await throttle.spend(st.st_size)
            if etag is None:  # checked once, before the first send: bad bytes are never copied
                info, ok = await anyio.to_thread.run_sync(self.store.verify_object, bucket, name)
                if ok is False:
                    if await self._repair(cmap, bucket, name, owners):
                        return 1  # the good bytes are here now: the next pass sends them
                    self._corrupted.add((bucket, name))  # objects, not sightings per pass
                    self._status["corrupted"] = len(self._corrupted)
                    log.error("rebalance: %s/%s here is corrupted, no good copy", bucket, name)
                    return 0
                etag = info.etag
            if await self.peers.send(t, bucket, name, path, etag, if_absent=True):
                sent += 1
                self._status["bytes_moved"] += st.st_size
        if sent:
            self._status["objects_copied"] += sent
        if mine:
            return 1 if sent else 0
        # Every owner has it now: it no longer belongs here.
        removed = await anyio.to_thread.run_sync(
            self.store.remove_if_unchanged, bucket, name, stamp
        )
        if removed:
            self._status["objects_moved"] += 1
        return 1
