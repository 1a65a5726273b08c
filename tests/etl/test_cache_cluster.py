"""The output cache through ``sluice up``: the SDK's ``init_code(cache=True)``, the
gateway's redirect, the ETL's details, and an offline transform that reads the cache."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl_runtime import Client
from tests.e2e.local import running_cluster


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SLUICE_ETL_CACHE_BYTES", "32MiB")  # passed on to the targets by sluice up
    try:
        with running_cluster(tmp_path_factory.mktemp("cache-cluster"), targets=1) as url:
            with Client(url) as c:
                yield c
    finally:
        mp.undo()


def _cached(client: Client, etl: str) -> dict[str, int]:
    stats = client.etl(etl).details().stats
    return {k: stats[k] for k in ("objects", "cache_hits", "cache_misses", "cache_bytes")}


def test_epoch_two_and_an_offline_transform_run_nothing(client: Client, tmp_path: Path) -> None:
    suffix = b"!"

    def shout(data: bytes) -> bytes:
        return data.upper() + suffix

    etl = client.etl("cached-shout")
    details = etl.init_code(transform=shout, cache=True, timeout=120)
    assert details.spec["cache"] is True
    bucket = client.bucket("cache-src").create()
    names = [f"obj-{i}.txt" for i in range(5)]
    for name in names:
        bucket.object(name).put_content(name.encode())

    def epoch() -> list[bytes]:
        return [bucket.object(n).get_bytes(etl_name="cached-shout") for n in names]

    first = epoch()
    assert first == [n.upper().encode() + b"!" for n in names]
    kept = sum(len(b) for b in first)
    deadline = time.monotonic() + 10
    while _cached(client, "cached-shout")["cache_bytes"] != kept:  # kept in the background
        assert time.monotonic() < deadline, _cached(client, "cached-shout")
        time.sleep(0.05)
    assert _cached(client, "cached-shout") == {
        "objects": 5,
        "cache_hits": 0,
        "cache_misses": 5,
        "cache_bytes": kept,
    }
    assert epoch() == first
    assert _cached(client, "cached-shout")["objects"] == 5  # epoch 2 ran nothing
    assert _cached(client, "cached-shout")["cache_hits"] == 5

    # An offline transform goes through the same target path: hits, no transform.
    job = bucket.transform("cached-shout", to_bucket="cache-dst")
    job.wait(timeout=120)
    out = client.bucket("cache-dst")
    assert [out.object(n).get_bytes() for n in names] == first
    counts = _cached(client, "cached-shout")
    assert counts["objects"] == 5 and counts["cache_hits"] == 10

    # New code under the same name: a new spec, so every object is a miss again.
    etl.init_code(transform=lambda data: data[::-1], cache=True, timeout=120)
    assert [bucket.object(n).get_bytes(etl_name="cached-shout") for n in names[:2]] == [
        n.encode()[::-1] for n in names[:2]
    ]
    counts = _cached(client, "cached-shout")
    assert counts["cache_misses"] == 7 and counts["cache_hits"] == 10
