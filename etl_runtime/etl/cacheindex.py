"""The output cache's entries on disk: where they live, their budget and LRU order.

``outcache.py`` is the data path (lookups, the tee of a miss); this module
owns the files under ``DATA/.etlcache/`` and what they add up to:

* ``entry_path``: ``<etl>/<spec hash>/<bucket>/<n[:2]>/<n>/<k>``, ``n`` a hash
  of the object name and ``k`` of its ETag, its size and ``etl_args``;
* ``CacheIndex``: the entries least recently used first, with their bytes per
  ETL; ``add`` (a new entry, or a hit), ``drop`` (an object changed or went),
  eviction down to the budget, and ``load`` (what a previous run left, ordered
  by the files' access and modification times);
* ``budget_from_env``: ``SLUICE_ETL_CACHE_BYTES``;
* ``OutputCacheCollector``: ``sluice_etl_cache_*{target,etl}``.

Every method that changes the index takes ``lock`` and runs in a thread
(publishes and store writes already do), never on the event loop. A hit, on
the loop, only queues a ``touch``; touches are applied under the lock before
the next change (and by the caller once many wait).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

BUDGET_ENV = "SLUICE_ETL_CACHE_BYTES"
DEFAULT_BUDGET = "10%"
CACHE_DIR = ".etlcache"
# What /v1/_etl/{name}/stats adds (and the gateway's ETL details sum).
FIELDS = ("cache_hits", "cache_misses", "cache_bytes", "cache_evictions")
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(?:i?b)?")
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
TOUCH_BATCH = 4096  # hits queued before their caller should have them applied


def budget_from_env(data_dir: Path | str, value: str | None = None) -> int:
    """``$SLUICE_ETL_CACHE_BYTES`` in bytes (0: no cache); ``ValueError`` naming it if bad.

    Bytes with an optional ``K``/``M``/``G``/``T`` suffix (powers of 1024, ``KiB``
    and ``KB`` alike), or ``N%`` of the data dir's filesystem; default ``10%``.
    """
    raw = os.environ.get(BUDGET_ENV, "") if value is None else value
    text = raw.strip().lower() or DEFAULT_BUDGET
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 100:
            raise ValueError(f"{BUDGET_ENV}={raw!r}: a share of the disk is 0% to 100%")
        where = Path(data_dir).absolute()
        while not where.is_dir() and where != where.parent:  # not made yet: its disk
            where = where.parent
        return int(shutil.disk_usage(where).total * share / 100)
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"{BUDGET_ENV}={raw!r}: give bytes (e.g. 10GiB) or a share (10%)")
    return int(m.group(1)) << _SHIFT[m.group(2)]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def object_dir(gen: str, bucket: str, name: str) -> str:
    """Where the entries of ``bucket/name`` under ``gen`` (``etl/spec hash``) live."""
    n = _hash(name)
    return f"{gen}/{bucket}/{n[:2]}/{n}"


def entry_path(gen: str, bucket: str, name: str, etag: str, size: int, args: str | None) -> str:
    """The entry of ``bucket/name`` (ETag, size) with ``args`` (None and "" apart)."""
    k = _hash(f"{etag}\0{size}\0" + ("-" if args is None else f"={args}"))
    return f"{object_dir(gen, bucket, name)}/{k}"


@dataclass
class EtlCacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0  # what the entries of this ETL hold now


class CacheIndex:
    """The entries under ``root`` (``rel`` -> ETL, size), least recently used first."""

    def __init__(self, target_id: str, root: Path, budget: int) -> None:
        self.target_id = target_id
        self.root = root
        self.budget = budget
        self.counters: dict[str, EtlCacheCounters] = collections.defaultdict(EtlCacheCounters)
        self.lock = threading.Lock()
        self.total = 0
        self._lru: collections.OrderedDict[str, tuple[str, int]] = collections.OrderedDict()
        self._touched: collections.deque[tuple[str, str, int]] = collections.deque()
        root.mkdir(exist_ok=True)
        self.gens = {  # the "etl/spec hash" directories: where drop() looks
            f"{etl.name}/{gen.name}"
            for etl in root.iterdir()
            if etl.is_dir()
            for gen in etl.iterdir()
            if gen.is_dir()
        }

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self, etl: str) -> dict[str, int]:
        c = self.counters.get(etl) or EtlCacheCounters()
        return dict(zip(FIELDS, (c.hits, c.misses, c.bytes, c.evictions), strict=True))

    def touch(self, rel: str, etl: str, size: int) -> bool:
        """A hit on ``rel`` (any thread, no lock); True once ``apply_touches`` is due."""
        self._touched.append((rel, etl, size))
        return len(self._touched) > TOUCH_BATCH

    # -- under self.lock -------------------------------------------------------

    def apply_touches(self) -> None:
        """The hits queued so far, in order: each entry hit is the last to go."""
        while self._touched:
            rel, etl, size = self._touched.popleft()
            if rel in self._lru:
                self._lru.move_to_end(rel)
            elif (self.root / rel).is_file():  # not indexed yet (start), not gone meanwhile
                self.add(rel, etl, size)

    def add(self, rel: str, etl: str, size: int) -> None:
        """``rel`` (``size`` bytes) was just used or written: the last to go."""
        self._forget(rel)
        self._lru[rel] = (etl, size)
        self._account(etl, size)

    def evict(self) -> None:
        """Least recently used entries go until the rest fits the budget."""
        self.apply_touches()
        while self.total > self.budget and self._lru:
            rel, (etl, size) = self._lru.popitem(last=False)
            self._account(etl, -size)
            self.counters[etl].evictions += 1
            self._remove(self.root / rel)

    def _account(self, etl: str, size: int) -> None:
        self.total += size
        self.counters[etl].bytes += size

    def _forget(self, rel: str) -> None:
        old = self._lru.pop(rel, None)
        if old is not None:
            self._account(old[0], -old[1])

    @staticmethod
    def _remove(path: Path) -> None:
        """Unlink an entry, and its object's directory once empty."""
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    # -- taking the lock itself ------------------------------------------------

    def drop(self, bucket: str, name: str | None) -> None:
        """``bucket/name`` changed or went (``name`` None: the whole bucket): its entries go.

        ``ObjectStore.on_change``: one ``listdir`` per spec generation present, which
        fails at once for the usual object, which has no entries.
        """
        for gen in list(self.gens):
            if name is None:
                prefix = f"{gen}/{bucket}/"
                with self.lock:
                    self.apply_touches()
                    for rel in [r for r in self._lru if r.startswith(prefix)]:
                        self._forget(rel)
                    shutil.rmtree(self.root / prefix, ignore_errors=True)
                continue
            here = object_dir(gen, bucket, name)
            try:
                entries = os.listdir(self.root / here)
            except OSError:
                continue
            with self.lock:
                self.apply_touches()
                for entry in entries:
                    self._forget(f"{here}/{entry}")
                    self._remove(self.root / here / entry)

    def load(self) -> None:
        """Index the entries a previous run left, oldest use first, then trim to the budget.

        Runs in the background at start: entries used meanwhile stay the most recent.
        """
        found: list[tuple[float, str, str, int]] = []
        for rel, st in _walk(self.root):
            parts = rel.split("/")
            if len(parts) == 6:
                found.append((max(st.st_atime, st.st_mtime), rel, parts[0], st.st_size))
        found.sort()
        with self.lock:
            self.apply_touches()
            newer, self._lru, self.total = self._lru, collections.OrderedDict(), 0
            for counters in list(self.counters.values()):  # the loop may add one
                counters.bytes = 0
            for _time, rel, etl, size in found:
                if rel not in newer:
                    self.add(rel, etl, size)
            for rel, (etl, size) in newer.items():
                self.add(rel, etl, size)
            self.evict()
            entries, total = len(self._lru), self.total
        log.info(
            "ETL output cache of target %r: %d entries, %d bytes (budget %d bytes)",
            self.target_id,
            entries,
            total,
            self.budget,
        )


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every regular file under ``root``: its path relative to it, and its stat."""
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(root / rel if rel else root))
        except OSError:
            continue
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(sub)
                elif entry.is_file(follow_symlinks=False):
                    yield sub, entry.stat(follow_symlinks=False)
            except OSError:
                continue


class OutputCacheCollector:
    """``sluice_etl_cache_{hits,misses,evictions}_total{target,etl}``,
    ``sluice_etl_cache_bytes{target,etl}`` and ``sluice_etl_cache_budget_bytes{target}``."""

    def __init__(self, index: CacheIndex) -> None:
        self.index = index

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        target, labels = self.index.target_id, ["target", "etl"]
        counters = sorted(self.index.counters.items())
        for attr, doc in (
            ("hits", "ETL GETs answered from the output cache."),
            ("misses", "ETL GETs of cached ETLs that ran the transform."),
            ("evictions", "Output cache entries evicted to stay within the budget."),
        ):
            c = CounterMetricFamily(f"sluice_etl_cache_{attr}", doc, labels=labels)
            for etl, n in counters:
                c.add_metric([target, etl], getattr(n, attr))
            yield c
        g = GaugeMetricFamily(
            "sluice_etl_cache_bytes", "Bytes the output cache holds, per ETL.", labels=labels
        )
        for etl, n in counters:
            g.add_metric([target, etl], n.bytes)
        yield g
        budget = GaugeMetricFamily(
            "sluice_etl_cache_budget_bytes",
            "The output cache's budget on this target (SLUICE_ETL_CACHE_BYTES).",
            labels=["target"],
        )
        budget.add_metric([target], self.index.budget)
        yield budget
