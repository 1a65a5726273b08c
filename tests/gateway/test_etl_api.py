"""The /v1/etl API and transformed reads through gateway -> target -> transformer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import TOKEN, Cluster
from tests.servers import serve_in_thread
from tests.storage_target.fakes import SOURCE, transformer_app

SPEC = {"mode": "object", "code": {"source": SOURCE}}


@pytest.fixture
def with_transformers(cluster: Cluster) -> Iterator[Cluster]:
    with (
        serve_in_thread(transformer_app("rev")) as t0,
        serve_in_thread(transformer_app("rev")) as t1,
    ):
        cluster.backend.endpoints = {"t0": t0, "t1": t1}
        yield cluster


def test_init_validates_spec(cluster: Cluster) -> None:
    c = cluster.client
    r = c.put("/v1/etl", json={"name": "rev", "spec": {"mode": "bogus", "code": {"source": "x"}}})
    assert r.status_code == 400 and r.json()["kind"] == "InvalidSpec"
    assert "spec.mode" in r.json()["error"]
    r = c.put("/v1/etl", json={"name": "rev", "spec": {"code": {}}})
    assert r.status_code == 400 and "exactly one of" in r.json()["error"]
    r = c.put("/v1/etl", json={"name": "Bad_Name", "spec": SPEC})
    assert r.status_code == 400 and "invalid ETL name" in r.json()["error"]
    r = c.put("/v1/etl", json={"name": "s3-keys", "spec": SPEC})  # the S3 keys' file
    assert r.status_code == 400 and "'s3-keys' is reserved" in r.json()["error"], r.text
    assert c.put("/v1/etl", json=["x"]).status_code == 400
    assert c.put("/v1/etl", json={"name": "rev"}).status_code == 400
    assert c.get("/v1/etl").json() == {"etls": []}


def test_etl_lifecycle_and_transformed_reads(with_transformers: Cluster) -> None:
    cluster = with_transformers
    c = cluster.client
    r = c.put("/v1/etl", json={"name": "rev", "spec": SPEC})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["name"] == "rev" and d["phase"] == "Initializing" and d["mode"] == "object"
    assert d["ready"] == 2 and d["total"] == 2
    assert SOURCE not in r.text and d["spec"]["code"]["source"].startswith("<")
    assert c.get("/v1/etl").json() == {
        "etls": [{"name": "rev", "phase": "Initializing", "mode": "object", "ready": 2, "total": 2}]
    }

    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for i in range(6):
        c.put(f"/v1/objects/bkt/o{i}", content=f"object-{i}".encode())
    for i in range(6):
        r = c.get(f"/v1/objects/bkt/o{i}", params={"etl_name": "rev"})
        assert r.status_code == 200 and r.content == f"object-{i}".encode()[::-1]

    d = c.get("/v1/etl/rev").json()
    # each fake transformer reports errors=2, bytes_out=20 and one last error
    assert d["stats"]["objects"] == 6 and d["stats"]["errors"] == 4
    assert d["stats"]["bytes_out"] == 40
    assert sorted(e["target"] for e in d["last_errors"]) == ["t0", "t1"]
    assert {t["target"] for t in d["transformers"]} == {"t0", "t1"}

    logs = c.get("/v1/etl/rev/logs", params={"tail": 3}).json()
    assert logs == {"logs": {"t0": "rev log line (tail=3)\n", "t1": "rev log line (tail=3)\n"}}

    r = c.post("/v1/etl/rev/stop")
    assert r.status_code == 200 and r.json()["phase"] == "Stopped"
    r = c.get("/v1/objects/bkt/o1", params={"etl_name": "rev"})
    assert r.status_code == 409 and "POST /v1/etl/rev/start" in r.json()["error"]
    assert c.post("/v1/etl/rev/start").json()["phase"] == "Running"
    assert c.get("/v1/objects/bkt/o1", params={"etl_name": "rev"}).content == b"1-tcejbo"

    assert c.delete("/v1/etl/rev").json() == {"name": "rev", "deleted": True}
    r = c.get("/v1/objects/bkt/o1", params={"etl_name": "rev"})
    assert r.status_code == 404 and r.json()["kind"] == "EtlNotFound"
    for call in (
        c.get("/v1/etl/rev"),
        c.delete("/v1/etl/rev"),
        c.post("/v1/etl/rev/stop"),
        c.post("/v1/etl/rev/start"),
        c.get("/v1/etl/rev/logs"),
    ):
        assert call.status_code == 404 and call.json()["etl"] == "rev"


def test_logs_of_a_target_without_transformer(cluster: Cluster) -> None:
    cluster.backend.endpoints = {}
    cluster.client.put("/v1/etl", json={"name": "idle", "spec": SPEC})
    logs = cluster.client.get("/v1/etl/idle/logs").json()["logs"]
    assert set(logs) == {"t0", "t1"} and all("unavailable" in v for v in logs.values())
    d = cluster.client.get("/v1/etl/idle").json()
    assert d["stats"]["objects"] == 0 and d["ready"] == 0


def test_etl_mutations_need_token(secured: Cluster) -> None:
    url = secured.url
    assert httpx.put(f"{url}/v1/etl", json={"name": "rev", "spec": SPEC}).status_code == 401
    assert httpx.get(f"{url}/v1/etl").json() == {"etls": []}
    assert secured.client.put("/v1/etl", json={"name": "rev", "spec": SPEC}).status_code == 200
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{url}/v1/etl/rev/stop", headers=wrong).status_code == 401
    assert httpx.delete(f"{url}/v1/etl/rev").status_code == 401
    assert httpx.get(f"{url}/v1/etl/rev").json()["phase"] == "Initializing"
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{url}/v1/etl/rev/stop", headers=ok).json()["phase"] == "Stopped"


def test_unknown_query_parameters_on_etl_routes_are_refused(cluster: Cluster) -> None:
    for method, path in (
        ("GET", "/v1/etl?bogus=1"),
        ("GET", "/v1/etl/x?etl_pipeline=a,b"),
        ("POST", "/v1/etl/x/stop?now=1"),
        ("GET", "/v1/etl/x/logs?tail=5&grep=err"),
    ):
        r = cluster.client.request(method, path)
        assert r.status_code == 400, (method, path, r.text)
        assert r.json()["kind"] == "InvalidRequest"
        bad = path.split("?")[1].split("&")[-1].split("=")[0]
        assert bad in r.json()["error"]


def test_details_wait_answers_when_the_etl_leaves_initializing(cluster: Cluster) -> None:
    """``GET /v1/etl/{n}?wait=S`` (what the SDK's init_code sends) holds the answer until
    the phase changes, so a client sees Running without polling."""
    import dataclasses
    import threading

    c = cluster.client
    assert c.put("/v1/etl", json={"name": "rev", "spec": SPEC}).json()["phase"] == "Initializing"
    assert c.get("/v1/etl/rev", params={"wait": "0.2"}).json()["phase"] == "Initializing"

    registry = cluster.backend.registry
    record = registry.get("rev")
    assert record is not None
    running = threading.Timer(0.5, registry.put, [dataclasses.replace(record, phase="Running")])
    running.start()
    try:
        r = c.get("/v1/etl/rev", params={"wait": "30"}, timeout=60)
    finally:
        running.join()
    assert r.status_code == 200 and r.json()["phase"] == "Running"

    for bad in ("-1", "31", "soon", "nan"):
        r = c.get("/v1/etl/rev", params={"wait": bad})
        assert r.status_code == 400 and "wait=" in r.json()["error"], bad
        assert r.json()["etl"] == "rev"
    assert c.get("/v1/etl/ghost", params={"wait": "1"}).status_code == 404
