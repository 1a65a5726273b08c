"""Content-Type and user metadata (``x-amz-meta-*``) through boto3: kept, read back, bounded."""

from __future__ import annotations

import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

MiB = 1 << 20


def test_put_object_keeps_content_type_and_metadata(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-meta")
    s3.put_object(
        Bucket="s3-meta",
        Key="cat.jpg",
        Body=b"\xff\xd8jpeg",
        ContentType="image/jpeg",
        Metadata={"label": "cat", "Source": "camera-2"},
    )
    head = s3.head_object(Bucket="s3-meta", Key="cat.jpg")
    assert head["ContentType"] == "image/jpeg"
    assert head["Metadata"] == {"label": "cat", "source": "camera-2"}  # keys lower-cased, as S3
    got = s3.get_object(Bucket="s3-meta", Key="cat.jpg")
    assert got["Body"].read() == b"\xff\xd8jpeg"
    assert got["ContentType"] == "image/jpeg" and got["Metadata"]["label"] == "cat"
    # A new version replaces the metadata with its own (none here), as S3 does.
    s3.put_object(Bucket="s3-meta", Key="cat.jpg", Body=b"v2")
    head = s3.head_object(Bucket="s3-meta", Key="cat.jpg")
    assert head["Metadata"] == {} and head["ContentType"] == "binary/octet-stream"


def test_metadata_over_2_kib_is_refused_and_nothing_is_stored(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-meta-big")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="s3-meta-big", Key="k", Body=b"x", Metadata={"blob": "x" * 2100})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "over 2048 bytes" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket="s3-meta-big", Key="k")
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_a_multipart_upload_keeps_the_metadata_it_was_created_with(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-meta-mpu")
    up = s3.create_multipart_upload(
        Bucket="s3-meta-mpu", Key="big.bin", ContentType="application/x-tar",
        Metadata={"shard": "7"},
    )  # fmt: skip
    parts = [os.urandom(5 * MiB), b"tail"]
    done = [
        {"PartNumber": n, "ETag": s3.upload_part(
            Bucket="s3-meta-mpu", Key="big.bin", UploadId=up["UploadId"], PartNumber=n, Body=body
        )["ETag"]}
        for n, body in enumerate(parts, 1)
    ]  # fmt: skip
    s3.complete_multipart_upload(
        Bucket="s3-meta-mpu", Key="big.bin", UploadId=up["UploadId"],
        MultipartUpload={"Parts": done},
    )  # fmt: skip
    head = s3.head_object(Bucket="s3-meta-mpu", Key="big.bin")
    assert head["ContentLength"] == 5 * MiB + 4
    assert head["ContentType"] == "application/x-tar" and head["Metadata"] == {"shard": "7"}
