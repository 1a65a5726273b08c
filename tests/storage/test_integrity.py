"""Bit rot on a real data dir: a read never answers 200 with bytes that do not match.

Three bytes flipped in place in an object's file under a target's data dir
(its extended attributes and mtime kept), or the file truncated: the native
GET, the S3 GET (boto3), an ETL GET and GetBatch never answer those bytes as
a whole object; with ``copies=2`` the read is served from the good copy and
the bad one is repaired; a corrupted single copy fails loudly, naming bucket,
object and target.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, IncompleteReadError, ResponseStreamingError
from urllib3.exceptions import ReadTimeoutError

from etl_runtime import Client
from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)

SMALL = 16 << 10
BIG = 3 << 20


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("integrity") / "data", targets=3) as c:
        yield c


@pytest.fixture(scope="module")
def http(up: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=up.endpoint, timeout=30, follow_redirects=True) as c:
        yield c


@pytest.fixture(scope="module")
def upper_etl(up: LocalCluster) -> str:
    """An object ETL (``upper``) the module's tests share."""
    Client(up.endpoint).etl("up-bt").init_code(transform=upper, timeout=180)
    return "up-bt"


def payload(size: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


def files_of(up: LocalCluster, bucket: str, name: str) -> list[Path]:
    """The object's files, one per target holding a copy."""
    found = sorted(up.data_dir.glob(f"targets/*/buckets/{bucket}/{name}"))
    assert found, f"no file of {bucket}/{name} under {up.data_dir}"
    return found


def flip(path: Path, at: int = 100) -> None:
    """Three bytes flipped in place: xattrs and mtime kept."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(3)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def truncate(path: Path, size: int = 1000) -> None:
    st = path.stat()
    os.truncate(path, size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def make(http: httpx.Client, bucket: str, copies: int = 1) -> None:
    props = {"copies": copies} if copies > 1 else {}
    r = http.post(f"/v1/buckets/{bucket}", json={"action": "create-bck", "props": props})
    assert r.status_code == 200, r.text


def put(http: httpx.Client, bucket: str, name: str, data: bytes) -> None:
    r = http.put(f"/v1/objects/{bucket}/{name}", content=data)
    assert r.status_code == 200, r.text


def get_raw(up: LocalCluster, bucket: str, name: str) -> tuple[int, bytes, bool]:
    """(status, body, complete): ``complete`` is False when the stream was cut short."""
    with (
        httpx.Client(base_url=up.endpoint, timeout=30, follow_redirects=True) as c,
        c.stream("GET", f"/v1/objects/{bucket}/{name}") as r,
    ):
        got = bytearray()
        try:
            for chunk in r.iter_raw():
                got += chunk
        except httpx.HTTPError:
            return r.status_code, bytes(got), False
        return r.status_code, bytes(got), True


@pytest.mark.parametrize("size", [SMALL, BIG])
def test_flipped_single_copy_fails_loudly(up: LocalCluster, http: httpx.Client, size: int) -> None:
    bucket = f"rot{size}"
    make(http, bucket)
    data = payload(size, 1)
    put(http, bucket, "o.bin", data)
    [path] = files_of(up, bucket, "o.bin")
    flip(path, at=size // 2)
    for _ in range(2):
        status, body, complete = get_raw(up, bucket, "o.bin")
        assert not (status == 200 and complete and body != data), "served the flipped bytes"
        if size <= 1 << 20:  # checked before the first byte: a clear error
            assert status == 503, (status, body[:200])
            err = httpx.Response(status, content=body).json()
            assert err["kind"] == "ObjectCorrupted"
            assert err["bucket"] == bucket and err["object"] == "o.bin" and err["target"]
        else:  # checked as it streams: cut before the last byte
            assert status == 200 and not complete and len(body) < size
    if size <= 1 << 20:
        r = http.get(f"/v1/objects/{bucket}/o.bin")
        assert r.status_code == 503 and "retry-after" not in r.headers  # nothing to wait for
    assert corrupted_reads(http, r_target(up, path)) >= 2


def r_target(up: LocalCluster, path: Path) -> str:
    """The id of the target whose data dir holds ``path`` (``targets/<id>/...``)."""
    return path.relative_to(up.data_dir / "targets").parts[0]


def corrupted_reads(http: httpx.Client, target: str) -> float:
    """``sluice_integrity_corrupted_reads_total`` on that target's ``/metrics``."""
    urls = {t["id"]: t["url"] for t in http.get("/v1/cluster").json()["targets"]}
    text = httpx.get(f"{urls[target].rstrip('/')}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("sluice_integrity_corrupted_reads_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sluice_integrity_corrupted_reads_total on {target}")


def test_truncated_object_is_never_served_as_complete(up: LocalCluster, http: httpx.Client) -> None:
    make(http, "cut")
    for name, size in (("small.bin", SMALL), ("big.bin", BIG)):
        put(http, "cut", name, payload(size, 2))
        [path] = files_of(up, "cut", name)
        truncate(path)
        r = http.get(f"/v1/objects/cut/{name}")
        assert r.status_code == 503, (name, r.status_code, r.text[:200])
        assert r.json()["kind"] == "ObjectCorrupted" and r.json()["object"] == name


def test_s3_get_of_a_flipped_object_is_not_a_200(up: LocalCluster, http: httpx.Client) -> None:
    make(http, "s3rot")
    r = http.post("/v1/s3/keys", json={"permission": "read"})
    assert r.status_code == 200, r.text
    key = r.json()
    s3 = boto3.client(
        "s3",
        endpoint_url=f"{up.endpoint}/s3",
        aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"],
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )
    for name, size in (("small.bin", SMALL), ("big.bin", BIG)):
        put(http, "s3rot", name, payload(size, 3))
        flip(files_of(up, "s3rot", name)[0], at=size - 100)
        try:
            body = s3.get_object(Bucket="s3rot", Key=name)["Body"].read()
        except ClientError as e:  # checked before the first byte
            assert size <= 1 << 20
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 503, e.response
        except (IncompleteReadError, ResponseStreamingError, ReadTimeoutError):
            assert size > 1 << 20  # checked as it streamed: cut short
        else:
            pytest.fail(f"S3 GET of {name} answered {len(body)} bytes with a 200")


def test_copies_serve_the_good_copy_and_repair_the_bad_one(
    up: LocalCluster, http: httpx.Client
) -> None:
    make(http, "two", copies=2)
    for name, size in (("small.bin", SMALL), ("big.bin", BIG)):
        data = payload(size, 4)
        put(http, "two", name, data)
        paths = files_of(up, "two", name)
        assert len(paths) == 2
        repaired_by_reads = 0
        for p in paths:  # each copy in turn is the bad one
            flip(p, at=size // 3)
            served = []
            for _ in range(5):
                status, body, complete = get_raw(up, "two", name)
                assert not (status == 200 and complete and body != data)
                served.append(status == 200 and complete and body == data)
                time.sleep(0.1)
            if size <= 1 << 20:  # checked before the first byte: always served right
                assert all(served), served
            else:  # checked as it streams: the first read may be cut, then it is repaired
                assert served[-1], served
            if p.read_bytes() == data:
                repaired_by_reads += 1
            else:  # the copy reads do not go to: the scrub repairs it (test_scrub)
                put(http, "two", name, data)
        assert repaired_by_reads == 1  # the copy reads land on was replaced by the good one


def upper(data: bytes) -> bytes:
    return data.upper()


def shard_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for n, data in members.items():
            info = tarfile.TarInfo(n)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def moss(up: LocalCluster, body: dict[str, Any], **params: str) -> tuple[int, bytes, bool]:
    """GetBatch: (status, body, complete)."""
    with (
        httpx.Client(base_url=up.endpoint, timeout=60, follow_redirects=True) as c,
        c.stream("GET", "/v1/ml/moss", params=params, json=body) as r,
    ):
        got = bytearray()
        try:
            for chunk in r.iter_raw():
                got += chunk
        except httpx.HTTPError:
            return r.status_code, bytes(got), False
        return r.status_code, bytes(got), True


def members(raw: bytes) -> dict[str, bytes]:
    """The archive's files, or {} when no tar reader takes it for whole."""
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tar:
            out = {}
            for m in tar:
                f = tar.extractfile(m)
                out[m.name] = f.read() if f is not None else b""
            return out
    except (tarfile.TarError, OSError):
        return {}


def test_etl_get_and_getbatch_never_answer_flipped_bytes(
    up: LocalCluster, http: httpx.Client, upper_etl: str
) -> None:
    make(http, "btx")
    good, bad, big = payload(SMALL, 5), payload(SMALL, 6), payload(BIG, 7)
    shard = shard_of({"a.txt": b"a" * 3000, "b.txt": b"b" * 3000})
    for name, data in (("good.bin", good), ("bad.bin", bad), ("big.bin", big), ("s.tar", shard)):
        put(http, "btx", name, data)
    flip(files_of(up, "btx", "bad.bin")[0])
    flip(files_of(up, "btx", "big.bin")[0], at=BIG - 10)
    flip(files_of(up, "btx", "s.tar")[0], at=600)  # inside a.txt
    flipped = {n: files_of(up, "btx", n)[0].read_bytes() for n in ("bad.bin", "big.bin", "s.tar")}

    for name in ("bad.bin", "big.bin"):
        r = http.get(f"/v1/objects/btx/{name}", params={"etl_name": "up-bt"})
        assert r.status_code == 503 and r.json()["kind"] == "ObjectCorrupted", r.text[:300]
        assert r.json()["object"] == name
    assert (
        http.get("/v1/objects/btx/good.bin", params={"etl_name": "up-bt"}).content == good.upper()
    )

    def never_flipped(got: dict[str, bytes]) -> None:
        for data in got.values():
            assert data not in flipped.values() and data != flipped["s.tar"][512:3512]

    for names in (["good.bin", "bad.bin"], ["good.bin", "big.bin"]):
        items = [{"objname": n, "bucket": "btx"} for n in names]
        for coer in (False, True):
            for params in ({}, {"etl_name": "up-bt"}):
                status, raw, complete = moss(
                    up, {"in": items, "coer": coer, "strm": True}, **params
                )
                got = members(raw) if status == 200 and complete else {}
                never_flipped(got)
                if got:  # a whole archive: the bad item is a placeholder, never its bytes
                    assert coer, (names, params, list(got))
                    want = good.upper() if params else good
                    assert [d for d in got.values() if d] == [want], (names, params)
    items = [{"objname": "s.tar", "bucket": "btx", "archpath": "a.txt"}]
    status, raw, complete = moss(up, {"in": items, "strm": True})
    got = members(raw) if status == 200 and complete else {}
    never_flipped(got)
    assert not any(len(v) == 3000 and v != b"a" * 3000 for v in got.values()), got.keys()


def sendfile_bytes(http: httpx.Client, target: str) -> float:
    """``sluice_sendfile_bytes_total`` on that target's ``/metrics``."""
    urls = {t["id"]: t["url"] for t in http.get("/v1/cluster").json()["targets"]}
    text = httpx.get(f"{urls[target].rstrip('/')}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("sluice_sendfile_bytes_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sluice_sendfile_bytes_total on {target}")


def test_a_hot_object_changed_on_disk_is_checked_again(
    up: LocalCluster, http: httpx.Client, upper_etl: str
) -> None:
    """A read that matched is remembered (the next reads of the unchanged file skip the
    hash and go by sendfile); any change to the file is checked again on the next read,
    on the plain GET and the ETL GET alike."""
    make(http, "hot")
    objects = {"small.bin": SMALL, "mib.bin": 1 << 20, "big.bin": BIG}
    for name, size in objects.items():
        put(http, "hot", name, payload(size, 8))
    time.sleep(1.1)  # a file changed within the last second is never remembered
    owner = {name: r_target(up, files_of(up, "hot", name)[0]) for name in objects}
    for name, size in objects.items():
        sent = []
        for _ in range(2):  # the first checks and remembers, the second does not hash
            before = sendfile_bytes(http, owner[name])
            r = http.get(f"/v1/objects/hot/{name}")
            assert r.status_code == 200 and r.content == payload(size, 8)
            sent.append(sendfile_bytes(http, owner[name]) - before)
        if size == 1 << 20:  # checked first, then sent by sendfile
            assert sent[0] >= size, sent
        if size >= 1 << 20:  # remembered: by sendfile, not through the hash
            assert sent[1] >= size, sent
    for name, size in objects.items():
        r = http.get(f"/v1/objects/hot/{name}", params={"etl_name": upper_etl})
        assert r.status_code == 200 and r.content == payload(size, 8).upper()
    flip(files_of(up, "hot", "small.bin")[0])
    flip(files_of(up, "hot", "mib.bin")[0], at=(1 << 20) - 10)
    truncate(files_of(up, "hot", "big.bin")[0], BIG - 1)
    for name in objects:
        for params in ({}, {"etl_name": upper_etl}):
            r = http.get(f"/v1/objects/hot/{name}", params=params)
            assert r.status_code == 503, (name, params, r.status_code, r.text[:200])
            assert r.json()["kind"] == "ObjectCorrupted" and r.json()["object"] == name


def test_getbatch_sends_a_remembered_object_by_sendfile_and_checks_a_changed_one(
    up: LocalCluster, http: httpx.Client
) -> None:
    """GetBatch reads a whole object as a GET does: the first batch checks it as it
    streams, the next one (the file unchanged) sends it by sendfile; after bytes
    flipped on disk no batch carries them as a whole archive."""
    make(http, "bkt-batch")
    data = payload(BIG, 9)
    put(http, "bkt-batch", "big.bin", data)
    time.sleep(1.1)  # a file changed within the last second is never remembered
    path = files_of(up, "bkt-batch", "big.bin")[0]
    owner = r_target(up, path)
    items = [{"objname": "big.bin", "bucket": "bkt-batch"}]  # strm: one plain tar
    sent = []
    for _ in range(2):
        before = sendfile_bytes(http, owner)
        status, raw, complete = moss(up, {"in": items, "strm": True})
        assert status == 200 and complete and list(members(raw).values()) == [data]
        sent.append(sendfile_bytes(http, owner) - before)
    assert sent[0] < BIG <= sent[1], sent  # through the hash first, then remembered
    flip(path, at=BIG - 10)
    bad_before = corrupted_reads(http, owner)
    status, raw, complete = moss(up, {"in": items, "strm": True})
    got = members(raw) if status == 200 and complete else {}
    assert path.read_bytes() not in got.values(), (status, complete)
    assert corrupted_reads(http, owner) == bad_before + 1


def test_head_of_a_bad_object_is_not_a_200(up: LocalCluster, http: httpx.Client) -> None:
    make(http, "headrot")
    for name, size, damage in (
        ("flipped.bin", SMALL, flip),
        ("mib.bin", 1 << 20, flip),
        ("cut.bin", BIG, truncate),
    ):
        put(http, "headrot", name, payload(size, 9))
        assert http.head(f"/v1/objects/headrot/{name}").status_code == 200
        time.sleep(0.05)  # the damage lands in a later clock tick than the write
        damage(files_of(up, "headrot", name)[0])
        r = http.head(f"/v1/objects/headrot/{name}")
        assert r.status_code == 503, (name, r.status_code, dict(r.headers))
        assert "etag" not in r.headers  # never the old ETag beside other bytes


XXH_XATTR = "user.sluice.xxh"


def test_an_object_without_a_checksum_gets_one_on_first_read(
    up: LocalCluster, http: httpx.Client, upper_etl: str
) -> None:
    """An object written before checksums were stored (no attribute): its first read
    checks its MD5 against its ETag and stores the checksum; from then on it is checked
    as any object. One whose bytes no longer match its ETag is never served."""
    make(http, "old")
    for name, size in (("small.bin", SMALL), ("mib.bin", 1 << 20), ("big.bin", BIG)):
        data = payload(size, 10)
        put(http, "old", name, data)
        [path] = files_of(up, "old", name)
        os.removexattr(path, XXH_XATTR)  # as written before checksums
        r = http.get(f"/v1/objects/old/{name}")
        assert r.status_code == 200 and r.content == data
        assert os.getxattr(path, XXH_XATTR).startswith(b"xxh3:")
        time.sleep(0.05)
        flip(path, at=size // 2)
        status, body, complete = get_raw(up, "old", name)
        assert not (status == 200 and complete), (name, status)
    put(http, "old", "rotted.bin", payload(SMALL, 11))
    [path] = files_of(up, "old", "rotted.bin")
    os.removexattr(path, XXH_XATTR)
    flip(path)  # rotted before its first checked read: its MD5 is not its ETag
    for params in ({}, {"etl_name": upper_etl}):
        r = http.get("/v1/objects/old/rotted.bin", params=params)
        assert r.status_code == 503 and r.json()["kind"] == "ObjectCorrupted", r.text[:200]
    assert http.head("/v1/objects/old/rotted.bin").status_code == 503
    with pytest.raises(OSError):
        os.getxattr(path, XXH_XATTR)  # no checksum made of bytes that do not match
