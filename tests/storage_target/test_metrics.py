"""A target's ``GET /metrics`` after real traffic: requests, bytes, latency, disk."""

from __future__ import annotations

import os

from tests.prom import scrape
from tests.servers import serve_in_thread
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import record, transformer_app

OBJECT_ROUTE = "/v1/objects/{bucket}/{name:path}"
KIB16 = 16 << 10


def test_gets_and_puts_are_counted_by_route_template_status_and_bytes(
    target: RunningTarget,
) -> None:
    c = target.client
    assert c.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
    data = os.urandom(KIB16)
    before = scrape(target.url)

    assert c.put("/v1/objects/bkt/deep/dir/x.bin", content=data).status_code == 200
    for _ in range(7):
        assert c.get("/v1/objects/bkt/deep/dir/x.bin").content == data
    assert c.get("/v1/objects/bkt/missing.bin").status_code == 404
    after = scrape(target.url)

    def rose(name: str, **labels: str) -> float:
        return after.value(name, role="target", **labels) - before.value(
            name, role="target", **labels
        )

    get = {"route": OBJECT_ROUTE, "op": "get"}
    assert rose("sluice_http_requests_total", status="200", **get) == 7
    assert rose("sluice_http_requests_total", status="404", **get) == 1
    assert rose("sluice_http_requests_total", route=OBJECT_ROUTE, op="put", status="200") == 1
    assert rose("sluice_http_sent_bytes_total", **get) >= 7 * KIB16
    assert rose("sluice_http_received_bytes_total", route=OBJECT_ROUTE, op="put") == KIB16
    assert rose("sluice_http_request_duration_seconds_count", **get) == 8
    assert rose("sluice_http_request_duration_seconds_count", route=OBJECT_ROUTE, op="put") == 1
    # Templates only: an object's name never becomes a label value.
    assert not any("x.bin" in v for s in after.samples for v in s.labels.values())


def test_an_etl_get_is_timed_apart_from_plain_gets(target: RunningTarget) -> None:
    c = target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    c.put("/v1/objects/bkt/x", content=b"abc" * 1000)
    with serve_in_thread(transformer_app("rev")) as url:
        target.registry.put(record("rev", {"t0": url}))
        for _ in range(3):
            r = c.get("/v1/objects/bkt/x", params={"etl_name": "rev"})
            assert r.content == (b"abc" * 1000)[::-1]
    s = scrape(target.url)
    etl_get = {"route": OBJECT_ROUTE, "op": "etl_get"}
    assert s.value("sluice_http_request_duration_seconds_count", **etl_get) == 3
    assert s.value("sluice_http_requests_total", status="200", **etl_get) == 3
    assert s.value("sluice_http_sent_bytes_total", **etl_get) == 3 * 3000
    assert s.value("sluice_http_request_duration_seconds_count", route=OBJECT_ROUTE, op="get") == 0


def test_disk_and_stored_objects_are_reported(target: RunningTarget) -> None:
    c = target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for i in range(5):
        c.put(f"/v1/objects/bkt/o{i}", content=b"z" * 1000)
    s = scrape(target.url)
    usage = os.statvfs(target.data_dir)
    assert s.value("sluice_target_objects", target="t0") == 5
    assert s.value("sluice_target_stored_bytes", target="t0") == 5000
    assert s.value("sluice_target_disk_free_bytes", target="t0") > 0
    assert s.value("sluice_target_disk_used_bytes", target="t0") > 0
    assert s.value("sluice_target_disk_total_bytes", target="t0") == usage.f_blocks * usage.f_frsize
