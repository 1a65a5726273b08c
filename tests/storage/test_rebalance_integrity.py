"""Rebalance never copies bad bytes: raising a bucket's copies with a corrupted only copy
makes no corrupted second copy, and reads of it keep failing loudly."""

from __future__ import annotations

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
    with LocalCluster(tmp_path_factory.mktemp("rebalance") / "data", targets=3) as c:
        yield c


def test_more_copies_of_a_corrupted_object_copy_no_bad_bytes(up: LocalCluster) -> None:
    with httpx.Client(base_url=up.endpoint, timeout=30, follow_redirects=True) as http:
        make(http, "grow")
        put(http, "grow", "bad.bin", payload(30_000, 1))
        put(http, "grow", "good.bin", good := payload(30_000, 2))
        [bad] = files_of(up, "grow", "bad.bin")
        flip(bad)
        flipped = bad.read_bytes()
        before = max(t["rebalance"]["rebalance_id"] or 0 for t in targets(http))
        r = http.post("/v1/buckets/grow", json={"action": "set-bprops", "props": {"copies": 2}})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every target's rebalance done, none failing
            passes = [t["rebalance"] or {} for t in targets(http)]
            if all(
                p.get("state") == "done" and (p.get("rebalance_id") or 0) > before for p in passes
            ):
                break
            time.sleep(0.3)
        assert all(p.get("state") == "done" for p in passes), passes  # no pass kept failing
        assert sum(p.get("corrupted", 0) for p in passes) == 1, passes
        assert [p.read_bytes() for p in files_of(up, "grow", "good.bin")] == [good, good]
        copies = files_of(up, "grow", "bad.bin")
        assert [p.read_bytes() for p in copies] == [flipped], "a copy of bad bytes was made"
        r = http.get("/v1/objects/grow/bad.bin")
        assert r.status_code == 503 and r.json()["kind"] == "ObjectCorrupted", r.text[:200]


def targets(http: httpx.Client) -> list[dict[str, Any]]:
    found = http.get("/v1/cluster").json()["targets"]
    assert found and all(t["rebalance"] for t in found), found
    return list(found)
