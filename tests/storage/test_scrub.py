"""The scrub job on a real 3-target cluster: it finds bit rot, missing and orphaned copies,
and repairs what a good copy allows; ``sluice job start scrub --bucket B`` starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from etl_runtime.local import LocalCluster
from tests.storage.test_integrity import files_of, flip, make, payload, put

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("scrub") / "data", targets=3) as c:
        yield c


@pytest.fixture(scope="module")
def http(up: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=up.endpoint, timeout=30, follow_redirects=True) as c:
        walked(c)
        yield c


def walked(http: httpx.Client) -> None:
    """Until every target is done with its walk for the map's rebalance id (each walks
    its objects once at start, repairing missing copies: a walk that began after a
    test removed a copy would put it back before the scrub could find it missing)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = http.get("/v1/cluster").json()
        now = view["rebalance"]["id"]
        walks = [t["rebalance"] or {} for t in view["targets"]]
        if all(w.get("state") == "done" and w.get("rebalance_id") == now for w in walks):
            return
        time.sleep(0.1)
    raise AssertionError(f"the targets' walks did not end: {view}")


def scrub(http: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/jobs", json={"kind": "scrub", "spec": spec})
    assert r.status_code == 200, r.text
    return wait(http, r.json()["id"])


def wait(http: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["state"] != "Running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"scrub {job_id} did not end: {job}")


def rebalance_id(http: httpx.Client) -> int:
    r = http.get("/v1/cluster")
    assert r.status_code == 200, r.text
    return int(r.json()["rebalance"]["id"])


def test_scrub_repairs_a_bad_copy_and_a_missing_one(up: LocalCluster, http: httpx.Client) -> None:
    # A rebalance repairs copies too (one starts when the gateway sees a target come
    # back, as it may just after the cluster starts): one that ran between the copy's
    # removal and the scrub may have put it back first. Then the case runs again.
    for attempt in range(3):
        bucket = f"sc2-{attempt}"
        make(http, bucket, copies=2)
        before = rebalance_id(http)
        objs = {f"o{i}.bin": payload(20_000 + i, i) for i in range(6)}
        for name, data in objs.items():
            put(http, bucket, name, data)
        # One copy each of two objects flipped: each keeps one good copy.
        flip(files_of(up, bucket, "o1.bin")[1])
        flip(files_of(up, bucket, "o2.bin")[0])
        gone = files_of(up, bucket, "o3.bin")[0]
        gone.unlink()
        job = scrub(http, {"bucket": bucket})
        for name, data in objs.items():
            copies = files_of(up, bucket, name)
            assert len(copies) == 2 and all(p.read_bytes() == data for p in copies), name
        if rebalance_id(http) != before:
            continue
        assert job["state"] == "Finished", job
        out = job["output"]
        assert out["scanned"] == 2 * len(objs) - 1, job
        assert out["corrupted"] == 2 and out["repaired"] == 2 and out["unrepaired"] == 0, job
        assert sorted(out["corrupted_objects"]) == [f"{bucket}/o1.bin", f"{bucket}/o2.bin"]
        assert out["missing_copies"] == 1 and out["copies_made"] == 1, job
        return
    raise AssertionError("a rebalance ran during each of 3 tries")


def test_scrub_reports_an_unrepairable_object_and_an_orphan(
    up: LocalCluster, http: httpx.Client
) -> None:
    make(http, "sc1")
    put(http, "sc1", "only.bin", payload(5000, 9))
    put(http, "sc1", "fine.bin", payload(5000, 10))
    [only] = files_of(up, "sc1", "only.bin")
    flip(only)
    [fine] = files_of(up, "sc1", "fine.bin")
    others = [d for d in sorted(up.data_dir.glob("targets/*")) if d not in fine.parents]
    stray = others[0] / "buckets" / "sc1" / "fine.bin"  # a copy on a target that is no owner
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(fine.read_bytes())
    job = scrub(http, {"bucket": "sc1"})
    out = job["output"]
    assert out["corrupted"] == 1 and out["unrepaired"] == 1 and out["repaired"] == 0, out
    assert job["error_count"] >= 1
    assert any("only.bin" in (e.get("object") or "") for e in job["errors"]), job["errors"]
    assert out["orphaned"] == 1 and out["orphaned_objects"] == ["sc1/fine.bin"], out
    r = http.get("/v1/objects/sc1/only.bin")
    assert r.status_code == 503 and r.json()["kind"] == "ObjectCorrupted"  # still loud


def test_cli_starts_a_scrub(up: LocalCluster, http: httpx.Client) -> None:
    make(http, "sccli")
    put(http, "sccli", "a.bin", b"a" * 100)
    cmd = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", up.endpoint]
    env = {**os.environ, "SLUICE_TOKEN": ""}
    r = subprocess.run(
        [*cmd, "job", "start", "scrub", "--bucket", "sccli"],
        capture_output=True,
        timeout=120,
        env=env,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    job = wait(http, r.stdout.strip())
    assert job["kind"] == "scrub" and job["state"] == "Finished", job
    assert job["output"]["scanned"] == 1 and job["output"]["corrupted"] == 0
    r = http.post("/v1/jobs", json={"kind": "scrub", "spec": {"bucket": "sccli", "x": 1}})
    assert r.status_code == 400 and "x" in r.json()["error"]
    r = http.post("/v1/jobs", json={"kind": "scrub", "spec": {"bucket": "nope"}})
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_scrub_gives_older_objects_a_checksum(up: LocalCluster, http: httpx.Client) -> None:
    """Objects written before checksums were stored (no attribute): the scrub checks each
    one's MD5 against its ETag and stores its checksum; one whose bytes no longer match
    its ETag is corrupted, and its reads fail."""
    make(http, "scold")
    put(http, "scold", "kept.bin", payload(30_000, 12))
    put(http, "scold", "rotted.bin", payload(30_000, 13))
    [kept], [rotted] = files_of(up, "scold", "kept.bin"), files_of(up, "scold", "rotted.bin")
    for path in (kept, rotted):
        os.removexattr(path, "user.sluice.xxh")
    flip(rotted)
    out = scrub(http, {"bucket": "scold"})["output"]
    assert out["checksums_added"] == 1 and out["corrupted"] == 1, out
    assert out["corrupted_objects"] == ["scold/rotted.bin"], out
    assert os.getxattr(kept, "user.sluice.xxh").startswith(b"xxh3:")
    assert http.get("/v1/objects/scold/rotted.bin").status_code == 503
    assert http.get("/v1/objects/scold/kept.bin").content == payload(30_000, 12)
