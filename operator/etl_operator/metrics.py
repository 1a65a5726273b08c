"""The operator's Prometheus metrics, served by ``serve_metrics`` on their own port.

kopf serves no HTTP of ours, so the operator runs ``prometheus_client``'s
small server beside it (``--metrics-port`` / ``SLUICE_METRICS_PORT``, default
9090, 0 = off). ``ReconcileQueue`` records every reconcile here:

* ``sluice_operator_reconciles_total``: reconciles run (successful or not);
* ``sluice_operator_reconcile_errors_total``: those that raised (retried later);
* ``sluice_operator_reconcile_duration_seconds``: how long each took.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)

DEFAULT_PORT = 9090

disable_created_metrics()
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
RECONCILES = Counter(
    "sluice_operator_reconciles", "ETL reconciles run, successful or not.", registry=REGISTRY
)
RECONCILE_ERRORS = Counter(
    "sluice_operator_reconcile_errors",
    "ETL reconciles that raised (each is retried).",
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "sluice_operator_reconcile_duration_seconds",
    "Time one ETL reconcile took (reading the world, acting, writing status).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)


def serve_metrics(port: int, addr: str = "0.0.0.0") -> tuple[WSGIServer, threading.Thread]:
    """Serve ``GET /metrics`` on ``addr:port`` from a daemon thread."""
    return start_http_server(port, addr, registry=REGISTRY)
