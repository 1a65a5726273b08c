"""The server image serves objects as a target and as a gateway, as the chart runs it.

Two containers from ``localhost/sluice/server:dev`` (podman + runc): a target
with a volume for /data and a gateway in front of it, both as UID 10001 with a
read-only root filesystem and only /tmp writable. An object PUT through the
gateway comes back byte for byte, lands on the volume owned by 10001, and
nothing in the containers can write outside their volumes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.images.podman import UID, Container, owned_dir
from tests.servers import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

CLUSTER_KEY = "images-test-cluster-key"


@pytest.fixture(scope="module")
def cluster(
    built_images: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Container, Container, Path]]:
    root = tmp_path_factory.mktemp("server-image")
    data, shared = owned_dir(root / "data"), owned_dir(root / "shared")
    target_port, gateway_port = free_port(), free_port()
    env = {"SLUICE_CLUSTER_KEY": CLUSTER_KEY}
    cmap = "file:/shared/cluster.json"
    with Container(
        "server",
        ["--id", "t0", "--host", "127.0.0.1", "--port", str(target_port), "--data-dir", "/data"]
        + ["--cluster-map", cmap, "--registry", "file:/shared/etl"],
        env=env,
        volumes={str(data): "/data", str(shared): "/shared"},
        name="target",
    ) as target:
        target.wait_http(f"http://127.0.0.1:{target_port}/v1/health")
        with Container(
            "server",
            ["--host", "127.0.0.1", "--port", str(gateway_port)]
            + ["--targets", f"t0=http://127.0.0.1:{target_port}", "--members", "t0"]
            + ["--cluster-map", cmap, "--state-dir", "/shared/etl"],
            entrypoint="sluice-gateway",
            env=env,
            volumes={str(shared): "/shared"},
            name="gateway",
        ) as gateway:
            url = f"http://127.0.0.1:{gateway_port}"
            gateway.wait_http(f"{url}/v1/health")
            yield url, target, gateway, data


def test_put_then_get_through_the_gateway(cluster: tuple[str, Container, Container, Path]) -> None:
    url, target, _, data = cluster
    body = os.urandom(256 * 1024) + b"end"
    with httpx.Client(base_url=url, timeout=60.0, follow_redirects=True) as client:
        r = client.post("/v1/buckets/photos", json={"action": "create-bck"})
        assert r.status_code in (200, 201), r.text
        put = client.put("/v1/objects/photos/2024/cat.bin", content=body)
        assert put.status_code == 200, put.text
        got = client.get("/v1/objects/photos/2024/cat.bin")
        assert got.status_code == 200, got.text
        assert got.content == body
        listing = client.get("/v1/buckets/photos").json()
    assert "2024/cat.bin" in str(listing)
    # The object is a file on the target's volume, written by UID 10001.
    stored = [p for p in data.rglob("*") if p.is_file() and p.stat().st_size == len(body)]
    assert stored, f"no {len(body)}-byte file under the target's volume: {list(data.rglob('*'))}"
    assert {(p.stat().st_uid, p.stat().st_gid) for p in stored} == {(UID, UID)}
    assert target.state()["Running"]


def test_servers_run_as_uid_10001_on_a_read_only_root(
    cluster: tuple[str, Container, Container, Path],
) -> None:
    """No --user given: the image's own USER runs, and it may write only its volumes."""
    _, target, gateway, _ = cluster
    for container in (target, gateway):
        assert container.proc_ids() == (UID, UID), container.name
        for path in ("/usr/local/lib/was-here", "/home/sluice/was-here", "/was-here"):
            denied = container.exec("touch", path)
            assert denied.returncode != 0, f"{container.name} could write {path}"
            assert "Read-only file system" in denied.stderr, denied.stderr
        assert container.exec("touch", "/tmp/was-here").returncode == 0  # the chart's emptyDir
    assert target.exec("touch", "/data/was-here").returncode == 0  # the volume
