"""The cluster map: which targets are members, which buckets exist, and with what props.

Placement must never depend on who answered the last health probe: a target
that is paused, restarting or rescheduled still owns its objects, and sending
its reads or writes elsewhere is how acknowledged writes get hidden. So the
gateway and the targets share one versioned record:

* ``members`` — the target ids objects are placed over with HRW
  (``owners()``), whether each is reachable right now or not;
* ``buckets`` — the bucket metadata (BMD): a bucket exists cluster-wide, with
  its ``BucketProps`` (``copies``), so a target that joins later serves it;
* ``previous`` — the members before the last change, kept while a rebalance
  moves objects to their new owners (targets look there for objects that have
  not moved yet: get-from-neighbor);
* ``urls`` — where each target listens now (addresses change across restarts;
  they are not part of placement and changing them does not start a rebalance).

Every change goes through ``ClusterMapStore.update(fn)``, an atomic
read-modify-write that bumps ``version``. ``FileClusterMap`` keeps the map in
one JSON file shared by the local cluster's gateway and targets;
``etl_runtime.cluster.kube.clustermap.KubeClusterMap`` keeps it in a ConfigMap on
Kubernetes; ``MemoryClusterMap`` serves tests and single-process setups.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from etl_runtime.core.durable import write_atomic
from etl_runtime.core.errors import InvalidRequest, ViewReadOnly
from etl_runtime.core.providers import AIS
from etl_runtime.core.providers import BACKEND_KEYS as BACKEND_KEYS  # every provider's props

MAX_COPIES = 3


_PREFIXES: dict[str, Any] = {}  # target id -> blake2b state after "id/"


def hrw_digest(target_id: str, key: bytes) -> bytes:
    """``blake2b(id + "/" + key)``, 8 bytes: compared as bytes, it orders as the score.

    From the state after ``id/``, kept per target: the gateway and the targets
    place every item of a GetBatch, and this is 2.5x faster than hashing the
    joined string (one f-string, one encode and one int per target and item)."""
    prefix = _PREFIXES.get(target_id)
    if prefix is None:
        prefix = _PREFIXES[target_id] = hashlib.blake2b(f"{target_id}/".encode(), digest_size=8)
    h = prefix.copy()
    h.update(key)
    return h.digest()


def hrw_first(ids: Sequence[str], key: bytes) -> str:
    """``hrw_order(ids, key)[0]``, without the sort or a call per target (the gateway
    places every GetBatch item, and its target checks it: 1.9 against 3.1 µs for 3)."""
    best, top = "", b""
    for t in ids:
        prefix = _PREFIXES.get(t)
        if prefix is None:
            prefix = _PREFIXES[t] = hashlib.blake2b(f"{t}/".encode(), digest_size=8)
        h = prefix.copy()
        h.update(key)
        d = h.digest()
        if d > top or (d == top and t > best):
            best, top = t, d
    return best


def hrw_score(target_id: str, key: str) -> int:
    return int.from_bytes(hrw_digest(target_id, key.encode()), "big")


def hrw_order(ids: Sequence[str], key: str) -> list[str]:
    """Target ids by descending HRW score for ``key`` (the owner first)."""
    k = key.encode()
    return sorted(ids, key=lambda t: (hrw_digest(t, k), t), reverse=True)


_LOCK_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND


@dataclass(frozen=True)
class BucketProps:
    """Per-bucket properties, cluster-wide (part of the map).

    ``provider`` is ``ais`` (stored by Sluice) or a remote provider of
    ``etl_runtime.core.providers`` (a backend bucket, cached on the targets);
    ``backend`` holds a remote bucket's backend props (``BACKEND_KEYS``). ``view``
    makes the bucket an ETL view (``etl_runtime.gateway.views``): ``{"of":
    source bucket, "etl": ETL name, "args": etl_args or absent}``; a view
    holds no objects of its own.
    """

    copies: int = 1
    created: float = 0.0
    provider: str = AIS
    backend: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    view: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def remote(self) -> bool:
        return self.provider != AIS

    @property
    def is_view(self) -> bool:
        return bool(self.view)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"copies": self.copies, "created": self.created}
        if self.remote:
            d.update(provider=self.provider, backend=dict(sorted(self.backend.items())))
        if self.view:
            d["view"] = dict(sorted(self.view.items()))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BucketProps:
        return cls(
            copies=int(d.get("copies", 1)),
            created=float(d.get("created", 0.0)),
            provider=str(d.get("provider") or "ais"),
            backend=dict(d.get("backend") or {}),
            view=dict(d.get("view") or {}),
        )


def refuse_view_jobs(buckets: dict[str, BucketProps], src: str, dst: str, job: str) -> None:
    """A job reads ``src``'s stored objects and writes ``dst``'s: neither may be an ETL view."""
    if (props := buckets.get(src)) is not None and props.view:
        raise InvalidRequest(
            f"{job}: bucket {src!r} is an ETL view and stores nothing; run the job on its "
            f"source {props.view['of']!r} with ETL {props.view['etl']!r} instead",
            bucket=src,
        )
    if (props := buckets.get(dst)) is not None and props.view:
        raise ViewReadOnly(
            f"{job}: bucket {dst!r} is an ETL view, read-only; write the output elsewhere",
            bucket=dst,
        )


@dataclass(frozen=True)
class ClusterMap:
    version: int = 0
    members: tuple[str, ...] = ()
    buckets: dict[str, BucketProps] = field(default_factory=dict)
    previous: tuple[str, ...] | None = None  # members before a change, until rebalanced
    rebalance_id: int = 0  # bumped on every change that moves or copies objects
    urls: dict[str, str] = field(default_factory=dict)
    # access tokens' records, by token id: scope, expiry, revoked (core/tokens.py)
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)

    # -- placement ---------------------------------------------------------------

    def copies(self, bucket: str) -> int:
        props = self.buckets.get(bucket)
        return props.copies if props else 1

    def owners(self, bucket: str, name: str) -> list[str]:
        """The targets that must hold ``bucket/name``: the HRW top ``copies`` members."""
        key = f"{bucket}/{name}"
        if self.copies(bucket) == 1 and self.members:  # the first of hrw_order, no sort
            return [hrw_first(self.members, key.encode())]
        order = hrw_order(self.members, key)
        return order[: max(1, min(self.copies(bucket), len(order)))]

    def previous_owners(self, bucket: str, name: str) -> list[str]:
        if not self.previous:
            return []
        order = hrw_order(self.previous, f"{bucket}/{name}")
        return order[: max(1, min(self.copies(bucket), len(order)))]

    @property
    def rebalancing(self) -> bool:
        return self.previous is not None

    # -- serialisation -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "members": list(self.members),
            "buckets": {b: p.to_dict() for b, p in sorted(self.buckets.items())},
            "previous": list(self.previous) if self.previous is not None else None,
            "rebalance_id": self.rebalance_id,
            "urls": dict(sorted(self.urls.items())),
            "tokens": dict(sorted(self.tokens.items())),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterMap:
        prev = d.get("previous")
        return cls(
            version=int(d.get("version", 0)),
            members=tuple(d.get("members") or ()),
            buckets={b: BucketProps.from_dict(p) for b, p in (d.get("buckets") or {}).items()},
            previous=tuple(prev) if prev is not None else None,
            rebalance_id=int(d.get("rebalance_id", 0)),
            urls=dict(d.get("urls") or {}),
            tokens=dict(d.get("tokens") or {}),
        )

    # -- changes (each returns a new map; the store bumps the version) -----------

    def with_members(self, members: Sequence[str]) -> ClusterMap:
        """New membership; starts a rebalance when the set changes."""
        members = tuple(sorted(set(members)))
        if set(members) == set(self.members):
            return self
        if not self.members:  # a brand-new map: nothing to move
            return replace(self, members=members)
        # A change during a rebalance: objects may still sit at the older owners,
        # so keep looking there (the union) until the new rebalance ends.
        prev = tuple(sorted(set(self.members) | set(self.previous or ())))
        return replace(self, members=members, previous=prev, rebalance_id=self.rebalance_id + 1)

    def with_bucket(self, bucket: str, props: BucketProps) -> ClusterMap:
        buckets = {**self.buckets, bucket: props}
        old = self.buckets.get(bucket)
        more_copies = old is not None and props.copies > old.copies
        return replace(
            self, buckets=buckets, rebalance_id=self.rebalance_id + (1 if more_copies else 0)
        )

    def without_bucket(self, bucket: str) -> ClusterMap:
        return replace(self, buckets={b: p for b, p in self.buckets.items() if b != bucket})

    def rebalanced(self, rebalance_id: int) -> ClusterMap:
        """Mark the rebalance ``rebalance_id`` finished (a newer one stays running)."""
        if self.rebalance_id != rebalance_id or self.previous is None:
            return self
        return replace(self, previous=None)


class ClusterMapStore(Protocol):
    """Shared, versioned storage of the cluster map."""

    def get(self) -> ClusterMap: ...

    def refresh(self) -> ClusterMap:
        """The map as stored now, read past any cache (which it then updates): for a
        reader that must not act on a map older than a change it was told about."""
        ...

    def update(self, change: Callable[[ClusterMap], ClusterMap]) -> ClusterMap:
        """Apply ``change`` atomically; the version goes up when the map changed."""
        ...


def bump_version(old: ClusterMap, new: ClusterMap) -> ClusterMap:
    if new == old:
        return old
    return replace(new, version=old.version + 1)


class MemoryClusterMap:
    """A map held in this process (tests, and a single gateway with its own targets)."""

    def __init__(self, initial: ClusterMap | None = None) -> None:
        self._map = initial or ClusterMap()
        self._lock = threading.Lock()

    def get(self) -> ClusterMap:
        return self._map

    def refresh(self) -> ClusterMap:
        return self._map

    def update(self, change: Callable[[ClusterMap], ClusterMap]) -> ClusterMap:
        with self._lock:
            self._map = bump_version(self._map, change(self._map))
            return self._map


class FileClusterMap:
    """The map as one JSON file: written by the gateway, read by every target.

    Writes take an ``flock`` on ``<file>.lock``, write a temp file, fsync it,
    rename it into place and fsync the directory. Reads are cached and re-read
    when the file's mtime, size or inode changed. Every ``get()`` stats the file
    (a few microseconds): a bucket the gateway just created must be known to a
    target at once, so a time-based cache would make create-then-put fail.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._cached: ClusterMap = ClusterMap()
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    def get(self) -> ClusterMap:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._cached
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            try:
                loaded = ClusterMap.from_dict(json.loads(self.path.read_text()))
            except (OSError, ValueError):
                return self._cached  # mid-replace on an odd filesystem: keep the last good map
            with self._lock:
                if loaded.version >= self._cached.version:
                    self._cached, self._stamp = loaded, stamp
        return self._cached

    def refresh(self) -> ClusterMap:
        return self.get()  # every get() looks at the file already

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a lock anyone may open, anyone may hold (an ETL's code, under sluice up,
        # would stop every map update: tokens' revocation included).
        fd = os.open(self.path.with_name(self.path.name + ".lock"), _LOCK_FLAGS, 0o600)
        with os.fdopen(fd, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def update(self, change: Callable[[ClusterMap], ClusterMap]) -> ClusterMap:
        with self._locked():
            self._stamp = None  # re-read under the lock
            old = self.get()
            new = bump_version(old, change(old))
            if new is not old:
                write_atomic(self.path, json.dumps(new.to_dict(), indent=1).encode())
                with self._lock:
                    self._cached, self._stamp = new, None
            return new
