"""A transformer's ``GET /metrics``: its per-ETL counters and its requests."""

from __future__ import annotations

import httpx
import pytest

from tests.prom import Scrape, scrape
from tests.servers import SessionServers
from tests.webserver.conftest import loop_transformer, text_shard

HPUSH_ROUTE = "/{bucket}/{object:path}"


def rose(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def test_object_etl_counts_objects_errors_bytes_and_seconds(
    session_servers: SessionServers,
) -> None:
    url = loop_transformer(session_servers, "object", "asyncio")
    etl = {"etl": "object-asyncio"}
    before = scrape(url)
    body = b"metrics " * 4096
    for i in range(5):
        r = httpx.put(f"{url}/b/o{i}", content=body, timeout=30)
        assert r.status_code == 200 and r.content == body.upper()
    with pytest.raises(httpx.RemoteProtocolError):  # the function fails mid-stream
        httpx.put(f"{url}/b/broken", params={"etl_args": "failmid"}, timeout=30)
    after = scrape(url)

    assert rose(before, after, "sluice_etl_objects_total", **etl) == 5
    assert rose(before, after, "sluice_etl_errors_total", **etl) == 1
    assert rose(before, after, "sluice_etl_received_bytes_total", **etl) == 5 * len(body)
    assert rose(before, after, "sluice_etl_sent_bytes_total", **etl) >= 5 * len(body)
    assert rose(before, after, "sluice_etl_transform_seconds_total", **etl) > 0
    hpush = {"role": "transformer", "route": HPUSH_ROUTE, "op": "put"}
    assert rose(before, after, "sluice_http_requests_total", status="200", **hpush) == 6
    assert rose(before, after, "sluice_http_received_bytes_total", **hpush) == 5 * len(body)
    assert rose(before, after, "sluice_http_sent_bytes_total", **hpush) >= 5 * len(body)


def test_wds_etl_counts_samples_per_shard(session_servers: SessionServers) -> None:
    url = loop_transformer(session_servers, "wds", "asyncio")
    etl = {"etl": "wds-asyncio"}
    before = scrape(url)
    r = httpx.put(f"{url}/b/shard.tar", content=text_shard([f"k{i}" for i in range(9)]))
    assert r.status_code == 200
    after = scrape(url)
    assert rose(before, after, "sluice_etl_objects_total", **etl) == 1
    assert rose(before, after, "sluice_etl_samples_total", **etl) == 9
    assert rose(before, after, "sluice_etl_skipped_total", **etl) == 0
    assert rose(before, after, "sluice_etl_transform_seconds_total", **etl) > 0
