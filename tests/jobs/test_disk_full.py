"""A job on a target whose disk is full is refused with 507, never a bare OSError.

The target's own disk (a small tmpfs, ``tests/tmpfs.py``: root only, skipped
elsewhere with the reason) is filled with real PUTs; a job then cannot even
record its state there. Before, the target's job routes raised the raw
``OSError(28)``, which the gateway passed on as a 500 (or a retryable 503).
"""

from __future__ import annotations

from tests.cluster.conftest import MapCluster
from tests.jobs.test_framework import _wait  # noqa: F401 - registers the test-relay kind
from tests.tmpfs import mounted_tmpfs

CHUNK = 256 << 10


def test_a_job_on_a_full_disk_is_507_naming_the_target(map_cluster: MapCluster) -> None:
    with mounted_tmpfs(map_cluster.tmp / "t0", size="2m"):
        map_cluster.add_target("t0")
        map_cluster.start_gateway()
        http = map_cluster.client()
        assert http.post("/v1/buckets/src", json={"action": "create-bck"}).status_code == 200
        for i in range(64):  # until the disk refuses one
            r = http.put(f"/v1/objects/src/o{i}", content=b"x" * CHUNK)
            if r.status_code != 200:
                break
        assert r.status_code == 507, r.text

        r = http.post("/v1/jobs", json={"kind": "test-relay", "spec": {"bucket": "src"}})
        assert r.status_code == 507, r.text
        body = r.json()
        assert body["kind"] == "InsufficientStorage" and body.get("target") == "t0", body
        assert "no space left" in body["error"] and "job" in body["error"], body
        http.close()
        map_cluster.close()
        map_cluster.stack.close()
