"""What a target does for placement on the data path: ownership, copies, neighbors.

With a cluster map (``etl_runtime.cluster.clustermap``) a target knows the owners of
every object (the HRW top ``copies`` members):

* a write must land on an owner; a target that is not one (the map changed
  while the call was on its way) answers 503 ``Misdirected``, and the client
  retries through the gateway, which uses the new map;
* a write to a bucket with ``copies > 1`` is written through to the other
  owners before it is published here and acknowledged; if one of them does
  not take it, the write fails (503 naming it; 507 ``InsufficientStorage`` if
  its disk is full, since trying again cannot help) and nothing is published
  here;
* a delete is applied at the other owners, and while a rebalance runs also at
  the previous owners (else the rebalance would bring the object back);
* a read of an object this target does not own (a client that placed it by
  itself: the aistore SDK's direct reads) is a 307 to its first owner
  (``read_owner``), once;
* a read that misses here while a rebalance runs, or in a bucket with copies,
  looks for the object at the previous owners and the other owners, stores it
  here (it belongs here) and serves it: get-from-neighbor.

Without a cluster map (a target run on its own, most unit tests) none of this
applies: the target serves what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.core.errors import InsufficientStorage, ObjectNotFound, Unavailable, ViewReadOnly
from etl_runtime.storage import integrity
from etl_runtime.storage.peers import PeerError, Peers
from etl_runtime.storage.store import BeforePublish, ObjectStore

log = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = 2
LEARN_TIMEOUT = 10.0  # how long a create-bck waits for this target's map to show the bucket


class Misdirected(Unavailable):
    """This target does not own the object under the current cluster map."""


class CopyFailed(Unavailable):
    """Another owner of the object did not take its copy."""


class Placement:
    def __init__(
        self, self_id: str, store: ObjectStore, cmap: ClusterMapStore | None, peers: Peers | None
    ) -> None:
        self.self_id = self_id
        self.store = store
        self.cmap = cmap
        self.peers = peers
        self._repairs: dict[tuple[str, str], asyncio.Future[bool | None]] = {}

    def bucket_known(self, bucket: str) -> bool | None:
        if self.cmap is None:
            return None
        cmap = self.cmap.get()
        if cmap.version == 0:
            return None  # no map written yet: the directories are the truth
        return bucket in cmap.buckets

    def learn_bucket(self, bucket: str, timeout: float = LEARN_TIMEOUT) -> bool:
        """After the gateway said ``bucket`` was created (it writes the map first), make
        sure this target's map shows it, reading the map past its cache until it does
        (``timeout`` seconds at most). Without this, a ConfigMap watch lagging under
        load made the first PUT after an acknowledged create a 404 "bucket does not
        exist". Blocking: call from a thread."""
        deadline = time.monotonic() + timeout
        while self.bucket_known(bucket) is False:
            assert self.cmap is not None
            if bucket in self.cmap.refresh().buckets or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return self.bucket_known(bucket) is not False

    def check_owner(self, bucket: str, name: str) -> list[str]:
        """The other owners of ``bucket/name``; 503 if this target is not an owner."""
        if self.cmap is None:
            return []
        cmap = self.cmap.get()
        if (props := cmap.buckets.get(bucket)) is not None and props.view:
            raise ViewReadOnly(
                f"{bucket}/{name}: bucket {bucket!r} is an ETL view, read-only; "
                f"write to its source {props.view.get('of')!r}",
                headers={"Allow": "GET, HEAD"},
                bucket=bucket,
                object=name,
            )
        if cmap.version == 0 or not cmap.members:
            return []
        owners = cmap.owners(bucket, name)
        if self.self_id not in owners:
            raise self._misdirected(bucket, name, cmap.version, owners[0])
        return [t for t in owners if t != self.self_id]

    def _misdirected(self, bucket: str, name: str, version: int, owner: str) -> Misdirected:
        return Misdirected(
            f"target {self.self_id!r} does not own {bucket}/{name} under cluster map "
            f"v{version} (owner: {owner!r}); send it through the gateway",
            retry_after=1,
            bucket=bucket,
            object=name,
            target=self.self_id,
        )

    def read_owner(self, bucket: str, name: str, redirected: bool) -> str | None:
        """Where a read of ``bucket/name`` belongs if this target is not one of its owners.

        None: serve it here (an owner, or no map yet). Else the URL of the first
        owner: a client that placed the object itself (the aistore SDK's direct
        reads use AIStore's HRW, not Sluice's) gets a 307 there. A call that a
        target already redirected (``redirected``) and that still lands on a
        non-owner means the maps disagree for a moment: 503 ``Misdirected``
        (the client retries), never a second hop.
        """
        if self.cmap is None:
            return None
        cmap = self.cmap.get()
        if cmap.version == 0 or not cmap.members or bucket not in cmap.buckets:
            return None
        owners = cmap.owners(bucket, name)
        if self.self_id in owners:
            return None
        url = cmap.urls.get(owners[0])
        if redirected or not url:
            raise self._misdirected(bucket, name, cmap.version, owners[0])
        return url

    def write_through(self, bucket: str, name: str, others: list[str]) -> BeforePublish | None:
        if not others or self.peers is None:
            return None
        peers = self.peers

        async def send_copies(tmp: Path, etag: str, size: int) -> None:
            results = await asyncio.gather(
                *(peers.send(t, bucket, name, tmp, etag, if_absent=False) for t in others),
                return_exceptions=True,
            )
            for t, res in zip(others, results, strict=True):
                if isinstance(res, PeerError) and res.status == InsufficientStorage.status:
                    raise InsufficientStorage(
                        f"target {t!r} has no space left for the copy of ais://{bucket}/{name}; "
                        "the write was not applied: free space or add capacity, then try again",
                        bucket=bucket,
                        object=name,
                        target=t,
                    )
                if isinstance(res, BaseException):
                    raise CopyFailed(
                        f"copy of {bucket}/{name} on target {t!r} failed ({res}); "
                        f"the write was not applied; retry in {RETRY_AFTER_SECONDS}s",
                        retry_after=RETRY_AFTER_SECONDS,
                        bucket=bucket,
                        object=name,
                        target=t,
                    )

        return send_copies

    def _elsewhere(self, bucket: str, name: str) -> list[str]:
        """Other targets that may hold ``bucket/name``: owners, then previous owners."""
        if self.cmap is None:
            return []
        cmap = self.cmap.get()
        if cmap.version == 0:
            return []
        found = [*cmap.owners(bucket, name), *cmap.previous_owners(bucket, name)]
        return [t for t in dict.fromkeys(found) if t != self.self_id]

    def may_be_elsewhere(self, bucket: str) -> bool:
        if self.cmap is None or self.peers is None:
            return False
        cmap = self.cmap.get()
        return cmap.rebalancing or cmap.copies(bucket) > 1

    async def delete_elsewhere(self, bucket: str, name: str, others: list[str]) -> bool:
        """Delete at the other owners (and previous owners while rebalancing)."""
        if self.peers is None:
            return False
        targets = list(dict.fromkeys([*others, *self._elsewhere(bucket, name)]))
        deleted = False
        for t in targets:
            try:
                deleted = await self.peers.delete(t, bucket, name) or deleted
            except PeerError as e:
                if t in others:  # an owner must see the delete
                    raise CopyFailed(
                        f"delete of {bucket}/{name} on target {t!r} failed ({e}); retry in "
                        f"{RETRY_AFTER_SECONDS}s",
                        retry_after=RETRY_AFTER_SECONDS,
                        bucket=bucket,
                        object=name,
                        target=t,
                    ) from None
                log.warning("delete of %s/%s at previous owner %s failed: %s", bucket, name, t, e)
        return deleted

    async def pull(self, bucket: str, name: str) -> bool:
        """Get-from-neighbor: copy the object here from a target that has it."""
        if not self.may_be_elsewhere(bucket):
            return False
        assert self.peers is not None
        unreachable: list[str] = []
        for t in self._elsewhere(bucket, name):
            try:
                found = await self.peers.fetch(t, bucket, name)
            except PeerError as e:
                log.warning("get-from-neighbor %s/%s: %s", bucket, name, e)
                unreachable.append(t)
                continue
            if found is None:
                continue
            body, meta = found
            try:
                await self.store.write_object(bucket, name, body, if_absent=True, meta=meta)
            except PeerError as e:
                log.warning("get-from-neighbor %s/%s: %s", bucket, name, e)
                unreachable.append(t)
                continue
            return True
        if unreachable:  # it may be there: a 404 could be a lie
            raise CopyFailed(
                f"{bucket}/{name} is not here yet and target(s) {', '.join(unreachable)} "
                f"that may hold it are not reachable; retry in {RETRY_AFTER_SECONDS}s",
                retry_after=RETRY_AFTER_SECONDS,
                bucket=bucket,
                object=name,
                target=unreachable[0],
            )
        return False

    def keeps_copies(self, bucket: str) -> bool:
        if self.cmap is None or self.peers is None:
            return False
        return self.cmap.get().copies(bucket) > 1

    async def repair(self, bucket: str, name: str) -> bool | None:
        """Read-repair: replace this target's bad copy of ``bucket/name`` with a good one
        from another target (checked against its checksum before it is published).
        True: repaired; False: no other target has a good copy; None: one that may
        have it was not reachable. Concurrent calls for one object share one repair."""
        key = (bucket, name)
        running = self._repairs.get(key)
        if running is None:
            running = self._repairs[key] = asyncio.ensure_future(self._repair(bucket, name))
            running.add_done_callback(lambda _t: self._repairs.pop(key, None))
        return await asyncio.shield(running)

    async def _repair(self, bucket: str, name: str) -> bool | None:
        if self.peers is None:
            return False
        unreachable = False
        for t in self._elsewhere(bucket, name):
            try:
                found = await self.peers.fetch(t, bucket, name)
            except PeerError as e:
                log.warning("repair of %s/%s: %s", bucket, name, e)
                unreachable = unreachable or e.status is None
                continue
            if found is None:
                continue
            body, meta = found
            try:
                await self.store.write_object(bucket, name, body, meta=meta)
            except PeerError as e:  # its copy is bad too, or the stream broke off
                log.warning("repair of %s/%s from %s: %s", bucket, name, t, e)
                continue
            integrity.COUNTS.add("read_repairs", self.self_id)
            log.warning("repaired %s/%s on %s with the copy of %s", bucket, name, self.self_id, t)
            return True
        return None if unreachable else False

    async def ensure_local(self, bucket: str, name: str) -> None:
        """Pull ``bucket/name`` here if it is missing and may be on a neighbor."""
        if not self.may_be_elsewhere(bucket):
            return
        self.store.bucket_dir(bucket)  # BucketNotFound before looking anywhere
        if self.store.local_path(bucket, name).is_file():
            return
        if not await self.pull(bucket, name):
            # A rebalance may have handed it here meanwhile (and deleted it at the previous
            # owner, or ended, so pull found nothing to look at): look here once more.
            if self.store.local_path(bucket, name).is_file():
                return
            raise ObjectNotFound(
                f"object {name!r} not found in bucket {bucket!r}", bucket=bucket, object=name
            )
