"""A real ``sluice up`` (2 targets, no token) and S3 keys on it, shared by the package."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from etl_runtime.local import LocalCluster

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402

CONFIG = Config(
    signature_version="s3v4",
    s3={"addressing_style": "path"},
    retries={"max_attempts": 1, "mode": "standard"},
)


def s3_client(endpoint: str, key: dict[str, Any] | None, secret: str | None = None) -> Any:
    """boto3's S3 client for the gateway's ``/s3``; ``key`` None: unsigned."""
    if key is None:
        from botocore import UNSIGNED

        config = CONFIG.merge(Config(signature_version=UNSIGNED))
        return boto3.client(
            "s3", endpoint_url=f"{endpoint}/s3", region_name="us-east-1", config=config
        )
    return boto3.client(
        "s3",
        endpoint_url=f"{endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=secret or key["secret_key"],
        region_name="us-east-1",
        config=CONFIG,
    )


def make_key(endpoint: str, permission: str, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(
        f"{endpoint}/v1/s3/keys", json={"permission": permission}, headers=headers, timeout=10
    )
    r.raise_for_status()
    return dict(r.json())


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("s3") / "data", targets=2) as c:
        yield c


@pytest.fixture(scope="package")
def endpoint(cluster: LocalCluster) -> str:
    return cluster.endpoint.rstrip("/")


@pytest.fixture(scope="package")
def writer(endpoint: str) -> dict[str, Any]:
    return make_key(endpoint, "write")


@pytest.fixture(scope="package")
def reader(endpoint: str) -> dict[str, Any]:
    return make_key(endpoint, "read")


@pytest.fixture(scope="package")
def s3(endpoint: str, writer: dict[str, Any]) -> Any:
    return s3_client(endpoint, writer)
