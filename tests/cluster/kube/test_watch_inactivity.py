"""A watch on a half-open connection gives up after its inactivity timeout and relists.

A TCP proxy sits between one ``KubeClusterMap`` and the real kube-apiserver.
Freezing it stops forwarding on every connection it holds while keeping them
open (what a dropped NAT entry or a dead load balancer looks like from the
client: no FIN, no RST, just silence); connections made after the freeze are
forwarded again, as a client reconnecting would reach a live path.
"""

from __future__ import annotations

import copy
import logging
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI
from kubernetes import client
from prometheus_client import generate_latest

from etl_runtime.cluster.clustermap import BucketProps
from etl_runtime.cluster.kube import watch
from etl_runtime.cluster.kube.clustermap import KubeClusterMap
from etl_runtime.core.metrics import install_metrics
from tests.k8s.fixtures import Cluster
from tests.k8s.waiting import wait_for

pytestmark = pytest.mark.k8s

INACTIVITY_S = 2.0


class FreezingProxy:
    """Forwards TCP to ``upstream``; ``freeze()`` silences the connections it has."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._live: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._frozen: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            frozen = threading.Event()
            with self._lock:
                self.accepted += 1
                self._live.append((down, up, frozen))
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst, frozen), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, frozen: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if frozen.is_set():
                    continue  # frozen for good: swallowed, never forwarded
                dst.sendall(data)
        except OSError:
            pass
        if not frozen.is_set():
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def freeze(self) -> None:
        with self._lock:
            for conn in self._live:
                conn[2].set()
            self._frozen.extend(self._live)
            self._live = []

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for down, up, _ in self._live + self._frozen:
                down.close()
                up.close()


@pytest.fixture
def proxy(control_plane: Cluster) -> Iterator[FreezingProxy]:
    server = urlsplit(control_plane.api_client.configuration.host)
    p = FreezingProxy((server.hostname or "127.0.0.1", server.port or 443))
    yield p
    p.close()


def _through(control_plane: Cluster, proxy: FreezingProxy) -> client.ApiClient:
    cfg = copy.copy(control_plane.api_client.configuration)
    cfg.host = f"https://127.0.0.1:{proxy.port}"  # the serving cert names 127.0.0.1
    return client.ApiClient(cfg)


def test_a_map_behind_a_frozen_connection_catches_up_within_the_inactivity_timeout(
    control_plane: Cluster,
    k8s_namespace: str,
    proxy: FreezingProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(watch.INACTIVITY_ENV, str(INACTIVITY_S))
    writer = KubeClusterMap(k8s_namespace, "map", api=control_plane.api_client)
    reader = KubeClusterMap(k8s_namespace, "map", api=_through(control_plane, proxy))
    try:
        assert writer.wait_synced(10) and reader.wait_synced(10)
        first = writer.update(lambda m: m.with_members(["t-0"]))
        wait_for(lambda: reader.get() == first, 10)  # the watch works through the proxy
        what = f"configmaps/{k8s_namespace}/map"
        before = watch.relists().get((what, "inactive"), 0)

        proxy.freeze()
        with caplog.at_level(logging.WARNING, logger=watch.__name__):
            second = writer.update(lambda m: m.with_bucket("fresh", BucketProps(2)))
            # Without a client-side limit the reader would wait on the frozen
            # socket until the apiserver's own watch timeout, whose close never
            # arrives either: stale for good.
            wait_for(lambda: reader.get() == second, 10 * INACTIVITY_S)
        assert reader.get().buckets["fresh"] == BucketProps(2)
        assert watch.relists()[(what, "inactive")] > before
        assert any("relisting" in r.getMessage() and what in r.getMessage() for r in caplog.records)
        # What Prometheus scrapes from any server of the process.
        scraped = generate_latest(install_metrics(FastAPI(), "gateway")).decode()
        line = f'sluice_kube_watch_relists_total{{reason="inactive",watch="{what}"}} '
        assert float(scraped.split(line, 1)[1].split()[0]) > before, scraped
    finally:
        reader.close()
        writer.close()


def test_the_inactivity_timeout_refuses_a_value_that_is_not_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(watch.INACTIVITY_ENV, raising=False)
    assert watch.inactivity_timeout() == watch.DEFAULT_INACTIVITY_S
    monkeypatch.setenv(watch.INACTIVITY_ENV, "15")
    assert watch.inactivity_timeout() == 15.0
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(watch.INACTIVITY_ENV, bad)
        with pytest.raises(ValueError, match=watch.INACTIVITY_ENV):
            watch.inactivity_timeout()
