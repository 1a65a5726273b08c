"""Membership changes seen from the gateway: join, rebalance, repair, ``/v1/cluster``.

* ``join`` (at start): writes the configured members and the targets'
  current addresses into the cluster map (on Kubernetes a ``MembershipSource``
  computes both from the target StatefulSet, and keeps them current after).
  A new member set starts a rebalance (the map keeps the previous members
  until it ends). A brand-new map adopts the buckets the targets already
  hold, so a data dir from before the map existed keeps its buckets.
* ``RebalanceMonitor`` (background, once a second): asks every reachable
  target for its rebalance progress (``GET /v1/_rebalance``) and marks the
  rebalance finished in the map once every member and every leaving target
  has moved what it holds for the current ``rebalance_id``. When a member
  comes back after being away and a bucket keeps more than one copy, it bumps
  ``rebalance_id`` so that the targets repair missing copies.
* ``cluster_view``: the body of ``GET /v1/cluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any, Protocol

import httpx

from etl_runtime.cluster.clustermap import BucketProps, ClusterMap, ClusterMapStore
from etl_runtime.core.eventloop import cancel_and_wait
from etl_runtime.gateway.context import Gateway

log = logging.getLogger(__name__)
MONITOR_INTERVAL = 1.0


class MembershipSource(Protocol):
    """Where members come from when the platform decides them (Kubernetes: the
    target StatefulSet, ``kube.membership.StatefulSetMembership``). ``join``
    applies ``desired``; after it, ``start`` keeps the map in step."""

    def desired(self, m: ClusterMap) -> ClusterMap: ...

    async def start(self, cmap: ClusterMapStore) -> None: ...

    async def stop(self) -> None: ...


async def join(gw: Gateway) -> None:
    if gw.cmap is None:
        return
    known = gw.known_targets()
    members = gw.members or [t.id for t in known]
    urls = {t.id: t.url for t in known}
    seeded: set[str] = set()
    if gw.cmap.get().version == 0:
        for _t, r in await gw.fanout("GET", "/v1/buckets"):
            if isinstance(r, httpx.Response) and r.status_code == 200:
                seeded.update(r.json().get("buckets", []))

    def change(m: ClusterMap) -> ClusterMap:
        if m.version == 0 and seeded:
            m = replace(m, buckets={b: BucketProps(copies=1) for b in sorted(seeded)})
        if gw.membership is not None:  # Kubernetes: the StatefulSet says who is a member
            return gw.membership.desired(m)
        return replace(m.with_members(members), urls={**m.urls, **urls})

    cmap = gw.cmap.update(change)
    if cmap.rebalancing:
        log.warning(
            "membership changed to %s (was %s): rebalance %d started",
            ",".join(cmap.members),
            ",".join(cmap.previous or ()),
            cmap.rebalance_id,
        )


async def target_progress(gw: Gateway) -> dict[str, dict[str, Any] | None]:
    """Each reachable target's ``/v1/_rebalance`` answer (None when it did not answer)."""
    out: dict[str, dict[str, Any] | None] = {}
    with contextlib.suppress(Exception):
        for t, r in await gw.fanout("GET", "/v1/_rebalance", timeout=2.0):
            ok = isinstance(r, httpx.Response) and r.status_code == 200
            out[t.id] = r.json() if ok and isinstance(r, httpx.Response) else None
    return out


class RebalanceMonitor:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._task: asyncio.Task[None] | None = None
        self._alive: set[str] | None = None
        self.done: dict[str, int] = {}  # target -> the last rebalance_id it reported done
        self.waiting_for: list[str] = []  # holders away before handing their objects over
        gw.rebalance_monitor = self

    async def start(self) -> None:
        if self.gw.cmap is not None and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="sluice-rebalance-monitor")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(MONITOR_INTERVAL)
            try:
                await self.check()
            except Exception:  # keep monitoring whatever one round hit
                log.exception("rebalance monitor round failed")

    async def check(self) -> None:
        gw = self.gw
        assert gw.cmap is not None
        cmap = gw.cmap.get()
        alive = gw.alive_ids()
        back = (alive - self._alive) & set(cmap.members) if self._alive is not None else set()
        self._alive = alive
        if back and any(p.copies > 1 for p in cmap.buckets.values()):
            log.warning("target(s) %s back: repairing copies", ",".join(sorted(back)))
            seen = cmap.rebalance_id  # two gateways that saw the same return bump once
            gw.cmap.update(
                lambda m: (
                    replace(m, rebalance_id=m.rebalance_id + 1) if m.rebalance_id == seen else m
                )
            )
            return
        if not cmap.rebalancing:
            return
        holders = set(cmap.members) | set(cmap.previous or ())
        progress = await target_progress(gw)
        for tid, p in progress.items():
            if p and p.get("state") == "done" and p.get("rebalance_id") is not None:
                self.done[tid] = int(p["rebalance_id"])
        # A holder that is gone (a pod deleted on scale-down, a lost node) counts
        # only if it was seen done with this rebalance; else its objects have
        # not moved, and that is reported (waiting_for), never finished silently.
        waiting = sorted(
            t for t in holders if t not in alive and self.done.get(t) != cmap.rebalance_id
        )
        self.waiting_for = waiting
        if waiting:
            return
        for tid in holders & alive:
            if self.done.get(tid) != cmap.rebalance_id:
                return
        gw.cmap.update(lambda m: m.rebalanced(cmap.rebalance_id))
        log.warning("rebalance %d finished", cmap.rebalance_id)


async def cluster_view(gw: Gateway) -> dict[str, Any]:
    live = gw.alive_ids()
    down = {t: why for t, why in gw.down_reasons().items() if t not in live}
    everyone = gw.known_targets()
    if gw.cmap is None:
        return {
            "targets": [
                {"id": t.id, "url": t.url, "node": t.node, "alive": t.id in live}
                | ({"down": down[t.id]} if t.id in down else {})
                for t in everyone
            ]
        }
    cmap = gw.cmap.get()
    progress = await target_progress(gw)
    ids = list(dict.fromkeys([*cmap.members, *(t.id for t in everyone)]))
    targets = []
    for tid in ids:
        info = gw.target_info(tid, cmap)
        targets.append(
            {
                "id": tid,
                "url": info.url if info else None,
                "node": info.node if info else None,
                "alive": tid in live,
                "member": tid in cmap.members,
                "rebalance": progress.get(tid),
            }
            | ({"down": down[tid]} if tid in down else {})
        )
    totals = {"objects_moved": 0, "bytes_moved": 0, "objects_scanned": 0, "errors": 0}
    for p in progress.values():
        for k in totals:
            totals[k] += int((p or {}).get(k, 0))
    away = [t for t in cmap.members if t not in live]
    return {
        "version": cmap.version,
        "members": list(cmap.members),
        "away": away,
        "buckets": {b: p.to_dict() for b, p in sorted(cmap.buckets.items())},
        "rebalance": {
            "id": cmap.rebalance_id,
            "state": "running" if cmap.rebalancing else "idle",
            "waiting_for": list(getattr(gw.rebalance_monitor, "waiting_for", []))
            if cmap.rebalancing
            else [],
            "previous_members": list(cmap.previous) if cmap.previous is not None else None,
            **totals,
        },
        "targets": targets,
    }
