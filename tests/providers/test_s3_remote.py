"""A remote (``aws``) bucket through Sluice's S3 API: boto3 reads MinIO's objects via Sluice,
cold from the backend once, then from the targets' cache."""

from __future__ import annotations

import os

from etl_runtime import Client
from tests.providers.conftest import metric
from tests.providers.minio import MinioServer
from tests.providers.test_remote import FETCHES, new_bucket
from tests.s3.conftest import make_key, s3_client


def test_boto3_reads_and_lists_a_remote_bucket_with_cache_on_read(
    endpoint: str, minio: MinioServer
) -> None:
    data = os.urandom(1 << 20)
    bucket = new_bucket(minio, {"train/a.bin": data, "train/b.bin": b"b" * 10, "top.txt": b"t"})
    with Client(endpoint) as client:
        client.bucket(bucket, provider="aws").create()
    s3 = s3_client(endpoint, make_key(endpoint, "write"))
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="train/")
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [
        ("train/a.bin", len(data)),
        ("train/b.bin", 10),
    ]
    before = metric(endpoint, FETCHES)
    assert s3.get_object(Bucket=bucket, Key="train/a.bin")["Body"].read() == data
    assert metric(endpoint, FETCHES) == before + 1  # cold: one backend fetch
    part = s3.get_object(Bucket=bucket, Key="train/a.bin", Range="bytes=10-19")["Body"].read()
    assert part == data[10:20]
    assert s3.get_object(Bucket=bucket, Key="train/a.bin")["Body"].read() == data
    assert metric(endpoint, FETCHES) == before + 1  # warm: served by the target's cache
    s3.put_object(Bucket=bucket, Key="new.txt", Body=b"written through")
    backend = minio.client().get_object(Bucket=bucket, Key="new.txt")["Body"].read()
    assert backend == b"written through"
