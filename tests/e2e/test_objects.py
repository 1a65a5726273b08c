"""Buckets and objects through the SDK on a real local cluster (gateway -> 307 -> targets)."""

from __future__ import annotations

import hashlib
import subprocess

import httpx
import pytest
import requests

from etl_runtime import BadRequest, Client, Conflict, NotFound


@pytest.fixture
def client(endpoint: str):
    with Client(endpoint) as c:
        yield c


def test_buckets_lifecycle(client: Client) -> None:
    bucket = client.bucket("e2e-buckets")
    assert not bucket.exists()
    bucket.create()
    assert bucket.exists() and "e2e-buckets" in client.list_buckets()
    bucket.create(exist_ok=True)
    with pytest.raises(Conflict):
        bucket.create(exist_ok=False)
    bucket.object("x/y").put_content(b"1")
    bucket.delete()
    assert not bucket.exists() and "e2e-buckets" not in client.list_buckets()
    with pytest.raises(NotFound) as exc_info:
        bucket.delete()
    assert "e2e-buckets" in exc_info.value.message


def test_objects_with_slashes_spread_over_targets_and_list_in_pages(client: Client) -> None:
    bucket = client.bucket("e2e-objects").create()
    names = sorted(f"dir{i % 3}/sub/obj-{i:02d}.bin" for i in range(23)) + ["top.txt"]
    for name in names:
        bucket.object(name).put_content(name.encode() * 3)

    listed = list(bucket.list_objects(page_size=5))
    assert [o.name for o in listed] == sorted(names)
    assert all(o.size == len(o.name) * 3 for o in listed)
    assert [o.name for o in bucket.list_objects(prefix="dir1/")] == [
        n for n in names if n.startswith("dir1/")
    ]
    for o in listed[:4]:
        head = bucket.object(o.name).head()
        assert (head.size, head.etag) == (o.size, o.etag) and head.etag
        assert bucket.object(o.name).get_bytes() == o.name.encode() * 3

    # HRW spreads the objects: with 24 names every one of 3 targets gets some.
    owners = set()
    for name in names:
        r = httpx.head(bucket.object(name).url(), follow_redirects=False)
        assert r.status_code == 307
        owners.add(httpx.URL(r.headers["location"]).port)
    assert len(owners) == 3

    bucket.object("top.txt").delete()
    assert not bucket.object("top.txt").exists()


def test_large_file_streams_both_ways(client: Client, tmp_path) -> None:
    data = hashlib.sha256(b"seed").digest() * (6 * 1024 * 1024 // 32)  # 6 MiB
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    obj = client.bucket("e2e-big").create().object("nested/big.bin")
    assert obj.put_file(path).size == len(data)
    digest = hashlib.sha256()
    with obj.open() as reader:
        assert reader.size == len(data)
        while chunk := reader.read(256 * 1024):
            digest.update(chunk)
    assert digest.digest() == hashlib.sha256(data).digest()


def test_bad_inputs_get_messages_naming_the_thing(client: Client) -> None:
    bucket = client.bucket("e2e-bad").create()
    with pytest.raises(NotFound) as nf:
        client.bucket("e2e-no-such-bucket").object("o").get_bytes()
    assert "e2e-no-such-bucket" in nf.value.message
    with pytest.raises(NotFound) as nf:
        bucket.object("missing/object.txt").get_bytes()
    assert "missing/object.txt" in nf.value.message
    with pytest.raises(NotFound) as nf:
        list(client.bucket("e2e-no-such-bucket").list_objects())
    assert "e2e-no-such-bucket" in nf.value.message
    with pytest.raises(BadRequest) as br:
        bucket.object("a/../../etc/passwd").put_content(b"x")
    assert "a/../../etc/passwd" in br.value.message
    with pytest.raises(BadRequest) as br:
        client.bucket("Bad Name!").create()
    assert "Bad Name!" in br.value.message


def test_plain_http_clients_follow_the_redirect(client: Client, endpoint: str) -> None:
    obj = client.bucket("e2e-http").create().object("a/b.txt")
    obj.put_content(b"plain bytes\x00\xff")
    url = obj.url()
    assert url == f"{endpoint}/v1/objects/e2e-http/a/b.txt"
    curl = subprocess.run(["curl", "-sfL", url], capture_output=True, check=True, timeout=30)
    assert curl.stdout == b"plain bytes\x00\xff"
    r = requests.get(url, timeout=30)
    assert r.status_code == 200 and r.content == b"plain bytes\x00\xff"
    assert r.history[0].status_code == 307
    missing = subprocess.run(
        [
            "curl",
            "-sL",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            obj.url().replace("b.txt", "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.stdout == "404"
