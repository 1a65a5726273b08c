"""S3 at the gateway's root (minio-py, which takes no path in its endpoint, and boto3
without ``/s3``) beside the native API, and boto3's default presigned URLs
(Signature Version 2), verified as strictly as SigV4's."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from minio import Minio
from minio.error import S3Error as MinioError

from etl_runtime.local import LocalCluster
from tests.s3.conftest import make_key


def test_minio_py_at_the_root(endpoint: str, writer: dict[str, Any]) -> None:
    host = endpoint.split("://", 1)[1]
    m = Minio(host, access_key=writer["access_key"], secret_key=writer["secret_key"], secure=False)
    m.make_bucket("minio-root")
    assert m.bucket_exists("minio-root")
    m.put_object("minio-root", "dir/a.txt", io.BytesIO(b"hi minio"), 8, content_type="text/plain")
    got = m.get_object("minio-root", "dir/a.txt")
    assert got.read() == b"hi minio" and got.headers["content-type"] == "text/plain"
    assert [o.object_name for o in m.list_objects("minio-root", recursive=True)] == ["dir/a.txt"]
    data = os.urandom(11 << 20)
    m.put_object("minio-root", "big", io.BytesIO(data), len(data), part_size=5 << 20)
    assert m.stat_object("minio-root", "big").size == len(data)
    assert m.get_object("minio-root", "big").read() == data
    m.remove_object("minio-root", "dir/a.txt")
    with pytest.raises(MinioError) as e:
        m.stat_object("minio-root", "dir/a.txt")
    assert e.value.code in ("NoSuchKey", "ResponseNotFound")
    # The native API and the gateway's pages keep their paths.
    assert httpx.get(f"{endpoint}/v1/health").json()["role"] == "gateway"
    assert httpx.get(f"{endpoint}/metrics").status_code == 200
    native = httpx.get(f"{endpoint}/v1/objects/minio-root/big", follow_redirects=True)
    assert native.content == data


def test_boto3_at_the_root(endpoint: str, writer: dict[str, Any]) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=writer["access_key"],
        aws_secret_access_key=writer["secret_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.create_bucket(Bucket="boto-root")
    s3.put_object(Bucket="boto-root", Key="k", Body=b"at the root")
    assert "boto-root" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert s3.get_object(Bucket="boto-root", Key="k")["Body"].read() == b"at the root"


def test_v2_presigned_urls(s3: Any, endpoint: str, writer: dict[str, Any]) -> None:
    default = boto3.client(  # no signature_version: boto3 presigns with Signature V2
        "s3",
        endpoint_url=f"{endpoint}/s3",
        aws_access_key_id=writer["access_key"],
        aws_secret_access_key=writer["secret_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.create_bucket(Bucket="presign-v2")
    s3.put_object(Bucket="presign-v2", Key="a b.txt", Body=b"presigned")
    s3.put_object(Bucket="presign-v2", Key="other", Body=b"other")
    url = default.generate_presigned_url(
        "get_object", Params={"Bucket": "presign-v2", "Key": "a b.txt"}, ExpiresIn=60
    )
    assert "AWSAccessKeyId=" in url and "Signature=" in url and "Expires=" in url
    r = httpx.get(url)
    assert r.status_code == 200 and r.content == b"presigned"
    assert httpx.head(url).status_code == 403  # signed for GET
    # Another key, another bucket, another method, a changed expiry: refused.
    assert httpx.get(url.replace("a%20b.txt", "other")).status_code == 403
    assert httpx.get(url.replace("/presign-v2/", "/presign-v3/")).status_code == 403
    assert httpx.delete(url).status_code == 403
    expires = url.split("Expires=")[1].split("&")[0]
    assert httpx.get(url.replace(expires, str(int(expires) + 1))).status_code == 403
    assert s3.get_object(Bucket="presign-v2", Key="a b.txt")["Body"].read() == b"presigned"
    put = default.generate_presigned_url(
        "put_object", Params={"Bucket": "presign-v2", "Key": "up"}, ExpiresIn=60
    )
    assert httpx.put(put, content=b"uploaded").status_code == 200
    assert s3.get_object(Bucket="presign-v2", Key="up")["Body"].read() == b"uploaded"
    old = default.generate_presigned_url(
        "get_object", Params={"Bucket": "presign-v2", "Key": "a b.txt"}, ExpiresIn=1
    )
    time.sleep(2.1)
    r = httpx.get(old)
    assert r.status_code == 403 and "expired" in r.text
    far = default.generate_presigned_url(
        "get_object", Params={"Bucket": "presign-v2", "Key": "a b.txt"}, ExpiresIn=30 * 86400
    )
    assert httpx.get(far).status_code == 400


def test_virtual_host_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_S3_DOMAIN", "s3.test")
    with LocalCluster(tmp_path / "data", targets=1) as c:
        endpoint = c.endpoint.rstrip("/")
        port = urlsplit(endpoint).port
        key = make_key(endpoint, "write")
        creds = Credentials(key["access_key"], key["secret_key"])

        def send(method: str, path: str, body: bytes = b"") -> httpx.Response:
            url = f"http://vhost-bucket.s3.test:{port}{path}"
            headers = {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
            request = AWSRequest(method=method, url=url, data=body, headers=headers)
            SigV4Auth(creds, "s3", "us-east-1").add_auth(request)
            return httpx.request(
                method,
                f"{endpoint}{path}",
                content=body,
                headers={**dict(request.headers.items()), "Host": f"vhost-bucket.s3.test:{port}"},
            )

        assert send("PUT", "/").status_code == 200
        assert send("PUT", "/dir/k.txt", b"virtual host").status_code == 200
        got = send("GET", "/dir/k.txt")
        assert got.status_code == 200 and got.content == b"virtual host"
        assert b"<Key>dir/k.txt</Key>" in send("GET", "/?list-type=2").content
        virtual = boto3.client(
            "s3",
            endpoint_url=f"http://s3.test:{port}",
            aws_access_key_id=key["access_key"],
            aws_secret_access_key=key["secret_key"],
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "virtual"}),
        )
        url = virtual.generate_presigned_url(
            "get_object", Params={"Bucket": "vhost-bucket", "Key": "dir/k.txt"}, ExpiresIn=60
        )
        parts = urlsplit(url)
        assert parts.hostname == "vhost-bucket.s3.test"
        r = httpx.get(f"{endpoint}{parts.path}?{parts.query}", headers={"Host": parts.netloc})
        assert r.status_code == 200 and r.content == b"virtual host"
        # Without the domain's Host, the same path is the root's path-style S3.
        assert httpx.get(f"{endpoint}/vhost-bucket/dir/k.txt").content == b"virtual host"
