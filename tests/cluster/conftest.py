"""Targets and a gateway sharing one cluster map, uvicorn in threads, on loopback.

``MapCluster`` can add targets, take them "away" from the gateway's liveness
view (their server keeps running, as a paused process's socket would accept)
and restart the gateway with a new member list, which starts a rebalance.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from etl_runtime.cluster.clustermap import MemoryClusterMap
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.gateway import create_gateway_app
from etl_runtime.storage_target import create_target_app
from tests.gateway.conftest import DictBackend
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry


class Liveness:
    """``TargetDiscovery`` whose live set the test controls."""

    def __init__(self) -> None:
        self.all: list[TargetInfo] = []
        self.down: set[str] = set()

    def targets(self) -> list[TargetInfo]:
        return [t for t in self.all if t.id not in self.down]

    def all_targets(self) -> list[TargetInfo]:
        return list(self.all)


@dataclass
class MapCluster:
    tmp: Path
    stack: contextlib.ExitStack
    cmap: MemoryClusterMap = field(default_factory=MemoryClusterMap)
    live: Liveness = field(default_factory=Liveness)
    registry: DictRegistry = field(default_factory=DictRegistry)
    url: str = ""
    servers: dict[str, contextlib.ExitStack] = field(default_factory=dict)
    _gateway: contextlib.ExitStack | None = None

    def add_target(self, tid: str, read_token: str | None = None) -> TargetInfo:
        app = create_target_app(
            tid,
            self.tmp / tid,
            self.registry,
            cluster_key=CLUSTER_KEY,
            cluster_map=self.cmap,
            read_token=read_token,
        )
        own = contextlib.ExitStack()
        info = TargetInfo(id=tid, url=own.enter_context(serve_in_thread(app)))
        self.stack.callback(own.close)
        self.servers[tid] = own
        self.live.all.append(info)
        return info

    def stop_target(self, tid: str) -> None:
        """Stop a target's server for good (a lost node): nobody can reach it."""
        self.servers.pop(tid).close()
        self.live.down.add(tid)

    def start_gateway(self, members: list[str] | None = None, read_token: str | None = None) -> str:
        if self._gateway is not None:
            self._gateway.close()
        self._gateway = contextlib.ExitStack()
        app = create_gateway_app(
            self.live,
            DictBackend(self.registry),
            cluster_key=CLUSTER_KEY,
            cluster_map=self.cmap,
            members=members,
            read_token=read_token,
        )
        self.url = self._gateway.enter_context(serve_in_thread(app))
        return self.url

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, follow_redirects=True)

    def objects_on(self, tid: str, bucket: str) -> set[str]:
        root = self.tmp / tid / "buckets" / bucket
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check}")


@pytest.fixture
def map_cluster(tmp_path: Path) -> Iterator[MapCluster]:
    with contextlib.ExitStack() as stack:
        c = MapCluster(tmp_path, stack)
        try:
            yield c
        finally:
            c.close()
