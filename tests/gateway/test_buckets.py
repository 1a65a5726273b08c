"""Bucket calls through the gateway: broadcast create/delete, merged paginated listing."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import TOKEN, Cluster


def test_create_list_delete_broadcast(cluster: Cluster) -> None:
    c = cluster.client
    r = c.post("/v1/buckets/imgs", json={"action": "create-bck"})
    assert r.json() == {"bucket": "imgs", "created": True}
    assert c.post("/v1/buckets/imgs", json={"action": "create-bck"}).json()["created"] is False
    for d in cluster.data_dirs.values():
        assert (d / "buckets" / "imgs").is_dir()
    c.post("/v1/buckets/aaa", json={"action": "create-bck"})
    assert c.get("/v1/buckets").json() == {"buckets": ["aaa", "imgs"]}
    for i in range(10):
        c.put(f"/v1/objects/imgs/{i}", content=b"x")
    assert c.delete("/v1/buckets/imgs").json() == {"bucket": "imgs", "deleted": True}
    assert c.get("/v1/buckets").json() == {"buckets": ["aaa"]}
    r = c.delete("/v1/buckets/imgs")
    assert r.status_code == 404 and r.json()["bucket"] == "imgs"
    r = c.get("/v1/buckets/imgs")
    assert r.status_code == 404 and r.json()["kind"] == "BucketNotFound"


def test_bad_bucket_requests(cluster: Cluster) -> None:
    c = cluster.client
    assert c.post("/v1/buckets/bkt", json={"action": "nope"}).status_code == 400
    assert c.post("/v1/buckets/bkt", content=b"not json").status_code == 400
    r = c.post("/v1/buckets/bad!", json={"action": "create-bck"})
    assert r.status_code == 400 and r.json()["kind"] == "InvalidName"
    assert c.get("/v1/buckets").json() == {"buckets": []}
    r = c.put("/v1/objects/missing/o", content=b"x")
    assert r.status_code == 404 and r.json()["bucket"] == "missing"


def test_listing_merges_targets_sorted_and_paginates(cluster: Cluster) -> None:
    c = cluster.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    names = sorted([f"shard-{i:03d}.tar" for i in range(40)] + ["other/x", "other/y"])
    for n in names:
        assert c.put(f"/v1/objects/bkt/{n}", content=n.encode()).status_code == 200
    assert all(len(cluster.objects_on(t.id, "bkt")) < len(names) for t in cluster.targets)
    full = c.get("/v1/buckets/bkt").json()
    assert [o["name"] for o in full["objects"]] == names and full["next"] is None
    assert full["objects"][0]["size"] == len(names[0])
    seen: list[str] = []
    start = ""
    pages = 0
    while True:
        page = c.get(
            "/v1/buckets/bkt", params={"prefix": "shard-", "limit": 7, "start_after": start}
        ).json()
        seen += [o["name"] for o in page["objects"]]
        pages += 1
        if page["next"] is None:
            break
        assert len(page["objects"]) == 7
        start = page["next"]
    assert seen == [n for n in names if n.startswith("shard-")]
    assert pages == 6
    assert c.get("/v1/buckets/bkt", params={"prefix": "other/"}).json()["objects"][1]["name"] == (
        "other/y"
    )


def test_bucket_mutations_need_token(secured: Cluster) -> None:
    url = secured.url
    r = httpx.post(f"{url}/v1/buckets/bkt", json={"action": "create-bck"})
    assert r.status_code == 401 and r.json()["kind"] == "Unauthorized"
    assert httpx.get(f"{url}/v1/buckets").json() == {"buckets": []}
    assert secured.client.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
    assert httpx.delete(f"{url}/v1/buckets/bkt").status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    assert httpx.delete(f"{url}/v1/buckets/bkt", headers=wrong).status_code == 401
    assert httpx.get(f"{url}/v1/buckets").json() == {"buckets": ["bkt"]}
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.delete(f"{url}/v1/buckets/bkt", headers=ok).status_code == 200


def test_health_and_cluster(cluster: Cluster) -> None:
    assert cluster.client.get("/v1/health").json() == {
        "status": "ok",
        "role": "gateway",
        "targets": 2,
    }
    cluster.discovery.live = cluster.targets[:1]
    body = cluster.client.get("/v1/cluster").json()
    assert body == {
        "targets": [{"id": "t0", "url": cluster.targets[0].url, "node": None, "alive": True}]
    }
