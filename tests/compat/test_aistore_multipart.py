"""The official ``aistore`` SDK's multipart upload and append over a 3-target ``sluice up``.

``obj.multipart_upload()`` (create / add_part / complete / abort) and
``get_writer().append_content()`` / ``as_file(mode="a"|"w")``: the object
is written only when the upload completes or the appends are flushed, it is
read back whole (checked like every write), and a call Sluice does not
understand is a 400 naming it that changes nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from aistore.sdk import Client
from aistore.sdk.errors import AISError

from etl_runtime.gateway import aiscompat
from etl_runtime.gateway.s3 import multipart as s3_multipart
from etl_runtime.local import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("mpt") / "data", targets=3) as c:
        Client(c.endpoint).bucket("mpt").create()
        yield c


def listed(ais: Client, bucket: str) -> list[str]:
    return [e.name for e in ais.bucket(bucket).list_all_objects()]


def missing(ais: Client, bucket: str, name: str) -> bool:
    try:
        ais.bucket(bucket).object(name).head()
    except AISError as e:
        return e.status_code == 404
    return False


def test_the_hidden_area_is_the_s3_one() -> None:
    assert aiscompat.IN_PROGRESS == s3_multipart.HIDDEN


def test_multipart_upload_writes_the_object_only_when_completed(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    obj = ais.bucket("mpt").object("big.bin")
    parts = [os.urandom(3 << 20), os.urandom(1 << 20), b"tail"]
    mpu = obj.multipart_upload().create()
    assert mpu.upload_id
    # out of order on purpose: the object is the parts in ascending order
    for n in (2, 1, 3):
        mpu.add_part(n).put_content(parts[n - 1])
    assert missing(ais, "mpt", "big.bin")
    assert "big.bin" not in listed(ais, "mpt")
    mpu.complete()
    assert obj.get_reader().read_all() == b"".join(parts)
    assert obj.head().size == sum(map(len, parts))
    assert listed(ais, "mpt") == ["big.bin"]  # the parts are gone with the upload


def test_abort_drops_the_parts_and_leaves_an_existing_object(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    obj = ais.bucket("mpt").object("kept.txt")
    obj.get_writer().put_content(b"before")
    mpu = obj.multipart_upload().create()
    mpu.add_part(1).put_content(b"never")
    mpu.abort()
    assert obj.get_reader().read_all() == b"before"
    with pytest.raises(AISError) as e:
        mpu.complete()
    assert e.value.status_code == 404 and mpu.upload_id in str(e.value)
    native = httpx.get(f"{up.endpoint}/v1/buckets/mpt", params={"prefix": ".s3-multipart/"})
    assert native.json()["objects"] == []


def test_a_bad_multipart_call_is_a_400_naming_it(up: LocalCluster) -> None:
    url = f"{up.endpoint}/v1/objects/mpt/x.bin"
    r = httpx.post(url, params={"provider": "ais"}, json={"action": "mpt-sideways"})
    assert r.status_code == 400 and "mpt-sideways" in r.text
    r = httpx.post(url, params={"provider": "ais"})
    assert r.status_code == 400 and "action message" in r.text
    upload_id = httpx.post(url, params={"provider": "ais"}, json={"action": "mpt-upload"}).text
    r = httpx.post(
        url, params={"uploadId": upload_id}, json={"action": "mpt-complete", "value": []}
    )
    assert r.status_code == 400 and "lists no parts" in r.text
    r = httpx.post(
        url,
        params={"uploadId": upload_id},
        json={"action": "mpt-complete", "value": [{"part-number": 1, "etag": ""}]},
    )
    assert r.status_code == 400 and "part 1 was not uploaded" in r.text
    r = httpx.put(url, params={"uploadId": upload_id, "partNumber": "0"}, content=b"x")
    assert r.status_code == 400 and "partNumber" in r.text
    r = httpx.put(url, params={"uploadId": upload_id, "partNumber": "1", "crc": "1"}, content=b"x")
    assert r.status_code == 400 and "crc" in r.text
    r = httpx.put(url, params={"uploadId": "f" * 32, "partNumber": "1"}, content=b"x")
    assert r.status_code == 404 and "does not exist" in r.text
    assert missing(Client(up.endpoint), "mpt", "x.bin")


def test_appends_are_invisible_until_flushed(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    writer = ais.bucket("mpt").object("log.txt").get_writer()
    handle = writer.append_content(b"one ")
    handle = writer.append_content(b"two ", handle=handle)
    assert handle
    assert missing(ais, "mpt", "log.txt")
    writer.append_content(b"", handle=handle, flush=True)
    assert ais.bucket("mpt").object("log.txt").get_reader().read_all() == b"one two "
    # a new handle appends to what is there
    handle = writer.append_content(b"three")
    assert ais.bucket("mpt").object("log.txt").get_reader().read_all() == b"one two "
    writer.append_content(b"", handle=handle, flush=True)
    assert ais.bucket("mpt").object("log.txt").get_reader().read_all() == b"one two three"


def test_the_file_writer_appends_and_truncates(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    obj = ais.bucket("mpt").object("file.txt")
    obj.get_writer().put_content(b"head:")
    with obj.get_writer().as_file(mode="a") as f:
        f.write(b"a")
        f.write(b"b")
        f.flush()
        assert obj.get_reader().read_all() == b"head:ab"
        f.write(b"c")
    assert obj.get_reader().read_all() == b"head:abc"
    with obj.get_writer().as_file(mode="w") as f:
        f.write(b"fresh")
    assert obj.get_reader().read_all() == b"fresh"


def test_a_bad_append_is_a_400_naming_it(up: LocalCluster) -> None:
    url = f"{up.endpoint}/v1/objects/mpt/y.txt"
    r = httpx.put(url, params={"append_type": "prepend", "append_handle": ""}, content=b"x")
    assert r.status_code == 400 and "prepend" in r.text
    r = httpx.put(url, params={"append_type": "flush", "append_handle": ""}, content=b"")
    assert r.status_code == 400 and "append_handle" in r.text
    r = httpx.put(url, params={"append_type": "append", "append_handle": "nope"}, content=b"x")
    assert r.status_code == 400 and "nope" in r.text
    assert missing(Client(up.endpoint), "mpt", "y.txt")


def test_the_sdk_https_probe_of_a_part_is_a_307_to_the_same_path(up: LocalCluster) -> None:
    """Over HTTPS the SDK sends a PUT's headers alone first (Connection: close) and the
    body where the 307 points; the probe stores nothing."""
    mpu = Client(up.endpoint).bucket("mpt").object("probe.bin").multipart_upload().create()
    where = urlsplit(up.endpoint)
    path = "/v1/objects/mpt/probe.bin"
    head = (
        f"PUT {path}?provider=ais&uploadId={mpu.upload_id}&partNumber=1 HTTP/1.1\r\n"
        f"Host: {where.netloc}\r\nUser-Agent: ais/python/2.0.0\r\nConnection: close\r\n"
        "Content-Length: 5\r\n\r\n"
    )
    with socket.create_connection((where.hostname, where.port), timeout=20) as s:
        s.sendall(head.encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status, *lines = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert status.startswith("HTTP/1.1 307"), answer
    location = next(
        ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("location:")
    )
    assert urlsplit(location).path == path and not urlsplit(location).query
    mpu.add_part(1).put_content(b"after")  # the body, sent again as the SDK does
    mpu.complete()
    assert Client(up.endpoint).bucket("mpt").object("probe.bin").get_reader().read_all() == b"after"
