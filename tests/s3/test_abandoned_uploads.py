"""Uploads a client lost track of: ListMultipartUploads and ListParts find them, the
targets' sweep aborts them once older than SLUICE_S3_UPLOAD_TTL and frees their
space, and an interrupted native PUT leaves nothing."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from etl_runtime.local import LocalCluster
from tests.s3.conftest import make_key, s3_client

PART = b"p" * (5 << 20)


def test_list_uploads_and_parts(s3: Any) -> None:
    s3.create_bucket(Bucket="lost-uploads")
    ids = {}
    for key in ("b/two", "a/one", "a/three"):
        ids[key] = s3.create_multipart_upload(Bucket="lost-uploads", Key=key)["UploadId"]
    s3.upload_part(
        Bucket="lost-uploads", Key="a/one", UploadId=ids["a/one"], PartNumber=1, Body=PART
    )
    s3.upload_part(
        Bucket="lost-uploads", Key="a/one", UploadId=ids["a/one"], PartNumber=2, Body=b"x"
    )
    listed = s3.list_multipart_uploads(Bucket="lost-uploads")
    assert [(u["Key"], u["UploadId"]) for u in listed["Uploads"]] == sorted(
        (k, v) for k, v in ids.items()
    )
    assert not listed["IsTruncated"]
    only_a = s3.list_multipart_uploads(Bucket="lost-uploads", Prefix="a/")
    assert sorted(u["Key"] for u in only_a["Uploads"]) == ["a/one", "a/three"]
    first = s3.list_multipart_uploads(Bucket="lost-uploads", MaxUploads=1)
    assert first["IsTruncated"] and len(first["Uploads"]) == 1
    parts = s3.list_parts(Bucket="lost-uploads", Key="a/one", UploadId=ids["a/one"])["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(PART)), (2, 1)]
    s3.abort_multipart_upload(Bucket="lost-uploads", Key="a/one", UploadId=ids["a/one"])
    left = s3.list_multipart_uploads(Bucket="lost-uploads")["Uploads"]
    assert sorted(u["Key"] for u in left) == ["a/three", "b/two"]
    # Uploads in progress never show as objects.
    assert s3.list_objects_v2(Bucket="lost-uploads")["KeyCount"] == 0


def _hidden_bytes(data: Path) -> int:
    return sum(
        p.stat().st_size for p in data.rglob("*") if ".s3-multipart" in p.parts and p.is_file()
    )


def test_the_sweep_aborts_old_uploads_and_frees_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough for the six parts to be in before the first sweep on a busy machine.
    monkeypatch.setenv("SLUICE_S3_UPLOAD_TTL", "8")
    small = b"s" * (64 << 10)  # only CompleteMultipartUpload needs 5 MiB parts
    data = tmp_path / "data"
    with LocalCluster(data, targets=2) as c:
        endpoint = c.endpoint.rstrip("/")
        s3 = s3_client(endpoint, make_key(endpoint, "write"))
        s3.create_bucket(Bucket="swept")
        for i in range(3):
            up = s3.create_multipart_upload(Bucket="swept", Key=f"k{i}")["UploadId"]
            for n in (1, 2):
                s3.upload_part(Bucket="swept", Key=f"k{i}", UploadId=up, PartNumber=n, Body=small)
        assert _hidden_bytes(data) >= 6 * len(small)
        assert len(s3.list_multipart_uploads(Bucket="swept")["Uploads"]) == 3
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and (
            _hidden_bytes(data) or s3.list_multipart_uploads(Bucket="swept").get("Uploads")
        ):
            time.sleep(0.5)
        assert _hidden_bytes(data) == 0
        assert not s3.list_multipart_uploads(Bucket="swept").get("Uploads")
        with pytest.raises(Exception) as e:
            s3.complete_multipart_upload(
                Bucket="swept", Key="k0", UploadId=up, MultipartUpload={"Parts": []}
            )
        assert "NoSuch" in str(e.value) or "MalformedXML" in str(e.value)
        # A young upload is kept.
        young = s3.create_multipart_upload(Bucket="swept", Key="young")["UploadId"]
        assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket="swept")["Uploads"]] == [
            young
        ]


def test_an_interrupted_native_put_leaves_nothing(endpoint: str, tmp_path: Path) -> None:
    httpx.post(
        f"{endpoint}/v1/buckets/cut-puts", json={"action": "create-bck"}, timeout=10
    ).raise_for_status()
    r = httpx.put(f"{endpoint}/v1/objects/cut-puts/whole", timeout=10)
    owner = urlsplit(r.headers["location"]) if r.status_code == 307 else urlsplit(endpoint)
    path = owner.path or "/v1/objects/cut-puts/whole"
    if owner.query:
        path += "?" + owner.query
    with socket.create_connection((owner.hostname, owner.port), timeout=10) as sock:
        head = f"PUT {path} HTTP/1.1\r\nHost: {owner.netloc}\r\nContent-Length: {1 << 20}\r\n\r\n"
        sock.sendall(head.encode() + b"h" * (300 << 10))
    time.sleep(1.0)
    listed = httpx.get(f"{endpoint}/v1/buckets/cut-puts", timeout=10).json()["objects"]
    assert listed == []
    assert (
        httpx.get(f"{endpoint}/v1/objects/cut-puts/whole", follow_redirects=True).status_code == 404
    )
