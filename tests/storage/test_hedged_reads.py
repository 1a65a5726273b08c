"""Hedged reads: a read already sent to a paused target is served by a copy.

A real ``sluice up`` with 3 targets and a bucket with ``copies=2``. The target
the gateway redirects reads of an object to is frozen (SIGSTOP, as a long GC
pause or a node hiccup) just before the reads: the SDK's reads, each already
on its way to the frozen target, are answered by the copy while the target
is still frozen (``sdk/hedge.py``); without hedging they waited for it. A
boto3 GetObject the gateway relays to the frozen owner is answered by the copy
(``gateway/s3/hedge.py``).
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

import boto3
import httpx
import pytest
from botocore.config import Config

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


def sent_bytes(http: httpx.Client, target: str) -> float:
    """What that target's server sent in bodies so far (``sluice_http_sent_bytes_total``
    and ``sluice_sendfile_bytes_total`` on its ``/metrics``)."""
    urls = {t["id"]: t["url"] for t in http.get("/v1/cluster").json()["targets"]}
    text = httpx.get(f"{urls[target].rstrip('/')}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("sluice_http_sent_bytes_total{", "sluice_sendfile_bytes_total{"))
    )


def test_an_s3_get_relayed_to_a_frozen_owner_is_answered_by_the_copy(up: LocalCluster) -> None:
    """The gateway relays a GetObject from the owner; one that is frozen after the
    relay chose it is raced against the copy once ``SLUICE_HEDGE_AFTER`` passed: boto3
    gets the right bytes, sent by the copy's target, while the owner is still frozen."""
    http = httpx.Client(base_url=up.endpoint, timeout=30)
    r = http.post("/v1/buckets/s3-two", json={"action": "create-bck", "props": {"copies": 2}})
    assert r.status_code == 200, r.text
    data = os.urandom(300_000)
    assert http.put("/v1/objects/s3-two/obj.bin", content=data).status_code == 200
    owner = redirected_to(http, "s3-two", "obj.bin")
    holders = {p.parts[-4] for p in up.data_dir.glob("targets/*/buckets/s3-two/obj.bin")}
    assert owner in holders and len(holders) == 2, holders
    (copy,) = holders - {owner}
    key = http.post("/v1/s3/keys", json={"permission": "read"}).json()
    s3 = boto3.client(
        "s3",
        endpoint_url=f"{up.endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"],
        region_name="us-east-1",
        config=Config(
            retries={"max_attempts": 1}, read_timeout=120, s3={"addressing_style": "path"}
        ),
    )
    assert s3.get_object(Bucket="s3-two", Key="obj.bin")["Body"].read() == data  # warm
    from_copy = sent_bytes(http, copy)
    pid = target_pid(up.data_dir, owner)
    resumed = threading.Event()

    def resume() -> None:
        resumed.set()
        os.kill(pid, signal.SIGCONT)

    timer = threading.Timer(FROZEN_FOR, resume)
    os.kill(pid, signal.SIGSTOP)  # before the gateway's probes find it late (~0.5 s)
    timer.start()
    try:
        got = s3.get_object(Bucket="s3-two", Key="obj.bin")["Body"].read()
        served_while_frozen = not resumed.is_set()
    finally:
        timer.cancel()
        os.kill(pid, signal.SIGCONT)
    assert got == data
    assert served_while_frozen, "the relay waited for the frozen owner"
    assert sent_bytes(http, copy) - from_copy >= len(data), "not sent by the copy"


def test_the_hedge_setting() -> None:
    assert hedge.hedge_after_from_env("") == 1.0
    assert hedge.hedge_after_from_env("0.25") == 0.25
    assert hedge.hedge_after_from_env("off") is None and hedge.hedge_after_from_env("0") is None
    with pytest.raises(ValueError, match="SLUICE_HEDGE_AFTER"):
        hedge.hedge_after_from_env("soon")
