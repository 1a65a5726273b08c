"""The ``scrub`` job: every target reads every object it holds and checks its bytes.

Spec: ``{"bucket": B}`` (optional: every bucket without it), and
``"mbps"`` (optional, MiB/s read per target; ``SLUICE_SCRUB_MBPS``, default
64), so serving goes on. ``sluice job start scrub [--bucket B]`` starts it.

On every target, for every object file it holds (storage/integrity.py):

* its bytes are read at the bounded rate and compared with the checksum
  stored at write time; a mismatch is ``corrupted``, repaired from a good
  copy where the bucket keeps copies (``Placement.repair``), else listed in
  the job's errors (the object's reads fail loudly until it is rewritten);
* an owner of an object in a bucket with copies asks the other owners for
  theirs; one that lacks it is a ``missing`` copy, sent there (from good
  bytes only);
* a file this target holds but does not own (and no rebalance is moving) is
  an ``orphaned`` copy, reported (a rebalance moves or removes it);
* an object written before checksums were stored gets one if its MD5 is its
  ETag (``checksums_added``), else it is ``corrupted``.

The job's output (summed over targets): ``scanned``, ``bytes``,
``corrupted``, ``repaired``, ``unrepaired``, ``missing_copies``,
``copies_made``, ``orphaned``, ``checksums_added``, and lists ``corrupted_objects`` and
``orphaned_objects`` (the first 100 of each per target). Counted in
``sluice_integrity_scrub_*``.

On Kubernetes (a target started with ``--events kubernetes``, as the chart
does) each finding is also a Warning Event on the target's Pod, naming bucket,
object and target: ``ObjectCorrupted`` (not repaired), ``ObjectRepaired``,
``CopyMissing``, ``CopyOrphaned``; at most ``EVENTS`` per target and job, then
one ``ScrubFinished`` with the counts (Normal when nothing was found).
"""

from __future__ import annotations

import os
from typing import Any

import anyio.to_thread

from etl_runtime.core.errors import BucketNotFound, InvalidRequest, NotFound
from etl_runtime.core.names import validate_bucket
from etl_runtime.jobs.context import JobContext
from etl_runtime.jobs.kinds import register_kind
from etl_runtime.storage.integrity import COUNTS
from etl_runtime.storage.peers import PeerError
from etl_runtime.storage.rebalance import Throttle
from etl_runtime.storage.store import ObjectStore

DEFAULT_MBPS = 64.0
LISTED = 100
EVENTS = 20  # Events per target and job for its findings; the summary says the rest
_FIELDS = ("bucket", "mbps")


def scrub_rate(spec: dict[str, Any]) -> float:
    """Bytes per second read by each target."""
    mbps = spec.get("mbps")
    if mbps is None:
        try:
            mbps = float(os.environ.get("SLUICE_SCRUB_MBPS", DEFAULT_MBPS))
        except ValueError:
            mbps = DEFAULT_MBPS
    return max(1.0, float(mbps)) * (1 << 20)


async def validate_scrub(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(spec) - set(_FIELDS))
    if unknown:
        raise InvalidRequest(
            f"a scrub job takes 'bucket' and 'mbps'; unknown: {', '.join(unknown)}"
        )
    out: dict[str, Any] = {}
    bucket = spec.get("bucket")
    if bucket is not None:
        if not isinstance(bucket, str):
            raise InvalidRequest("scrub: 'bucket' must be a string")
        out["bucket"] = validate_bucket(bucket)
        if gw.cmap is not None and bucket not in gw.cmap.get().buckets:
            raise BucketNotFound(f"bucket {bucket!r} does not exist", bucket=bucket)
    mbps = spec.get("mbps")
    if mbps is not None:
        if type(mbps) not in (int, float) or not 0 < mbps <= 100_000:
            raise InvalidRequest(f"scrub: 'mbps' must be a number of MiB/s > 0, got {mbps!r}")
        out["mbps"] = mbps
    return out


class _Scrub:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.me = ctx.target_id
        self.throttle = Throttle(scrub_rate(ctx.spec))
        self.out: dict[str, Any] = dict.fromkeys(
            (
                "scanned",
                "bytes",
                "corrupted",
                "repaired",
                "unrepaired",
                "missing_copies",
                "copies_made",
                "orphaned",
                "checksums_added",
            ),
            0,
        )
        self.corrupted: list[str] = []
        self.orphaned: list[str] = []
        events = getattr(ctx.target, "events", None)
        self.events = events.budget(EVENTS) if events is not None else None

    async def event(self, reason: str, message: str) -> None:
        if self.events is not None:
            await self.events.record(reason, message)

    async def finished(self) -> None:
        if self.events is None:
            return
        o = self.out
        found = o["corrupted"] + o["missing_copies"] + o["orphaned"]
        more = (
            f"; {self.events.dropped} more finding(s) not shown as events"
            if self.events.dropped
            else ""
        )
        await self.events.events.record(
            "ScrubFinished",
            f"scrub job {self.ctx.id} on target {self.me!r}: {o['scanned']} object(s) read, "
            f"{o['corrupted']} corrupted ({o['repaired']} repaired, {o['unrepaired']} not), "
            f"{o['missing_copies']} missing copies ({o['copies_made']} made), "
            f"{o['orphaned']} orphaned{more}",
            "Warning" if found else "Normal",
        )

    def _count(self, field: str, n: int = 1, metric: str | None = None) -> None:
        self.out[field] += n
        if metric:
            COUNTS.add(metric, self.me, n)

    def _rebalancing(self) -> bool:
        placement = self.ctx.placement
        return bool(placement and placement.cmap and placement.cmap.get().rebalancing)

    async def one(self, bucket: str, name: str) -> None:
        ctx, store, placement = self.ctx, self.ctx.store, self.ctx.placement
        ctx.check()
        try:
            info, ok = await anyio.to_thread.run_sync(store.verify_object, bucket, name)
        except NotFound:
            return  # deleted meanwhile
        await self.throttle.spend(info.size)
        self._count("scanned", metric="scrub_objects")
        self._count("bytes", info.size, "scrub_bytes")
        ctx.progress.add(objects=1, bytes=info.size)
        obj = f"{bucket}/{name}"
        if info.checksum is None and ok:  # written before checksums: it has one now
            self._count("checksums_added")
        if ok is False:
            self._count("corrupted", metric="scrub_corrupted")
            if len(self.corrupted) < LISTED:
                self.corrupted.append(obj)
            outcome: bool | None = False
            if placement is not None and placement.keeps_copies(bucket):
                outcome = await placement.repair(bucket, name)
            if outcome is True:
                self._count("repaired", metric="scrub_repaired")
                ok = True
                await self.event(
                    "ObjectRepaired",
                    f"ais://{obj} on target {self.me!r} did not match its checksum; "
                    "repaired from a good copy",
                )
            else:
                self._count("unrepaired")
                why = (
                    "a copy that may be good is not reachable"
                    if outcome is None
                    else "no good copy to repair it from: rewrite the object"
                )
                what = f"ais://{obj} on target {self.me!r} does not match its checksum; {why}"
                ctx.error(obj, what)
                await self.event("ObjectCorrupted", what)
        owners = ctx.owners(bucket, name)
        if self.me not in owners:
            if not self._rebalancing():
                self._count("orphaned", metric="scrub_orphaned_copies")
                if len(self.orphaned) < LISTED:
                    self.orphaned.append(obj)
                await self.event(
                    "CopyOrphaned",
                    f"target {self.me!r} holds ais://{obj} but does not own it "
                    "(a rebalance moves or removes it)",
                )
            return
        if len(owners) < 2 or placement is None or placement.peers is None:
            return
        peers = placement.peers
        for t in owners:
            if t == self.me:
                continue
            try:
                if await peers.has(t, bucket, name):
                    continue
                self._count("missing_copies", metric="scrub_missing_copies")
                await self.event(
                    "CopyMissing",
                    f"target {t!r} lacks its copy of ais://{obj}"
                    + ("" if ok is False else f"; sending it from target {self.me!r}"),
                )
                if ok is False:
                    continue  # never copy bad bytes
                path = store.local_path(bucket, name)
                etag = info.etag
                await self.throttle.spend(info.size)
                if await peers.send(t, bucket, name, path, etag, if_absent=True):
                    self._count("copies_made")
            except PeerError as e:
                ctx.error(obj, f"copy of ais://{obj} on target {t!r}: {e}")

    def publish(self) -> None:
        self.ctx.set_output(
            **self.out, corrupted_objects=self.corrupted, orphaned_objects=self.orphaned
        )


def _names(store: ObjectStore, bucket: str) -> list[str]:
    return sorted(store.iter_names(bucket))


async def run_scrub(ctx: JobContext) -> None:
    scrub = _Scrub(ctx)
    wanted = ctx.spec.get("bucket")
    store = ctx.store
    buckets = [wanted] if wanted else await anyio.to_thread.run_sync(store.bucket_dirs)
    for bucket in buckets:
        try:
            names = await anyio.to_thread.run_sync(_names, store, bucket)
        except OSError:
            continue  # not on this target
        for name in names:
            await scrub.one(bucket, name)
            if scrub.out["scanned"] % 256 == 0:
                scrub.publish()
    scrub.publish()
    await scrub.finished()


register_kind("scrub", run_scrub, validate=validate_scrub)
