"""Hedged reads: a read already sent to a paused target is served by a copy.

A real ``sluice up`` with 3 targets and a bucket with ``copies=2``. The target
the gateway redirects reads of an object to is frozen (SIGSTOP, as a long GC
pause or a node hiccup) just before the reads: the SDK's reads, each already
on its way to the frozen target, are answered by the copy while the target
is still frozen (``sdk/hedge.py``); without hedging they waited for it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from etl_runtime import Client
from etl_runtime.local import LocalCluster
from etl_runtime.sdk import hedge

pytestmark = pytest.mark.timeout(180)
FROZEN_FOR = 40.0  # far longer than a hedged read takes


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("hedge") / "data", targets=3) as c:
        yield c


def target_pid(data_dir: Path, target: str) -> int:
    kids = json.loads((data_dir / "run" / "up.json").read_text())["children"]
    return next(int(k["pid"]) for k in kids if k["name"] == f"target {target}")


def redirected_to(http: httpx.Client, bucket: str, name: str) -> str:
    """The id of the target the gateway sends a read of ``bucket/name`` to."""
    r = http.get(f"/v1/objects/{bucket}/{name}", follow_redirects=False)
    assert r.status_code == 307, r.text
    netloc = urllib.parse.urlsplit(r.headers["location"]).netloc
    targets = http.get("/v1/cluster").json()["targets"]
    return next(t["id"] for t in targets if urllib.parse.urlsplit(t["url"]).netloc == netloc)


def test_reads_sent_to_a_frozen_target_are_served_by_the_copy(up: LocalCluster) -> None:
    http = httpx.Client(base_url=up.endpoint, timeout=30)
    r = http.post("/v1/buckets/two", json={"action": "create-bck", "props": {"copies": 2}})
    assert r.status_code == 200, r.text
    objects = {f"o{i}.bin": os.urandom(50_000 + i) for i in range(6)}
    for name, data in objects.items():
        assert http.put(f"/v1/objects/two/{name}", content=data).status_code == 200
    first = redirected_to(http, "two", "o0.bin")
    on_first = [n for n in objects if redirected_to(http, "two", n) == first]
    sdk = Client(up.endpoint, timeout=120)
    assert sdk.hedge_after == hedge.HEDGE_AFTER
    bucket = sdk.bucket("two")
    pid = target_pid(up.data_dir, first)
    resumed = threading.Event()

    def resume() -> None:
        resumed.set()
        os.kill(pid, signal.SIGCONT)

    def read(name: str) -> bytes:
        return bucket.object(name).get_bytes()

    timer = threading.Timer(FROZEN_FOR, resume)
    os.kill(pid, signal.SIGSTOP)
    timer.start()
    try:
        with ThreadPoolExecutor(len(on_first)) as pool:  # readers caught in the same second
            got = dict(zip(on_first, pool.map(read, on_first), strict=True))
        served_while_frozen = not resumed.is_set()
    finally:
        timer.cancel()
        os.kill(pid, signal.SIGCONT)
    assert got == {n: objects[n] for n in on_first}
    assert served_while_frozen, "the reads waited for the frozen target"


def test_the_hedge_setting() -> None:
    assert hedge.hedge_after_from_env("") == 1.0
    assert hedge.hedge_after_from_env("0.25") == 0.25
    assert hedge.hedge_after_from_env("off") is None and hedge.hedge_after_from_env("0") is None
    with pytest.raises(ValueError, match="SLUICE_HEDGE_AFTER"):
        hedge.hedge_after_from_env("soon")
