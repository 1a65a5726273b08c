"""A real cluster on loopback: two targets and a gateway, uvicorn in threads.

The protocols the gateway depends on are small in-test fakes: a static list
of live targets and a dict-backed ``EtlBackend`` that also publishes records to
the targets' registry, as the local controller or the operator would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from etl_runtime.cluster.records import EtlRecord, TargetInfo, TransformerStatus
from etl_runtime.core.spec import EtlSpec
from etl_runtime.gateway import create_gateway_app
from etl_runtime.storage_target import create_target_app
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry

TOKEN = "s3cret"


class StaticDiscovery:
    def __init__(self, targets: list[TargetInfo]) -> None:
        self.live = list(targets)

    def targets(self) -> list[TargetInfo]:
        return list(self.live)


class DictBackend:
    """``EtlBackend`` that "runs" transformers at fixed endpoints, one per target."""

    def __init__(self, registry: DictRegistry) -> None:
        self.registry = registry
        self.endpoints: dict[str, str] = {}  # target id -> transformer URL

    def _publish(self, record: EtlRecord) -> EtlRecord:
        self.registry.put(record)
        return record

    async def init(self, name: str, spec: EtlSpec) -> EtlRecord:
        transformers = tuple(
            TransformerStatus(target=t, endpoint=url, ready=True)
            for t, url in self.endpoints.items()
        )
        return self._publish(
            EtlRecord(name=name, uid="uid-1", spec=spec, transformers=transformers)
        )

    async def list(self) -> list[EtlRecord]:
        return [self.registry.records[n] for n in sorted(self.registry.records)]

    async def get(self, name: str) -> EtlRecord | None:
        return self.registry.get(name)

    async def set_stopped(self, name: str, stopped: bool) -> EtlRecord:
        r = self.registry.records[name]
        spec = EtlSpec.from_dict({**r.spec.to_dict(), "stopped": stopped})
        phase = "Stopped" if stopped else "Running"
        return self._publish(EtlRecord(r.name, r.uid, spec, phase, r.message, r.transformers))

    async def delete(self, name: str) -> None:
        del self.registry.records[name]


@dataclass
class Cluster:
    url: str
    targets: list[TargetInfo]
    data_dirs: dict[str, Path]
    discovery: StaticDiscovery
    backend: DictBackend
    registry: DictRegistry
    client: httpx.Client
    token: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def objects_on(self, target_id: str, bucket: str) -> list[str]:
        root = self.data_dirs[target_id] / "buckets" / bucket
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@contextlib.contextmanager
def run_cluster(
    tmp_path: Path, token: str | None = None, n: int = 2, read_token: str | None = None
) -> Iterator[Cluster]:
    registry = DictRegistry()
    with contextlib.ExitStack() as stack:
        targets, dirs = [], {}
        for i in range(n):
            tid = f"t{i}"
            dirs[tid] = tmp_path / tid
            app = create_target_app(
                tid,
                dirs[tid],
                registry,
                token=token,
                cluster_key=CLUSTER_KEY,
                read_token=read_token,
            )
            targets.append(TargetInfo(id=tid, url=stack.enter_context(serve_in_thread(app))))
        discovery = StaticDiscovery(targets)
        backend = DictBackend(registry)
        gw = create_gateway_app(
            discovery, backend, token=token, cluster_key=CLUSTER_KEY, read_token=read_token
        )
        url = stack.enter_context(serve_in_thread(gw))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = stack.enter_context(
            httpx.Client(base_url=url, timeout=30, follow_redirects=True, headers=headers)
        )
        yield Cluster(url, targets, dirs, discovery, backend, registry, client, token, headers)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with run_cluster(tmp_path) as c:
        yield c


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Cluster]:
    with run_cluster(tmp_path, token=TOKEN) as c:
        yield c
