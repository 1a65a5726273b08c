"""``validate_cold_get``: a fill's bytes are checked against the backend's MD5 before
the last of them is served or cached. A real MinIO behind a proxy that inverts a
byte of its answers (``CutProxy.flip``: a bad disk under the backend, a bad link),
the package's real ``sluice up``, and the SDK.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import httpx
import pytest

from etl_runtime import Client
from etl_runtime.providers.cache import etag_md5
from tests.providers.conftest import cached_files, leftovers, metric
from tests.providers.cutproxy import CutProxy
from tests.providers.minio import MinioServer
from tests.providers.test_remote import FETCHES, eventually, get, new_bucket

CHECKED = "sluice_remote_cold_checked_total"
MISMATCHES = "sluice_remote_cold_mismatches_total"
MiB = 1 << 20


def checked_bucket(
    endpoint: str, proxy: CutProxy, objects: dict[str, bytes], minio: MinioServer
) -> str:
    """A new aws bucket holding ``objects``, reached through ``proxy``, that checks fills."""
    bucket = new_bucket(minio, objects)
    r = httpx.post(
        f"{endpoint}/v1/buckets/{bucket}",
        params={"provider": "aws"},
        json={
            "action": "create-bck",
            "props": {"endpoint": proxy.endpoint, "validate_cold_get": True},
        },
    )
    assert r.status_code == 200, r.text
    return bucket


def test_an_etag_is_an_md5_only_where_it_is_one() -> None:
    digest = hashlib.md5(b"sluice").digest()
    assert etag_md5(digest.hex()) == digest  # S3, MinIO, GCS's XML API
    assert etag_md5(f'"{digest.hex()}"') == digest
    assert etag_md5(base64.b64encode(digest).decode()) == digest  # fake-gcs-server
    assert etag_md5(f"{digest.hex()}-3") is None  # an S3 multipart upload's
    assert etag_md5("0x8DC5E3F2A1B4C7D") is None  # Azure's
    assert etag_md5("CJaW0ZvJ0IkDEAE=") is None  # GCS's JSON API (generation, metageneration)
    assert etag_md5("z" * 32) is None


@pytest.mark.parametrize("size", [300 << 10, 3 * MiB], ids=["one-piece", "streamed"])
def test_a_fill_whose_bytes_are_not_the_backends_is_refused_and_cached_nowhere(
    endpoint: str, minio: MinioServer, proxy: CutProxy, cluster_dir: Path, size: int
) -> None:
    data = os.urandom(size)
    bucket = checked_bucket(endpoint, proxy, {"o.bin": data}, minio)
    mismatches, flips = metric(endpoint, MISMATCHES), proxy.flips
    proxy.flip, proxy.flip_at = f"/{bucket}/o.bin", 5000  # in the body, past the head
    try:
        url = f"{endpoint}/v1/objects/{bucket}/o.bin"
        got = b""
        with httpx.stream("GET", url, follow_redirects=True, timeout=60) as answer:
            if size < MiB:
                # One chunk: checked before any byte went out, so a plain error.
                assert answer.status_code == 502
                body = answer.read().decode()
                assert "MD5" in body and bucket in body and "o.bin" in body
                assert "validate_cold_get" in body
            else:
                # Streamed: the last chunk waits for the digest, so the answer breaks off
                # short of its Content-Length and no client takes it for the object.
                assert answer.status_code == 200
                assert answer.headers["content-length"] == str(size)
                with pytest.raises(httpx.RemoteProtocolError):
                    for chunk in answer.iter_bytes():
                        got += chunk
                assert len(got) < size
    finally:
        proxy.flip = None
    assert proxy.flips > flips  # the backend's answer was damaged indeed
    eventually(lambda: metric(endpoint, MISMATCHES), mismatches + 1)
    assert cached_files(cluster_dir, bucket, "o.bin") == []
    eventually(lambda: leftovers(cluster_dir), [])

    # Nothing was kept: the next GET fetches again and gets the object whole.
    fetches, checked = metric(endpoint, FETCHES), metric(endpoint, CHECKED)
    again = get(endpoint, bucket, "o.bin")
    assert again.status_code == 200 and again.content == data
    assert metric(endpoint, FETCHES) == fetches + 1
    eventually(lambda: metric(endpoint, CHECKED), checked + 1)
    eventually(lambda: len(cached_files(cluster_dir, bucket, "o.bin")), 1)
    warm = get(endpoint, bucket, "o.bin")
    assert warm.content == data and metric(endpoint, FETCHES) == fetches + 1


def test_an_etl_get_of_a_damaged_fill_is_an_error_never_a_transformed_answer(
    endpoint: str, minio: MinioServer, proxy: CutProxy
) -> None:
    data = b"cold bytes, transformed " * 4000
    bucket = checked_bucket(endpoint, proxy, {"t.txt": data}, minio)
    client = Client(endpoint)
    client.etl("cc-upper").init_code(transform=lambda b: b.upper())
    try:
        proxy.flip, proxy.flip_at = f"/{bucket}/t.txt", 3000
        try:
            r = get(endpoint, bucket, "t.txt", etl_name="cc-upper")
            assert r.status_code == 502, r.text[:300]
            assert "MD5" in r.text and bucket in r.text
        finally:
            proxy.flip = None
        r = get(endpoint, bucket, "t.txt", etl_name="cc-upper")
        assert r.status_code == 200 and r.content == data.upper()
    finally:
        client.etl("cc-upper").delete()


def test_objects_without_a_digest_in_their_etag_are_served_unchecked(
    endpoint: str, minio: MinioServer, proxy: CutProxy
) -> None:
    """A multipart upload's ETag (``-N``) is no MD5 of the bytes: such objects are
    served as fetched (their XXH3 is still kept and checked on later reads), not
    refused for a digest they do not have."""
    part = os.urandom(5 * MiB)
    bucket = checked_bucket(endpoint, proxy, {"whole.bin": part[:MiB]}, minio)
    s3 = minio.client()
    up = s3.create_multipart_upload(Bucket=bucket, Key="parts.bin")
    etags = [
        s3.upload_part(
            Bucket=bucket, Key="parts.bin", UploadId=up["UploadId"], PartNumber=n, Body=part
        )["ETag"]
        for n in (1, 2)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="parts.bin",
        UploadId=up["UploadId"],
        MultipartUpload={
            "Parts": [{"ETag": e, "PartNumber": n} for n, e in ((1, etags[0]), (2, etags[1]))]
        },
    )
    checked, mismatches = metric(endpoint, CHECKED), metric(endpoint, MISMATCHES)
    r = get(endpoint, bucket, "parts.bin")
    assert r.status_code == 200 and r.content == part + part
    assert r.headers["etag"].strip('"').endswith("-2")
    r = get(endpoint, bucket, "whole.bin")
    assert r.status_code == 200 and r.content == part[:MiB]
    eventually(lambda: metric(endpoint, CHECKED), checked + 1)  # whole.bin only
    assert metric(endpoint, MISMATCHES) == mismatches


def test_validate_cold_get_is_a_bool_prop_shown_and_set_by_the_sdk(
    endpoint: str, minio: MinioServer
) -> None:
    bucket = new_bucket(minio, {})
    r = httpx.post(
        f"{endpoint}/v1/buckets/{bucket}",
        params={"provider": "aws"},
        json={"action": "create-bck", "props": {"validate_cold_get": "yes"}},
    )
    assert r.status_code == 400 and "validate_cold_get" in r.text and bucket in r.text
    remote = Client(endpoint).bucket(bucket, provider="aws")
    remote.create(validate_cold_get=True)
    assert remote.props()["backend"]["validate_cold_get"] is True
    remote.set_props(validate_cold_get=False)
    assert remote.props()["backend"]["validate_cold_get"] is False
