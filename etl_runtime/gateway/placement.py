"""Where an object call goes: its HRW owners over the cluster map's members.

Placement is computed over every *member* target, reachable or not, so an
object's owner never changes because a target missed a health probe. What
liveness decides is only how a call is served while an owner is away:

* a read (GET/HEAD) goes to the first reachable owner that is not *suspect*
  (its health probe is late: paused, overloaded), else to the first reachable
  one; with ``copies >= 2`` that is a replica, which holds every acknowledged
  write because writes need all owners; with no reachable owner it is
  ``503`` + ``Retry-After`` naming the target;
* a write (PUT/DELETE) goes to the first owner, which writes through to the
  others before it answers; if any owner is away it is ``503`` +
  ``Retry-After`` naming it — never acknowledged somewhere the owner will not
  see it.

Without a cluster map (Kubernetes mode, for now) the owner is the HRW choice
among the live targets, as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from etl_runtime.cluster.hrw import hrw_owner, object_key
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core import errors as target_errors
from etl_runtime.core.access import object_url
from etl_runtime.core.errors import BucketNotFound, NoTargets
from etl_runtime.gateway.context import Gateway, passthrough

RETRY_AFTER_SECONDS = 2
READS = frozenset({"GET", "HEAD"})


class TargetAway(NoTargets):
    """The target that owns an object is a member but does not answer right now."""


def bucket_not_found(bucket: str) -> BucketNotFound:
    return target_errors.bucket_not_found(bucket)


def _away(target: str, bucket: str, name: str, role: str) -> TargetAway:
    return TargetAway(
        f"target {target!r}, {role} of {bucket}/{name}, is not reachable right now "
        f"(paused, restarting or down); retry in {RETRY_AFTER_SECONDS}s",
        retry_after=RETRY_AFTER_SECONDS,
        target=target,
        bucket=bucket,
        object=name,
    )


def route(gw: Gateway, method: str, bucket: str, name: str) -> TargetInfo:
    """The target an object call is redirected to (raises 404/503 errors)."""
    if gw.cmap is None:
        return hrw_owner(gw.live_targets(), object_key(bucket, name))
    cmap = gw.cmap.get()
    if bucket not in cmap.buckets:
        raise bucket_not_found(bucket)
    if not cmap.members:
        raise NoTargets("the cluster has no member targets; check `GET /v1/cluster`")
    owners = cmap.owners(bucket, name)
    alive = gw.alive_ids()
    if method in READS:
        suspect = gw.suspect_ids()
        reachable = [t for t in owners if t in alive]
        for tid in sorted(reachable, key=lambda t: t in suspect):  # stable: owner order
            info = gw.target_info(tid, cmap)
            if info is not None:
                return info
        raise _away(owners[0], bucket, name, "owner")
    for i, tid in enumerate(owners):
        if tid not in alive or gw.target_info(tid, cmap) is None:
            raise _away(tid, bucket, name, "owner" if i == 0 else f"copy {i + 1}")
    info = gw.target_info(owners[0], cmap)
    assert info is not None
    return info


STREAM_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


async def object_bytes(gw: Gateway, bucket: str, name: str, doing: str) -> AsyncIterator[bytes]:
    """The stored bytes of ``bucket/name``, streamed from a target that holds it (the
    target checks them as it sends them). A target's error answer is passed through; a
    target that does not answer is a 503 ``NoTargets`` saying what was being done."""
    src = route(gw, "GET", bucket, name)
    try:
        async with gw.http.stream(
            "GET",
            object_url(src.url, bucket, name),
            headers=gw.target_headers(),
            timeout=STREAM_TIMEOUT,
            follow_redirects=True,
        ) as got:
            if got.status_code != 200:
                await got.aread()
                raise passthrough(got)
            async for chunk in got.aiter_bytes():
                yield chunk
    except httpx.HTTPError as e:
        raise NoTargets(
            f"{doing}: a target did not answer ({type(e).__name__}); retry",
            bucket=bucket,
            object=name,
        ) from None
