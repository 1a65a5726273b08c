"""The gateway's ``GET /metrics``: redirects counted by route template and status."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import Cluster
from tests.prom import scrape

OBJECT_ROUTE = "/v1/objects/{bucket}/{name:path}"


def test_redirected_gets_are_counted_on_the_gateway_and_served_by_targets(
    cluster: Cluster,
) -> None:
    c = cluster.client
    assert c.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
    names = [f"obj-{i}" for i in range(4)]
    for name in names:
        assert c.put(f"/v1/objects/bkt/{name}", content=name.encode() * 100).status_code == 200
    for _ in range(7):
        assert c.get("/v1/objects/bkt/obj-0").status_code == 200
    assert c.get("/v1/buckets/bkt").status_code == 200

    gw = scrape(cluster.url)
    get = {"role": "gateway", "route": OBJECT_ROUTE, "op": "get"}
    assert gw.value("sluice_http_requests_total", status="307", **get) == 7
    assert gw.value("sluice_http_request_duration_seconds_count", **get) == 7
    # A PUT is redirected (307) or, without Expect: 100-continue, proxied (200).
    assert gw.value("sluice_http_requests_total", route=OBJECT_ROUTE, op="put") == 4
    assert gw.value("sluice_http_requests_total", route="/v1/buckets/{bucket}", op="get") == 1
    assert gw.value("sluice_http_sent_bytes_total", role="gateway") > 0
    assert gw.labels("sluice_http_requests_total", "role") == {"gateway"}

    # Each app has its own registry: the targets count what they served, only that.
    served = [scrape(t.url) for t in cluster.targets]
    assert {r for s in served for r in s.labels("sluice_http_requests_total", "role")} == {"target"}
    objects = {"route": OBJECT_ROUTE, "status": "200"}
    assert sum(s.value("sluice_http_requests_total", op="get", **objects) for s in served) == 7
    assert sum(s.value("sluice_http_requests_total", op="put", **objects) for s in served) == 4


def test_metrics_need_no_token(secured: Cluster) -> None:
    r = httpx.get(f"{secured.url}/metrics")
    assert r.status_code == 200
    assert "sluice_http_requests_total" in r.text
