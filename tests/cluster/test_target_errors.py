"""A bug on a target is a JSON 500 naming the target, and its connection stays usable.

An exception no handler expected went to Starlette's outermost middleware,
which answered and re-raised; uvicorn then closed the connection, so the
gateway's next request on its pooled connection was reset and it answered
503 "target unreachable" (retry!) for what was a bug on one target.
"""

from __future__ import annotations

import httpx
import pytest

from etl_runtime.storage.store import ObjectStore
from tests.cluster.conftest import MapCluster


def test_a_bug_on_a_target_is_a_500_naming_it_not_an_unreachable_target(
    map_cluster: MapCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = map_cluster.add_target("t0")
    map_cluster.start_gateway()
    http = map_cluster.client()
    assert http.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
    assert http.put("/v1/objects/bkt/o", content=b"x").status_code == 200

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the listing")

    monkeypatch.setattr(ObjectStore, "list_objects", broken)
    for _ in range(3):  # the gateway's pooled connection to t0 is reused each time
        r = http.get("/v1/buckets/bkt")
        assert r.status_code == 500, r.text
        body = r.json()
        assert body["kind"] == "InternalError" and body["target"] == "t0", body
        assert "target 't0'" in body["error"] and "a bug in the listing" in body["error"]

    with httpx.Client(base_url=t0.url, timeout=30) as direct:
        for _ in range(3):  # one kept-alive connection: never reset after the 500
            r = direct.get("/v1/buckets/bkt")
            assert r.status_code == 500 and r.json()["target"] == "t0", r.text
        assert direct.get("/v1/objects/bkt/o").content == b"x"  # and still serving
