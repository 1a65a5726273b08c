"""The operator's ``/metrics`` (its own port): reconcile counts, errors, duration."""

from __future__ import annotations

import asyncio

import pytest

from etl_operator.__main__ import parse_args
from etl_operator.controller import Controller, OperatorConfig
from etl_operator.metrics import serve_metrics
from etl_operator.queue import ReconcileQueue
from tests.operator.fakes import FakeKube
from tests.prom import scrape
from tests.servers import free_port

SOURCE = {"mode": "object", "code": {"source": "def transform(d):\n    return d[::-1]\n"}}


def test_reconciles_and_failed_reconciles_are_counted_and_timed() -> None:
    kube = FakeKube()
    kube.add_target("target-0", node="node-0")
    kube.add_etl("reverse", dict(SOURCE))
    ctl = Controller(kube, OperatorConfig(image="img", cluster_key="k"))  # type: ignore[arg-type]
    failures = ["the API server is away"]

    def work(namespace: str, name: str) -> object:
        if failures:
            raise RuntimeError(failures.pop())
        return ctl.reconcile(namespace, name)

    server, thread = serve_metrics(free_port(), "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        before = scrape(url)

        async def scenario() -> None:
            q = ReconcileQueue(work, retry_seconds=0.01)
            q.request("ns", "reverse")
            await q.drain()

        asyncio.run(scenario())
        after = scrape(url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    def rose(name: str) -> float:
        return after.value(name) - before.value(name)

    assert kube.etls[("ns", "reverse")]["status"]["phase"] == "Initializing"
    assert rose("sluice_operator_reconciles_total") == 2  # the failed one, then its retry
    assert rose("sluice_operator_reconcile_errors_total") == 1
    assert rose("sluice_operator_reconcile_duration_seconds_count") == 2


def test_metrics_port_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_args([]).metrics_port == 9090
    monkeypatch.setenv("SLUICE_METRICS_PORT", "9300")
    assert parse_args([]).metrics_port == 9300
    assert parse_args(["--metrics-port", "0"]).metrics_port == 0
