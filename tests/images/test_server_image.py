"""The server image serves objects as a target and as a gateway, as the chart runs it.

Two containers from ``localhost/sluice/server:dev`` (podman + runc): a target
with a volume for /data and a gateway in front of it, both as UID 10001 with a
read-only root filesystem and only /tmp writable. An object PUT through the
gateway comes back byte for byte, lands on the volume owned by 10001, and
nothing in the containers can write outside their volumes.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.images.podman import UID, Container

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]


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
