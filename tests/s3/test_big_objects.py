"""S3 GETs of objects big enough to be spliced owner → client on the gateway
(``gateway/s3/spliced.py``): bytes, ranges, validators, pooled connections,
and an owner that dies mid-body (the client sees a short read, never data)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from etl_runtime.gateway.s3.spliced import SPLICE_MIN
from etl_runtime.local import LocalCluster
from tests.s3.conftest import make_key, s3_client

BIG = 3 * (1 << 20) + 12345  # not a multiple of any buffer or pipe size


def code(e: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = e.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


def test_big_objects_whole_ranges_validators_and_pooled_reuse(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-big")
    objs = {f"big{i}": os.urandom(BIG + i) for i in range(3)}
    objs["small"] = os.urandom(SPLICE_MIN // 2)  # read whole: the same pooled connections
    for k, v in objs.items():
        s3.put_object(Bucket="s3-big", Key=k, Body=v, ContentType="application/x-tar")
    for _ in range(3):  # connections go back to the pool after each answer, and are reused
        for k, v in objs.items():
            got = s3.get_object(Bucket="s3-big", Key=k)
            assert got["ContentLength"] == len(v)
            assert got["Body"].read() == v
            assert got["ContentType"] == "application/x-tar"
    data = objs["big0"]
    md5 = hashlib.md5(data).hexdigest()
    start, end = 1000, 1000 + 2 * SPLICE_MIN + 7  # a spliced range
    part = s3.get_object(Bucket="s3-big", Key="big0", Range=f"bytes={start}-{end}")
    assert part["Body"].read() == data[start : end + 1]
    assert part["ContentRange"] == f"bytes {start}-{end}/{len(data)}"
    assert s3.get_object(Bucket="s3-big", Key="big0", IfMatch=f'"{md5}"')["Body"].read() == data
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-big", Key="big0", IfNoneMatch=f'"{md5}"')
    assert code(e)[1] == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-big", Key="big0", IfMatch='"0000"')
    assert code(e) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket="s3-big", Key="big1")["Body"].read() == objs["big1"]

    def read(k: str) -> bool:
        return s3.get_object(Bucket="s3-big", Key=k)["Body"].read() == objs[k]

    with ThreadPoolExecutor(8) as pool:  # concurrent answers on separate pooled connections
        assert all(pool.map(read, list(objs) * 6))


def target_pid(data: Path, ep: str, url: str) -> int:
    """The pid of the target serving at ``url`` (its id from the cluster map, its pid
    from ``sluice up``'s run file)."""
    targets = httpx.get(f"{ep}/v1/cluster", timeout=30).json()["targets"]
    tid = next(t["id"] for t in targets if t["url"].rstrip("/") == url)
    kids = json.loads((data / "run" / "up.json").read_text())["children"]
    return next(int(k["pid"]) for k in kids if k["name"] == f"target {tid}")


@pytest.mark.timeout(180)
def test_owner_killed_mid_body_is_a_short_read_never_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    size = 96 << 20  # far more than the socket buffers and the pipe hold
    with LocalCluster(data, targets=2) as cluster:
        ep = cluster.endpoint.rstrip("/")
        s3 = s3_client(ep, make_key(ep, "write"))
        s3.create_bucket(Bucket="dies")
        body = os.urandom(1 << 20) * (size >> 20)
        s3.put_object(Bucket="dies", Key="huge", Body=body)
        owner = httpx.get(f"{ep}/v1/objects/dies/huge", follow_redirects=False, timeout=30)
        assert owner.status_code == 307, owner.text
        pid = target_pid(data, ep, owner.headers["location"].split("/v1/")[0])
        got = s3.get_object(Bucket="dies", Key="huge")
        assert got["ContentLength"] == size
        stream = got["Body"]
        first = stream.read(1 << 20)
        assert first == body[: 1 << 20]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception) as e:  # botocore: IncompleteRead/ResponseStreamingError
            while chunk := stream.read(1 << 20):
                first += chunk
        assert len(first) < size
        assert "ncomplete" in repr(e.value) or "Connection" in repr(e.value), repr(e.value)
