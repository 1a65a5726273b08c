"""Prometheus metrics of Sluice's servers: ``install_metrics(app, role, *collectors)``.

Every server (gateway, target, transformer) calls ``install_metrics`` once in
its app factory. That gives the app its own ``CollectorRegistry`` (several
apps share one process in the tests, and the global registry would mix them
and refuse the second registration), a ``GET /metrics`` route, and
``MetricsMiddleware``, which counts every request:

* ``sluice_http_requests_total{role,route,op,status}``
* ``sluice_http_received_bytes_total`` / ``sluice_http_sent_bytes_total{role,route,op}``
* ``sluice_http_request_duration_seconds{role,route,op}`` (histogram)

``route`` is the route's template (``/v1/objects/{bucket}/{name:path}``), never
the raw path, so the number of series stays bounded whatever clients send;
requests that match no route share ``route="<unmatched>"``. ``op`` is the
HTTP method in lower case, or ``etl_get`` for a GET with ``etl_name``.

The middleware is plain ASGI rather than Starlette's ``BaseHTTPMiddleware``,
which relays a streamed response through a memory stream and a task group;
here the byte counts come straight from the ``receive``/``send`` messages and
the cost is two ``perf_counter`` calls and a cached-series lookup per request.

Role-specific collectors read their figures when Prometheus scrapes:
``StorageCollector`` (a target's disk and what it stores) and
``EtlStatsCollector`` (a transformer's per-ETL counters, kept in its server
process, which receives every result frame from its workers) and
``TargetStateCollector`` (the gateway's view of each target: up, away or down).

Every server also reports ``sluice_fast_path_enabled{path}`` (1 on, 0 off) for
each fast path built on uvicorn's internals (``wire/http/hooks.py`` sets
``FAST_PATHS`` as the server starts): a new uvicorn that lacks a hook turns its
path off, and this gauge and one start-up line say so. Collectors of what a
process runs beside its app (the Kubernetes watch caches' relists,
``cluster/kube/watch.py``) add themselves to ``PROCESS_COLLECTORS``; every
app's ``/metrics`` serves them.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "<unmatched>"
# Latency buckets: sub-millisecond redirects up to multi-minute shard transforms.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
_OPS = {m: m.lower() for m in ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS")}
STORAGE_RECOUNT_SECONDS = 60.0


class HttpMetrics:
    """The request metrics of one server; ``observe`` records one finished request."""

    def __init__(self, registry: CollectorRegistry, role: str) -> None:
        self.role = role
        labels = ["role", "route", "op"]
        self.requests = Counter(
            "sluice_http_requests",
            "HTTP requests answered, by route template, operation and status.",
            [*labels, "status"],
            registry=registry,
        )
        self.received = Counter(
            "sluice_http_received_bytes",
            "Request body bytes received.",
            labels,
            registry=registry,
        )
        self.sent = Counter(
            "sluice_http_sent_bytes",
            "Response body bytes sent.",
            labels,
            registry=registry,
        )
        self.duration = Histogram(
            "sluice_http_request_duration_seconds",
            "Time from a request's arrival to the last byte of its answer.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # (route, op, status) -> the children to update: ``labels()`` is a lock
        # and a tuple build per call, a dict lookup is cheaper.
        self._series: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}

    def observe(self, scope: Scope, status: int, received: int, sent: int, seconds: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or UNMATCHED
        op = _OPS.get(scope["method"], "other")
        if op == "get" and _has_etl_name(scope.get("query_string", b"")):
            op = "etl_get"
        key = (template, op, status)
        series = self._series.get(key)
        if series is None:
            labels = (self.role, template, op)
            series = self._series[key] = (
                self.requests.labels(*labels, str(status)),
                self.received.labels(*labels),
                self.sent.labels(*labels),
                self.duration.labels(*labels),
            )
        requests, rx, tx, duration = series
        requests.inc()
        if received:
            rx.inc(received)
        if sent:
            tx.inc(sent)
        duration.observe(seconds)


def _has_etl_name(query: bytes) -> bool:
    return query.startswith(b"etl_name=") or b"&etl_name=" in query


class MetricsMiddleware:
    """Pure ASGI middleware: count, time and measure every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        received = sent = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            body = message.get("body")
            if body:
                received += len(body)
            return message

        async def counting_send(message: Message) -> None:
            nonlocal status, sent
            kind = message["type"]
            if kind == "http.response.body":
                body = message.get("body")
                if body:
                    sent += len(body)
            elif kind == "http.response.start":
                status = message["status"]
            elif kind == "http.response.zerocopysend":  # etl_runtime.wire.http.zerocopy
                sent += message.get("count") or 0
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            # An exception before the answer started becomes Starlette's 500.
            self.metrics.observe(
                scope, status or 500, received, sent, time.perf_counter() - started
            )


# path -> on, for this process: set by wire/http/hooks.py as a server starts
FAST_PATHS: dict[str, bool] = {}


# Added to by modules of the process at import; read at every scrape, so also
# after install_metrics ran.
PROCESS_COLLECTORS: list[Collector] = []


class _ProcessCollectors:
    def collect(self) -> Iterator[Metric]:
        for collector in list(PROCESS_COLLECTORS):
            yield from collector.collect()


class FastPathCollector:
    """``sluice_fast_path_enabled{path}``: 1 when the fast path is on in this process."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "sluice_fast_path_enabled",
            "1 when a fast path on uvicorn's internals is on, 0 when it turned itself off",
            labels=["path"],
        )
        for path, on in sorted(FAST_PATHS.items()):
            gauge.add_metric([path], 1.0 if on else 0.0)
        yield gauge


def install_metrics(app: FastAPI, role: str, *collectors: Collector) -> CollectorRegistry:
    """Count ``app``'s requests and serve ``GET /metrics``; returns its registry.

    ``role`` (``gateway``, ``target``, ``transformer``) labels the request
    metrics; ``collectors`` add the role's own figures, read at scrape time.
    """
    disable_created_metrics()  # no ``*_created`` series: half the output, unused by Sluice
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(FastPathCollector())
    registry.register(_ProcessCollectors())
    for collector in collectors:
        registry.register(collector)
    app.state.http_metrics = HttpMetrics(registry, role)  # also for answers outside ASGI
    app.add_middleware(MetricsMiddleware, metrics=app.state.http_metrics)
    app.state.metrics_registry = registry

    async def metrics() -> Response:
        # In a thread: a collector may touch the disk (StorageCollector).
        body = await anyio.to_thread.run_sync(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    return registry


class StorageCollector:
    """A target's disk (``shutil.disk_usage`` of its data dir) and what it stores.

    Disk figures are read at every scrape; the stored objects and bytes come
    from a walk of ``buckets/`` redone at most every ``recount_seconds``.
    """

    def __init__(
        self,
        target_id: str,
        data_dir: Path | str,
        recount_seconds: float = STORAGE_RECOUNT_SECONDS,
    ) -> None:
        self.target_id = target_id
        self.data_dir = Path(data_dir)
        self.recount_seconds = recount_seconds
        self._lock = threading.Lock()
        self._counted_at = -float("inf")
        self._objects = 0
        self._bytes = 0

    def describe(self) -> Iterable[Metric]:
        return []  # collected only at scrape time: never during registration

    def collect(self) -> Iterator[Metric]:
        labels = [self.target_id]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["target"])
            g.add_metric(labels, value)
            return g

        try:
            usage = shutil.disk_usage(self.data_dir)
        except OSError:
            pass  # the data dir is not there (yet): no disk figures this time
        else:
            yield gauge(
                "sluice_target_disk_total_bytes", "Size of the data dir's filesystem.", usage.total
            )
            yield gauge(
                "sluice_target_disk_used_bytes", "Used bytes of that filesystem.", usage.used
            )
            yield gauge(
                "sluice_target_disk_free_bytes", "Free bytes of that filesystem.", usage.free
            )
        objects, size = self._stored()
        yield gauge(
            "sluice_target_stored_bytes",
            f"Bytes of the objects stored here (recounted every {self.recount_seconds:g} s).",
            size,
        )
        yield gauge(
            "sluice_target_objects",
            f"Objects this target stores (recounted every {self.recount_seconds:g} s).",
            objects,
        )

    def _stored(self) -> tuple[int, int]:
        with self._lock:
            if time.monotonic() - self._counted_at >= self.recount_seconds:
                self._objects, self._bytes = _walk(self.data_dir / "buckets")
                self._counted_at = time.monotonic()
            return self._objects, self._bytes


def _walk(root: Path) -> tuple[int, int]:
    """Regular files under ``root`` and their total size (vanishing files are skipped)."""
    objects = size = 0
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
                        objects += 1
                except OSError:
                    continue
    return objects, size


class EtlCounters(Protocol):
    """What ``EtlStatsCollector`` reads (``etl_runtime.webserver.stats.Stats``)."""

    objects: int
    samples: int
    skipped: int
    errors: int
    bytes_in: int
    bytes_out: int
    transform_seconds: float


class EtlStatsCollector:
    """One transformer's ETL counters as ``sluice_etl_*_total{etl}``."""

    FIELDS = (
        ("objects", "sluice_etl_objects", "Objects (shards in wds mode) transformed whole."),
        ("samples", "sluice_etl_samples", "WebDataset samples transformed."),
        ("skipped", "sluice_etl_skipped", "Samples skipped after an error (onError: skip)."),
        ("errors", "sluice_etl_errors", "Objects and samples the transform failed on."),
        ("bytes_in", "sluice_etl_received_bytes", "Input bytes read by the transform."),
        ("bytes_out", "sluice_etl_sent_bytes", "Output bytes the transform produced."),
        (
            "transform_seconds",
            "sluice_etl_transform_seconds",
            "Seconds objects and shards spent in a worker, first input to last output.",
        ),
    )

    def __init__(self, etl: str, stats: EtlCounters) -> None:
        self.etl = etl
        self.stats = stats

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for attr, name, doc in self.FIELDS:
            c = CounterMetricFamily(name, doc, labels=["etl"])
            c.add_metric([self.etl], getattr(self.stats, attr))
            yield c


class RemoteCacheCounters(Protocol):
    """What ``RemoteCacheCollector`` reads (``etl_runtime.providers.cache.Counters``)."""

    hits: int
    misses: int
    backend_fetches: int
    backend_fetch_bytes: int
    backend_fetch_errors: int
    evicted: int
    evicted_bytes: int
    validations: int
    cold_checked: int
    cold_mismatches: int
    cached_bytes: int


class RemoteCacheCollector:
    """A target's cache of remote (``aws``) buckets as ``sluice_remote_*{target}``."""

    COUNTERS = (
        ("hits", "sluice_remote_cache_hits", "GETs of remote objects served from the cache."),
        ("misses", "sluice_remote_cache_misses", "GETs of remote objects that were not cached."),
        ("backend_fetches", "sluice_remote_backend_fetches", "Backend GETs that fill the cache."),
        ("backend_fetch_bytes", "sluice_remote_backend_fetch_bytes", "Bytes read from backends."),
        ("backend_fetch_errors", "sluice_remote_backend_fetch_errors", "Backend GETs that failed."),
        ("evicted", "sluice_remote_cache_evicted", "Cached objects evicted (high-water mark)."),
        ("evicted_bytes", "sluice_remote_cache_evicted_bytes", "Bytes evicted (high-water mark)."),
        ("validations", "sluice_remote_cache_validations", "Warm GETs checked with the backend."),
        (
            "cold_checked",
            "sluice_remote_cold_checked",
            "Fills checked against the backend's MD5 (validate_cold_get).",
        ),
        (
            "cold_mismatches",
            "sluice_remote_cold_mismatches",
            "Fills whose bytes were not the backend's MD5: refused, nothing cached.",
        ),
    )

    def __init__(self, target_id: str, counters: RemoteCacheCounters) -> None:
        self.target_id = target_id
        self.counters = counters

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for attr, name, doc in self.COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["target"])
            c.add_metric([self.target_id], getattr(self.counters, attr))
            yield c
        g = GaugeMetricFamily(
            "sluice_remote_cached_bytes",
            "Bytes of remote objects cached here (known once the cache was first used).",
            labels=["target"],
        )
        g.add_metric([self.target_id], self.counters.cached_bytes)
        yield g


class TargetStateCollector:
    """The gateway's view of each target: ``sluice_target_up{target}`` (1 answers
    its health probes, 0 away) and ``sluice_target_down{target}`` (1 marked down
    after a crash loop: left out and retried with a back-off, see ``sluice up``)."""

    def __init__(
        self,
        known: Callable[[], Iterable[str]],
        alive: Callable[[], set[str]],
        down: Callable[[], dict[str, str]],
    ) -> None:
        self.known, self.alive, self.down = known, alive, down

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        alive, down = self.alive(), self.down()
        up = GaugeMetricFamily(
            "sluice_target_up", "1 if the target answers the gateway now.", labels=["target"]
        )
        marked = GaugeMetricFamily(
            "sluice_target_down",
            "1 if the target was marked down after crashing again and again.",
            labels=["target"],
        )
        for tid in self.known():
            up.add_metric([tid], 1.0 if tid in alive else 0.0)
            marked.add_metric([tid], 1.0 if tid in down and tid not in alive else 0.0)
        yield up
        yield marked
