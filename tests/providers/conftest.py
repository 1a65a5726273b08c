"""A real MinIO on loopback and a real local cluster (``sluice up``) whose targets use it.

MinIO is built by ``make minio`` (scripts/minio.sh, which ``make test`` runs);
without it these tests fail with that hint rather than skip. The cluster gets
MinIO's endpoint and keys the standard way, through ``AWS_*`` in the
environment of ``sluice up``, which passes them to its gateway and targets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from tests.providers.cutproxy import CutProxy
from tests.providers.minio import MinioServer

CACHE_BYTES = 8 << 20  # per target: small, so that eviction is tested for real


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    data = tmp_path_factory.mktemp("minio") / "data"
    data.mkdir()
    server = MinioServer(data)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$SLUICE_SECRETS_DIR`` of the cluster, with a secret ``wrong`` holding bad keys."""
    root = tmp_path_factory.mktemp("secrets")
    (root / "wrong").mkdir()
    (root / "wrong" / "AWS_ACCESS_KEY_ID").write_text("sluice-test")
    (root / "wrong" / "AWS_SECRET_ACCESS_KEY").write_text("not-the-secret")
    return root


@pytest.fixture(scope="package")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory of ``endpoint``'s cluster (``targets/tI/buckets/...``)."""
    return tmp_path_factory.mktemp("cluster")


def leftovers(cluster_dir: Path) -> list[Path]:
    """Temp files of fills left on the targets' disks."""
    return sorted(cluster_dir.glob("targets/*/.tmp/remote-*"))


@pytest.fixture(scope="module")
def proxy(minio: MinioServer) -> Iterator[CutProxy]:
    """A proxy in front of MinIO that cuts answers or inverts a byte (``cutproxy``)."""
    p = CutProxy(minio.endpoint)
    yield p
    p.close()


def cached_files(cluster_dir: Path, bucket: str, name: str) -> list[Path]:
    """The cached copies of ``bucket/name`` on the cluster's targets' disks."""
    return sorted(cluster_dir.glob(f"targets/*/buckets/{bucket}/{name}"))


@pytest.fixture(scope="package")
def endpoint(minio: MinioServer, secrets_dir: Path, cluster_dir: Path) -> Iterator[str]:
    from etl_runtime.local.api import LocalCluster

    env = {
        **minio.env(),
        "SLUICE_SECRETS_DIR": str(secrets_dir),
        "SLUICE_REMOTE_CACHE_BYTES": str(CACHE_BYTES),
    }
    with (
        mock.patch.dict(os.environ, env),
        LocalCluster(cluster_dir, targets=2, port=0) as cluster,
    ):
        yield str(cluster.endpoint).rstrip("/")


def metric(endpoint: str, name: str) -> float:
    """``name``'s value summed over every target's ``/metrics``."""
    return sum(per_target(endpoint, name).values())


def per_target(endpoint: str, name: str) -> dict[str, float]:
    """``name``'s value on each target."""
    targets = httpx.get(f"{endpoint}/v1/cluster", timeout=10).json()["targets"]
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    found = {}
    for t in targets:
        text = httpx.get(f"{t['url']}/metrics", timeout=10).text
        found[t["id"]] = sum(float(v) for v in pattern.findall(text))
    return found
