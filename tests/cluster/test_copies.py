"""Buckets with ``copies``: write-through, reads from a copy, repair, deletes, bucket metadata.

Targets and the gateway share one cluster map in this process (servers in
threads); "away" is the gateway's liveness view of a target, which is what a
paused or restarting target looks like to it.
"""

from __future__ import annotations

import hashlib
import time

from etl_runtime.cli.commands import format_cluster
from tests.cluster.conftest import MapCluster, wait_for


def three(c: MapCluster) -> None:
    for i in range(3):
        c.add_target(f"t{i}")
    c.start_gateway()


def test_copies_written_through_and_read_while_owner_away(map_cluster: MapCluster) -> None:
    c = map_cluster
    three(c)
    http = c.client()
    r = http.post("/v1/buckets/bkt", json={"action": "create-bck", "props": {"copies": 2}})
    assert r.json()["props"]["copies"] == 2
    blobs = {f"o{i}": hashlib.sha256(bytes([i])).digest() * 100 for i in range(30)}
    for name, data in blobs.items():
        assert http.put(f"/v1/objects/bkt/{name}", content=data).status_code == 200
    cmap = c.cmap.get()
    for name in blobs:  # acknowledged = on both owners, nowhere else
        holders = {t for t in ("t0", "t1", "t2") if name in c.objects_on(t, "bkt")}
        assert holders == set(cmap.owners("bkt", name))
    c.live.down = {"t1"}
    for name, data in blobs.items():  # every read served by a copy
        assert http.get(f"/v1/objects/bkt/{name}").content == data
    on_t1 = next(n for n in blobs if "t1" in cmap.owners("bkt", n))
    r = http.put(f"/v1/objects/bkt/{on_t1}", content=b"new")
    assert r.status_code == 503 and r.json()["target"] == "t1" and r.headers["retry-after"]
    listing = http.get("/v1/buckets/bkt").json()["objects"]  # complete with one target away
    assert [o["name"] for o in listing] == sorted(blobs)
    view = http.get("/v1/cluster").json()
    assert view["away"] == ["t1"]
    text = format_cluster(view)
    assert "t1" in text and "AWAY" in text and "copies=2" in text
    c.live.down = set()
    assert http.delete(f"/v1/objects/bkt/{on_t1}").status_code == 200
    assert all(on_t1 not in c.objects_on(t, "bkt") for t in ("t0", "t1", "t2"))
    assert http.get(f"/v1/objects/bkt/{on_t1}").status_code == 404


def test_more_copies_repairs_and_owner_away_without_copy_is_503(map_cluster: MapCluster) -> None:
    c = map_cluster
    three(c)
    http = c.client()
    http.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for i in range(20):
        assert http.put(f"/v1/objects/bkt/o{i}", content=b"x" * i).status_code == 200
    c.live.down = {"t2"}
    on_t2 = next(f"o{i}" for i in range(20) if c.cmap.get().owners("bkt", f"o{i}") == ["t2"])
    r = http.get(f"/v1/objects/bkt/{on_t2}")
    assert r.status_code == 503 and r.json()["kind"] == "TargetAway" and "t2" in r.json()["error"]
    r = http.get("/v1/buckets/bkt")  # part of the bucket cannot be listed: said, not hidden
    assert r.status_code == 503 and r.json()["target"] == "t2"
    c.live.down = set()
    r = http.post("/v1/buckets/bkt", json={"action": "set-bprops", "props": {"copies": 2}})
    assert r.status_code == 200, r.text

    def repaired() -> bool:
        cmap = c.cmap.get()
        return all(
            {t for t in ("t0", "t1", "t2") if f"o{i}" in c.objects_on(t, "bkt")}
            == set(cmap.owners("bkt", f"o{i}"))
            for i in range(20)
        )

    wait_for(repaired, 30, "copies repaired")
    r = http.post("/v1/buckets/bkt", json={"action": "set-bprops", "props": {"copies": 9}})
    assert r.status_code == 400 and "copies" in r.json()["error"]
    r = http.post("/v1/buckets/nope", json={"action": "set-bprops", "props": {"copies": 2}})
    assert r.status_code == 404


def test_late_target_serves_existing_buckets(map_cluster: MapCluster) -> None:
    c = map_cluster
    c.add_target("t0")
    c.start_gateway()
    http = c.client()
    http.post("/v1/buckets/early", json={"action": "create-bck"})
    http.put("/v1/objects/early/a", content=b"a")
    c.add_target("t1")  # joins later: never saw the create
    c.start_gateway(["t0", "t1"])
    http = c.client()
    wait_for(lambda: http.get("/v1/cluster").json()["rebalance"]["state"] == "idle", 30)
    for i in range(10):
        assert http.put(f"/v1/objects/early/n{i}", content=b"n").status_code == 200
    assert c.objects_on("t1", "early")  # it stores objects of the bucket it never saw made
    assert len(http.get("/v1/buckets/early").json()["objects"]) == 11
    assert http.delete("/v1/buckets/early").status_code == 200
    assert http.get("/v1/buckets").json() == {"buckets": []}
    assert http.get("/v1/objects/early/a").status_code == 404


def test_a_target_lost_before_handing_over_is_reported_not_hidden(
    map_cluster: MapCluster,
) -> None:
    c = map_cluster
    three(c)
    http = c.client()
    http.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for i in range(30):
        assert http.put(f"/v1/objects/bkt/o{i}", content=b"x%d" % i).status_code == 200
    on_t2 = [f"o{i}" for i in range(30) if c.cmap.get().owners("bkt", f"o{i}") == ["t2"]]
    assert on_t2
    c.stop_target("t2")  # its node is lost: it never hands its objects over
    c.start_gateway(["t0", "t1"])  # scaled down to 2
    http = c.client()
    wait_for(lambda: http.get("/v1/cluster").json()["rebalance"]["waiting_for"] == ["t2"], 30)
    time.sleep(2)  # and it stays so: the rebalance does not end silently
    view = http.get("/v1/cluster").json()
    assert view["rebalance"]["state"] == "running" and view["rebalance"]["waiting_for"] == ["t2"]
    r = http.get(f"/v1/objects/bkt/{on_t2[0]}")  # may be on t2: a 503 naming it, not a 404
    assert r.status_code == 503 and r.json()["target"] == "t2", r.text
    kept = next(f"o{i}" for i in range(30) if f"o{i}" not in on_t2)
    assert http.get(f"/v1/objects/bkt/{kept}").content == b"x" + kept[1:].encode()


def test_create_bck_applies_aistore_value_props_or_refuses_them(map_cluster: MapCluster) -> None:
    """create-bck ignored AIStore's ``value`` (its ActionMsg's props): a bucket asked
    for with 2 copies silently got 1. Now a mirror is applied, anything else is a 400
    naming the field, and nothing is created."""
    three(map_cluster)
    http = map_cluster.client()
    mirror = {"mirror": {"enabled": True, "copies": 2}}
    r = http.post("/v1/buckets/bkt-m", json={"action": "create-bck", "name": "", "value": mirror})
    assert r.status_code == 200 and r.json()["props"]["copies"] == 2, r.text
    assert http.get("/v1/cluster").json()["buckets"]["bkt-m"]["copies"] == 2
    plain = {"action": "create-bck", "name": "", "value": None}  # the aistore SDK's create
    assert http.post("/v1/buckets/bkt-p", json=plain).json()["props"]["copies"] == 1

    odd = {"action": "create-bck", "value": {"versioning": {"enabled": True}}}
    r = http.post("/v1/buckets/bkt-v", json=odd)
    assert r.status_code == 400 and "value.versioning" in r.json()["error"], r.text
    both = {"action": "create-bck", "value": mirror, "props": {"copies": 3}}
    r = http.post("/v1/buckets/bkt-v", json=both)
    assert r.status_code == 400 and "not both" in r.json()["error"], r.text
    r = http.post("/v1/buckets/bkt-v", json={"action": "create-bck", "value": [1]})
    assert r.status_code == 400 and "'value'" in r.json()["error"], r.text
    assert "bkt-v" not in http.get("/v1/cluster").json()["buckets"]
