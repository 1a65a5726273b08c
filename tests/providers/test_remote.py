"""Remote (``aws``) buckets end to end: a real MinIO behind a real ``sluice up``.

Each test seeds its own MinIO bucket with boto3 (a client the targets never
use), then reads and writes through Sluice with httpx, the SDK and webdataset.
Backend fetches are counted by the targets' own ``/metrics``.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import webdataset as wds

from etl_runtime import Client
from tests.providers.conftest import CACHE_BYTES, metric, per_target
from tests.providers.minio import MinioServer

FETCHES = "sluice_remote_backend_fetches_total"
SENDFILE = "sluice_sendfile_bytes_total"


def eventually(check: Callable[[], Any], want: Any, timeout: float = 15.0) -> None:
    """A cold GET's answer ends with its last byte and the cache file is
    published just after it, so a listing right after may not say ``cached``
    yet: poll briefly for what a user sees a moment later."""
    deadline = time.monotonic() + timeout
    while (got := check()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want


def new_bucket(minio: MinioServer, objects: dict[str, bytes]) -> str:
    name = f"rb-{uuid.uuid4().hex[:10]}"
    s3 = minio.client()
    s3.create_bucket(Bucket=name)
    for key, data in objects.items():
        s3.put_object(Bucket=name, Key=key, Body=data)
    return name


def get(endpoint: str, bucket: str, name: str, **params: str) -> httpx.Response:
    return httpx.get(
        f"{endpoint}/v1/objects/{bucket}/{name}",
        params={"provider": "aws", **params},
        follow_redirects=True,
        timeout=60,
    )


def test_cold_get_streams_from_the_backend_then_warm_get_serves_the_cache(
    endpoint: str, minio: MinioServer
) -> None:
    data, small = os.urandom(3 << 20), os.urandom(1 << 20)
    bucket = new_bucket(
        minio, {"dir/shard.bin": data, "dir/ranged.bin": data, "dir/small.bin": small}
    )
    before = metric(endpoint, FETCHES)

    # HEAD of a cold object asks the backend; a ranged cold GET is the right slice.
    url = f"{endpoint}/v1/objects/{bucket}/dir/ranged.bin"
    head = httpx.head(url, params={"provider": "aws"}, follow_redirects=True)
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    ranged = httpx.get(url, headers={"Range": "bytes=100-199"}, follow_redirects=True)
    assert ranged.status_code == 206 and ranged.content == data[100:200]
    before += 1

    # The cold bytes go from the cache file to the socket by sendfile as they arrive,
    # for a small object (fetched in one piece) and a streamed one alike.
    sent = metric(endpoint, SENDFILE)
    cold = get(endpoint, bucket, "dir/shard.bin")
    assert cold.status_code == 200 and cold.content == data
    assert cold.headers["x-sluice-cache"] == "miss"
    assert cold.headers["content-length"] == str(len(data))
    cold_small = get(endpoint, bucket, "dir/small.bin")
    assert cold_small.status_code == 200 and cold_small.content == small
    assert cold_small.headers["x-sluice-cache"] == "miss"
    assert metric(endpoint, SENDFILE) >= sent + len(data) + len(small)
    before += 1
    etag = minio.client().head_object(Bucket=bucket, Key="dir/shard.bin")["ETag"]
    assert cold.headers["etag"] == etag

    warm = get(endpoint, bucket, "dir/shard.bin")
    assert warm.status_code == 200 and warm.content == data
    assert "x-sluice-cache" not in warm.headers and warm.headers["etag"] == etag
    assert metric(endpoint, FETCHES) == before + 1  # the second GET never reached MinIO

    # A missing object is a 404 naming the bucket, the object and the backend.
    missing = get(endpoint, bucket, "dir/nope.bin")
    assert missing.status_code == 404
    assert missing.json()["object"] == "dir/nope.bin" and missing.json()["bucket"] == bucket
    assert minio.endpoint in missing.json()["error"]


def test_ten_concurrent_cold_gets_make_one_backend_fetch(endpoint: str, minio: MinioServer) -> None:
    data = os.urandom(6 << 20)  # within the targets' cache cap (conftest.CACHE_BYTES)
    bucket = new_bucket(minio, {"big.bin": data})
    before = metric(endpoint, FETCHES)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: get(endpoint, bucket, "big.bin"), range(10)))
    assert [r.status_code for r in answers] == [200] * 10
    assert all(r.content == data for r in answers)
    assert metric(endpoint, FETCHES) == before + 1


def test_object_and_wds_etl_on_cold_objects(endpoint: str, minio: MinioServer) -> None:
    shard = io.BytesIO()
    with wds.TarWriter(shard) as sink:
        for i in range(20):
            sink.write({"__key__": f"s{i:03d}", "txt": f"sample {i}", "cls": i})
    objects = {"hello.txt": b"hello remote", "piped.txt": b"piped remote"}
    bucket = new_bucket(minio, {**objects, "shard-000.tar": shard.getvalue()})
    with Client(endpoint) as client:
        client.etl("rm-upper").init_code(transform=lambda data: data.upper())

        def relabel(sample: dict) -> dict:
            sample["txt"] = sample["txt"].upper()
            sample["cls"] = int(sample["cls"]) * 10
            return sample

        client.etl("rm-wds").init_code(transform=relabel, mode="wds", decode=None)
        client.etl("rm-reverse").init_code(transform=lambda data: data[::-1])
        remote = client.bucket(bucket, provider="aws")
        assert remote.object("hello.txt").get_bytes(etl_name="rm-upper") == b"HELLO REMOTE"
        # A pipeline on a cold object: upper, then reverse.
        piped = get(endpoint, bucket, "piped.txt", etl_name="rm-upper", etl_pipeline="rm-reverse")
        assert piped.status_code == 200 and piped.content == b"ETOMER DEPIP", piped.text

        urls = remote.object_urls("shard-{000..000}.tar", etl_name="rm-wds")
        samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert [s["__key__"] for s in samples] == [f"s{i:03d}" for i in range(20)]
    assert samples[7]["txt"] == "SAMPLE 7" and samples[7]["cls"] == 70


def test_put_writes_through_and_delete_deletes_both(endpoint: str, minio: MinioServer) -> None:
    bucket = new_bucket(minio, {})
    s3 = minio.client()
    with Client(endpoint) as client:
        obj = client.bucket(bucket, provider="aws").object("new/obj.bin")
        obj.put_content(b"written through")
        # Acknowledged means on the backend already.
        assert s3.get_object(Bucket=bucket, Key="new/obj.bin")["Body"].read() == b"written through"
        assert obj.get_bytes() == b"written through"
        obj.delete()
        # A big PUT goes up as a multipart upload (5 MiB parts): the backend's ETag
        # says so, and the cached copy carries it.
        big = os.urandom(12 << 20)
        client.bucket(bucket, provider="aws").object("new/big.bin").put_content(big)
        head = s3.head_object(Bucket=bucket, Key="new/big.bin")
        assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == len(big)
        warm = get(endpoint, bucket, "new/big.bin")
        assert warm.content == big and warm.headers["etag"] == head["ETag"]
        client.bucket(bucket, provider="aws").object("new/big.bin").delete()
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert get(endpoint, bucket, "new/obj.bin").status_code == 404


def test_listing_is_the_backends_paginated_with_cached_flags(
    endpoint: str, minio: MinioServer
) -> None:
    names = [f"p/{i}.bin" for i in range(5)] + ["q.bin"]
    bucket = new_bucket(minio, {n: n.encode() for n in names})
    assert get(endpoint, bucket, "p/3.bin").status_code == 200

    def listing() -> list[dict]:
        seen: list[dict] = []
        start_after = ""
        while True:
            r = httpx.get(
                f"{endpoint}/v1/buckets/{bucket}",
                params={"provider": "aws", "prefix": "p/", "limit": 2, "start_after": start_after},
            )
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["objects"]) <= 2
            seen += page["objects"]
            if not page["next"]:
                return seen
            start_after = page["next"]

    seen = listing()
    assert [o["name"] for o in seen] == names[:5]
    assert all(o["size"] == len(o["name"]) for o in seen)
    eventually(lambda: {o["name"] for o in listing() if o["cached"]}, {"p/3.bin"})


def test_bad_credentials_are_a_401_with_the_reason(endpoint: str, minio: MinioServer) -> None:
    bucket = new_bucket(minio, {"o.txt": b"x", "other.txt": b"y"})
    url = f"{endpoint}/v1/buckets/{bucket}"
    # Creating with a secret whose keys MinIO rejects: refused, nothing added.
    r = httpx.post(
        url,
        params={"provider": "aws"},
        json={"action": "create-bck", "props": {"secret": "wrong"}},
    )
    assert r.status_code == 401, r.text
    assert bucket in r.json()["error"] and "secret 'wrong'" in r.json()["error"]
    assert r.json()["backend"] == minio.endpoint

    # A bucket whose secret goes bad later: its reads are 401s naming the object.
    assert get(endpoint, bucket, "o.txt").status_code == 200  # joins the map
    set_props = {"action": "set-bprops", "props": {"secret": "wrong"}}
    assert httpx.post(url, json=set_props).status_code == 200
    r = get(endpoint, bucket, "other.txt")
    assert r.status_code == 401, r.text
    assert r.json()["object"] == "other.txt" and "rejected the credentials" in r.json()["error"]
    reset = {"action": "set-bprops", "props": {"secret": None}}
    assert httpx.post(url, json=reset).status_code == 200


def test_unknown_provider_and_provider_mismatch_are_400s(endpoint: str) -> None:
    with Client(endpoint) as client:
        client.bucket("rm-native").create()
    r = httpx.get(f"{endpoint}/v1/objects/rm-native/x", params={"provider": "aws"})
    assert r.status_code == 400 and "'ais' bucket" in r.json()["error"]
    r = httpx.get(f"{endpoint}/v1/objects/rm-native/x", params={"provider": "gcp"})
    assert r.status_code == 400 and "gcp" in r.json()["error"]


def test_warm_gets_survive_the_backend_going_down(endpoint: str, minio: MinioServer) -> None:
    bucket = new_bucket(minio, {"kept.bin": b"k" * 5000, "cold.bin": b"c"})
    assert get(endpoint, bucket, "kept.bin").status_code == 200
    minio.stop()
    try:
        warm = get(endpoint, bucket, "kept.bin")
        assert warm.status_code == 200 and warm.content == b"k" * 5000
        cold = get(endpoint, bucket, "cold.bin")
        assert cold.status_code == 503, cold.text
        assert cold.headers["retry-after"].isdigit()
        assert cold.json()["object"] == "cold.bin" and minio.endpoint in cold.json()["error"]
    finally:
        minio.start()
    assert get(endpoint, bucket, "cold.bin").content == b"c"


def sluice(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "etl_runtime.cli", "--endpoint", endpoint, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_prefetch_and_evict_jobs_with_the_sdk_and_the_cli(
    endpoint: str, minio: MinioServer, tmp_path
) -> None:
    warm = {f"warm/{i}.bin": os.urandom(100_000) for i in range(6)}
    bucket = new_bucket(minio, {**warm, "other.bin": b"o"})
    with Client(endpoint) as client:
        remote = client.bucket(bucket, provider="aws")
        job = remote.prefetch(prefix="warm/")
        assert job["state"] == "Finished", job
        assert job["progress"]["objects"] == 6 and job["progress"]["bytes"] == 600_000
        assert job["spec"]["total"] == {"objects": 6, "bytes": 600_000}
        assert {o["name"] for o in remote.list_entries() if o["cached"]} == set(warm)

        before = metric(endpoint, FETCHES)
        assert remote.object("warm/3.bin").get_bytes() == warm["warm/3.bin"]
        assert metric(endpoint, FETCHES) == before  # prefetched: served from the cache

        again = remote.prefetch(prefix="warm/")
        assert again["progress"]["objects"] == 0 and again["progress"]["skipped"] == 6

        evicted = remote.evict(prefix="warm/")
        assert evicted["progress"]["objects"] == 6
        assert not any(o["cached"] for o in remote.list_entries())

    # The CLI: prefetch with a progress bar, ls with the cached column, get through s3://.
    done = sluice(endpoint, "prefetch", f"s3://{bucket}", "--prefix", "warm/")
    assert done.returncode == 0, done.stderr
    assert "prefetched 6 object(s), 600000 bytes" in done.stdout
    assert "100%" in done.stderr  # tqdm's bar reached the total
    listing = sluice(endpoint, "ls", f"s3://{bucket}").stdout.splitlines()
    assert [line.split()[-2:] for line in listing] == [
        ["-", "other.bin"],
        *[["cached", n] for n in sorted(warm)],
    ]
    out = tmp_path / "o.bin"
    got = sluice(endpoint, "get", f"aws://{bucket}/warm/5.bin", "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert out.read_bytes() == warm["warm/5.bin"]
    evict = sluice(endpoint, "evict", f"s3://{bucket}")
    assert evict.returncode == 0 and "evicted 6 cached object(s)" in evict.stdout
    props = sluice(endpoint, "props", f"s3://{bucket}", "--validate-warm-get", "true")
    assert props.returncode == 0, props.stderr
    assert json.loads(props.stdout)["backend"] == {"validate_warm_get": True}
    assert json.loads(props.stdout)["provider"] == "aws"


def test_the_official_aistore_sdk_reads_and_lists_an_aws_bucket(
    endpoint: str, minio: MinioServer
) -> None:
    from aistore.sdk import Client as AisClient

    bucket = new_bucket(minio, {"a/1.txt": b"one", "a/2.txt": b"two"})
    bck = AisClient(endpoint).bucket(bucket, provider="aws")
    assert bck.object("a/2.txt").get_reader().read_all() == b"two"
    eventually(
        lambda: [(e.name, e.size, e.is_cached()) for e in bck.list_all_objects(prefix="a/")],
        [("a/1.txt", 3, False), ("a/2.txt", 3, True)],
    )


def test_validate_warm_get_sees_a_changed_object(endpoint: str, minio: MinioServer) -> None:
    checked = new_bucket(minio, {"o.txt": b"version 1"})
    trusting = new_bucket(minio, {"o.txt": b"version 1"})
    props = {"action": "create-bck", "props": {"validate_warm_get": True}}
    r = httpx.post(f"{endpoint}/v1/buckets/{checked}", params={"provider": "aws"}, json=props)
    assert r.status_code == 200, r.text
    for b in (checked, trusting):
        assert get(endpoint, b, "o.txt").content == b"version 1"
        minio.client().put_object(Bucket=b, Key="o.txt", Body=b"version 2!")
    assert get(endpoint, checked, "o.txt").content == b"version 2!"
    assert get(endpoint, trusting, "o.txt").content == b"version 1"  # the cached copy (default)
    minio.client().delete_object(Bucket=checked, Key="o.txt")
    gone = get(endpoint, checked, "o.txt")
    assert gone.status_code == 404 and "no longer exists" in gone.json()["error"]


def test_the_cache_evicts_least_recently_used_objects_above_its_cap(
    endpoint: str, minio: MinioServer
) -> None:
    data = {f"lru/{i:02d}.bin": os.urandom(2 << 20) for i in range(10)}
    bucket = new_bucket(minio, data)
    before = metric(endpoint, "sluice_remote_cache_evicted_total")
    for name in sorted(data):
        assert get(endpoint, bucket, name).status_code == 200
    # 20 MiB over two targets with 8 MiB each: some copies had to go, none over the cap.
    assert metric(endpoint, "sluice_remote_cache_evicted_total") > before
    assert all(
        v <= CACHE_BYTES for v in per_target(endpoint, "sluice_remote_cached_bytes").values()
    )
    listing = httpx.get(f"{endpoint}/v1/buckets/{bucket}", params={"prefix": "lru/"}).json()
    cached = [o["name"] for o in listing["objects"] if o["cached"]]
    assert "lru/09.bin" in cached and len(cached) < 10  # the newest stays, the oldest went
    assert get(endpoint, bucket, "lru/00.bin").content == data["lru/00.bin"]  # fetched again


def test_get_batch_of_remote_objects_cold_and_warm(endpoint: str, minio: MinioServer) -> None:
    """GetBatch over an ``aws`` bucket: the target assembling it (the gateway's 307)
    reads each item from its owner, which fetches a cold one from the backend."""
    objects = {f"k{i}": f"value-{i}".encode() * (i + 1) for i in range(6)}
    bucket = new_bucket(minio, objects)
    assert get(endpoint, bucket, "k0").content == objects["k0"]  # the bucket is known now
    order = ["k3", "k0", "k5", "nope", "k1"]
    body = {"in": [{"objname": n} for n in order], "strm": True, "coer": True}
    for _ in range(2):  # cold, then from the cache
        r = httpx.request(
            "GET",
            f"{endpoint}/v1/ml/moss/{bucket}",
            params={"provider": "aws"},
            json=body,
            follow_redirects=True,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.history and r.history[0].status_code == 307  # a target assembled it
        with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tar:
            got = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
        assert got == [
            (f"__404__/{bucket}/nope", b"") if n == "nope" else (f"{bucket}/{n}", objects[n])
            for n in order
        ]
