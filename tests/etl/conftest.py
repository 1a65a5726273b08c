"""A real target (uvicorn in a thread) beside real transformers (``etl_runtime.webserver``).

The transformers are started once per session; each test gets a fresh target
over its own data dir, with ``SLUICE_ETL_CACHE_BYTES`` as the test sets it
before asking for ``ctarget`` (default 64 MiB), ``SLUICE_ETL_FQN=always`` as
under ``sluice up`` (so an ETL without the cache answers with the 307), and a
``DictRegistry`` the test fills with ``register``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core.spec import EtlSpec
from etl_runtime.etl.outcache import OutputCache
from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import zerocopy
from tests.servers import SessionServers, serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry
from tests.webserver.conftest import source_code, transformer

# v1 of the object ETL: upper-cases, appends etl_args; "pieces" answers in chunks of
# unknown length (the relayed stream), "slow" the same with a pause between chunks (a
# client that hangs up is noticed before the answer is done), "failmid" breaks after
# the first bytes.
OBJECT_V1 = """
import time

def transform(data, args):
    if args == "slow":
        def slow():
            for i in range(0, len(data), 100_000):
                yield data[i : i + 100_000].upper()
                time.sleep(0.05)
        return slow()
    if args == "failmid":
        def broken():
            yield data[:200_000].upper()
            raise RuntimeError("disk on fire")
        return broken()
    if args == "pieces":
        return (data[i : i + 100_000].upper() for i in range(0, len(data), 100_000))
    if args == "raise":
        raise ValueError("bad pixel")
    return data.upper() + (args or "").encode()
"""
OBJECT_V2 = """
def transform(data, args):
    return data.lower() + b"|v2"
"""
WDS = """
def transform(sample):
    return {"__key__": sample["__key__"], "txt": sample["txt"].upper()}
"""
SPECS = {
    "v1": {"mode": "object", "code": source_code(OBJECT_V1)},
    "v2": {"mode": "object", "code": source_code(OBJECT_V2)},
    "wds": {"mode": "wds", "code": source_code(WDS)},
}


@dataclass
class Transformers:
    urls: dict[str, str]

    def objects(self, which: str) -> int:
        """How many objects (shards) the transformer ``which`` transformed so far."""
        return int(httpx.get(f"{self.urls[which]}/stats", timeout=10).json()["objects"])


@pytest.fixture(scope="session")
def transformers(session_servers: SessionServers) -> Transformers:
    urls = {
        which: session_servers.get(
            ("etl-cache-transformer", which),
            lambda which=which: transformer(f"cache-{which}", SPECS[which], workers=1),
        )
        for which in SPECS
    }
    return Transformers(urls)


@dataclass
class CacheTarget:
    url: str
    data_dir: Path
    registry: DictRegistry
    client: httpx.Client
    app: Any
    transformers: Transformers

    @property
    def cache(self) -> OutputCache:
        cache = self.app.state.target.forwarder.cache
        assert cache is not None
        return cache

    def register(
        self, name: str, which: str, cache: bool = True, endpoint: str | None = None, **spec: Any
    ) -> EtlRecord:
        """ETL ``name`` running ``SPECS[which]`` on the transformer ``endpoint`` (default:
        that spec's own transformer)."""
        record = EtlRecord(
            name=name,
            uid="uid-1",
            spec=EtlSpec.from_dict({**SPECS[which], "cache": cache, **spec}),
            phase="Running",
            transformers=(
                TransformerStatus("t0", endpoint or self.transformers.urls[which], ready=True),
            ),
        )
        self.registry.put(record)
        return record

    def get(self, name: str, etl: str, **params: str) -> httpx.Response:
        return self.client.get(f"/v1/objects/bkt/{name}", params={"etl_name": etl, **params})

    def entries(self) -> list[Path]:
        root = self.data_dir / ".etlcache"
        return sorted(p for p in root.rglob("*") if p.is_file())

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the answers served so far are kept (or dropped): that happens in
        the background, once their last byte went out."""
        deadline = time.monotonic() + timeout
        while self.cache.busy:
            assert time.monotonic() < deadline, "the output cache is still publishing"
            time.sleep(0.01)

    def wait_entries(self, n: int) -> list[Path]:
        """The entries on disk once the cache settled; there must be ``n``."""
        self.settle()
        found = self.entries()
        assert len(found) == n == len(self.cache.index), (found, len(self.cache.index))
        return found

    def temp_files(self) -> list[Path]:
        return sorted((self.data_dir / ".tmp").iterdir())


@pytest.fixture
def ctarget(
    tmp_path: Path, transformers: Transformers, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CacheTarget]:
    import os

    if "SLUICE_ETL_CACHE_BYTES" not in os.environ:
        monkeypatch.setenv("SLUICE_ETL_CACHE_BYTES", "64MiB")
    monkeypatch.setenv("SLUICE_ETL_FQN", "always")
    yield from running_target(tmp_path / "data", transformers)


def running_target(data_dir: Path, transformers: Transformers) -> Iterator[CacheTarget]:
    registry = DictRegistry()
    app = create_target_app("t0", data_dir, registry, cluster_key=CLUSTER_KEY)
    with (
        serve_in_thread(app, http=zerocopy.http_protocol({})) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        yield CacheTarget(url, data_dir, registry, client, app, transformers)
