"""HTTP as curl, requests, httpx and the official aistore SDK expect it (issue 14).

Ranges and conditional GETs on objects, ``HEAD`` of a bucket, checksum
headers, uploads that cross the wire once, errors the aistore SDK turns into
its typed exceptions, and unknown query parameters refused by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import socket
import subprocess
import threading
from collections.abc import Iterator

import httpx
import pytest
import requests

from tests.gateway.conftest import Cluster

aistore = pytest.importorskip("aistore")
from aistore.sdk import Client as AisClient  # noqa: E402
from aistore.sdk.errors import (  # noqa: E402
    ErrBckAlreadyExists,
    ErrBckNotFound,
    ErrObjNotFound,
)

SIZE = 3 << 20


@pytest.fixture
def blob(cluster: Cluster) -> bytes:
    cluster.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    data = random.Random(14).randbytes(SIZE)
    assert cluster.client.put("/v1/objects/bkt/big.bin", content=data).status_code == 200
    return data


def test_100_random_ranges_match_slices(cluster: Cluster, blob: bytes) -> None:
    rng = random.Random(1)
    c = cluster.client
    for i in range(100):
        form = i % 3
        if form == 0:
            a = rng.randrange(SIZE)
            b = rng.randrange(a, min(SIZE, a + 2_000_000)) if i % 2 else SIZE + 50
            spec, want = f"{a}-{b}", blob[a : b + 1]
        elif form == 1:
            a = rng.randrange(SIZE)
            spec, want = f"{a}-", blob[a:]
        else:
            n = rng.randrange(1, SIZE + 10)
            spec, want = f"-{n}", blob[-n:]
        r = c.get("/v1/objects/bkt/big.bin", headers={"Range": f"bytes={spec}"})
        assert r.status_code == 206, (spec, r.status_code)
        assert r.content == want, spec
        start = SIZE - len(want)
        if form == 0 or form == 1:
            start = int(spec.split("-")[0])
        assert r.headers["content-range"] == f"bytes {start}-{start + len(want) - 1}/{SIZE}"


def test_range_edges_and_conditionals(cluster: Cluster, blob: bytes) -> None:
    c, url = cluster.client, "/v1/objects/bkt/big.bin"
    etag = f'"{hashlib.md5(blob).hexdigest()}"'
    r = c.get(url, headers={"Range": f"bytes={SIZE}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{SIZE}"
    assert r.json()["kind"] == "RangeNotSatisfiable"
    r = c.get(url, headers={"Range": "bytes=0-1,5-9"})  # several: the whole object
    assert r.status_code == 200 and r.content == blob
    head = c.head(url)
    assert head.headers["accept-ranges"] == "bytes" and head.headers["etag"] == etag
    assert head.headers["ais-checksum-type"] == "md5"
    assert head.headers["ais-checksum-value"] == etag.strip('"')
    assert c.get(url, headers={"If-None-Match": etag}).status_code == 304
    assert c.head(url, headers={"If-None-Match": etag}).status_code == 304
    assert c.get(url, headers={"If-Match": '"other"'}).status_code == 412
    r = c.get(url, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert r.status_code == 206 and r.content == blob[:10]
    r = c.get(url, headers={"Range": "bytes=0-9", "If-Range": '"old"'})
    assert r.status_code == 200 and len(r.content) == SIZE
    # curl -r and requests with a Range header
    out = subprocess.run(
        ["curl", "-sSL", "-r", "100-199", cluster.url + url], capture_output=True, timeout=60
    )
    assert out.stdout == blob[100:200]
    r = requests.get(cluster.url + url, headers={"Range": "bytes=-5"}, timeout=30)
    assert r.status_code == 206 and r.content == blob[-5:]


def test_etl_get_with_range_is_400(cluster: Cluster, blob: bytes) -> None:
    r = cluster.client.get("/v1/objects/bkt/big.bin?etl_name=x", headers={"Range": "bytes=0-9"})
    assert r.status_code == 400 and "Range" in r.json()["error"]


def test_unknown_query_parameters_are_400_by_name(cluster: Cluster, blob: bytes) -> None:
    for method, query in [
        ("GET", "etl_name=x&etl_pipe=a,b"),
        ("HEAD", "bogus=1"),
        ("DELETE", "force=1"),
        ("PUT", "etl_fqn=/etc/passwd"),
    ]:
        r = httpx.request(method, f"{cluster.url}/v1/objects/bkt/big.bin?{query}")
        assert r.status_code == 400, (method, query)
        if method != "HEAD":
            assert query.split("&")[-1].split("=")[0] in r.json()["error"]
    # and on the target itself
    r = httpx.get(f"{cluster.targets[0].url}/v1/objects/bkt/big.bin?etl_pipeline=a")
    assert r.status_code == 400 and "etl_pipeline" in r.json()["error"]


def test_head_bucket(cluster: Cluster, blob: bytes) -> None:
    assert httpx.head(f"{cluster.url}/v1/buckets/bkt").status_code == 200
    assert httpx.head(f"{cluster.url}/v1/buckets/nope").status_code == 404


@contextlib.contextmanager
def bytes_sent() -> Iterator[list[int]]:
    """Bytes this thread writes to sockets (the servers run in other threads)."""
    me, total = threading.get_ident(), [0]
    originals = {n: getattr(socket.socket, n) for n in ("send", "sendall")}

    def counting(name: str):  # type: ignore[no-untyped-def]
        def call(self, data, *args):  # type: ignore[no-untyped-def]
            result = originals[name](self, data, *args)
            if threading.get_ident() == me:
                total[0] += len(data) if result is None else result
            return result

        return call

    for n in originals:
        setattr(socket.socket, n, counting(n))
    try:
        yield total
    finally:
        for n, f in originals.items():
            setattr(socket.socket, n, f)


def test_upload_crosses_the_wire_once(cluster: Cluster) -> None:
    cluster.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    data = os.urandom(SIZE)
    url = f"{cluster.url}/v1/objects/bkt/up.bin"
    with bytes_sent() as sent:
        assert httpx.put(url, content=data, follow_redirects=True).status_code == 200
    assert SIZE <= sent[0] < 1.2 * SIZE, f"httpx sent {sent[0]} bytes for {SIZE}"
    with bytes_sent() as sent:
        assert requests.put(url, data=data, timeout=60).status_code == 200
    assert SIZE <= sent[0] < 1.2 * SIZE, f"requests sent {sent[0]} bytes for {SIZE}"
    assert cluster.client.get("/v1/objects/bkt/up.bin").content == data


def test_aistore_sdk(cluster: Cluster) -> None:
    client = AisClient(cluster.url)
    bck = client.bucket("sdk")
    bck.create()
    with pytest.raises(ErrBckAlreadyExists):
        bck.create(exist_ok=False)
    bck.create(exist_ok=True)
    bck.head()
    data = random.Random(2).randbytes(5 << 20)
    bck.object("o.bin").get_writer().put_content(data)
    obj = bck.object("o.bin")
    assert obj.get_reader().read_all() == data
    assert obj.get_reader(byte_range="bytes=10-19").read_all() == data[10:20]
    with obj.get_reader(num_workers=4).read_all() as parallel:  # 4 ranged GETs at once
        assert bytes(parallel.buf) == data
    assert obj.head().size == len(data)  # the SDK asks for name and size only
    attrs = obj.head(props="checksum")
    assert attrs.size == len(data)
    assert attrs.checksum_type == "md5" and attrs.checksum_value == hashlib.md5(data).hexdigest()
    with pytest.raises(ErrObjNotFound):
        bck.object("missing").get_reader().read_all()
    with pytest.raises(ErrBckNotFound):
        client.bucket("nobucket").object("x").get_reader().read_all()
    bck.delete()
    bck.delete(missing_ok=True)
    with pytest.raises(ErrBckNotFound):
        bck.delete()
    # Sluice's own create of an existing bucket still answers created: false
    cluster.client.post("/v1/buckets/bkt-s", json={"action": "create-bck"})
    r = cluster.client.post("/v1/buckets/bkt-s", json={"action": "create-bck"})
    assert r.status_code == 200 and r.json()["created"] is False
