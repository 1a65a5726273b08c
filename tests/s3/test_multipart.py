"""Multipart uploads: boto3's own switch above 8 MB, and the calls one by one."""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

MiB = 1 << 20


def test_upload_fileobj_40mb_reads_back_identical(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-multipart")
    data = os.urandom(40 * MiB)
    calls: list[str] = []

    def count(model: Any, **kwargs: Any) -> None:
        calls.append(model.name)

    s3.meta.events.register("before-call.s3", count)
    try:
        s3.upload_fileobj(io.BytesIO(data), "s3-multipart", "big/40mb.bin")
    finally:
        s3.meta.events.unregister("before-call.s3", count)
    assert calls.count("UploadPart") == 5 and "CompleteMultipartUpload" in calls  # 8 MiB parts
    got = s3.get_object(Bucket="s3-multipart", Key="big/40mb.bin")
    assert got["ContentLength"] == len(data)
    assert hashlib.sha256(got["Body"].read()).digest() == hashlib.sha256(data).digest()
    out = io.BytesIO()
    s3.download_fileobj("s3-multipart", "big/40mb.bin", out)  # ranged GETs
    assert out.getvalue() == data
    listed = s3.list_objects_v2(Bucket="s3-multipart")
    assert [o["Key"] for o in listed["Contents"]] == ["big/40mb.bin"]  # no parts left, none shown


def test_multipart_calls(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-mpu-calls")
    up = s3.create_multipart_upload(Bucket="s3-mpu-calls", Key="joined")
    uid = up["UploadId"]
    parts = [os.urandom(5 * MiB), b"tail"]
    etags = []
    for n, body in enumerate(parts, 1):
        r = s3.upload_part(
            Bucket="s3-mpu-calls", Key="joined", UploadId=uid, PartNumber=n, Body=body
        )
        assert r["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        etags.append(r["ETag"])
    listed = s3.list_parts(Bucket="s3-mpu-calls", Key="joined", UploadId=uid)
    assert [(p["PartNumber"], p["Size"]) for p in listed["Parts"]] == [(1, 5 * MiB), (2, 4)]
    with pytest.raises(ClientError) as e:  # wrong ETag
        s3.complete_multipart_upload(
            Bucket="s3-mpu-calls",
            Key="joined",
            UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00"'}]},
        )
    assert e.value.response["Error"]["Code"] == "InvalidPart"
    done = s3.complete_multipart_upload(
        Bucket="s3-mpu-calls",
        Key="joined",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(etags)]},
    )
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert done["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-2"'
    assert s3.get_object(Bucket="s3-mpu-calls", Key="joined")["Body"].read() == b"".join(parts)
    with pytest.raises(ClientError) as e:  # completed: the upload is gone
        s3.list_parts(Bucket="s3-mpu-calls", Key="joined", UploadId=uid)
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"

    other = s3.create_multipart_upload(Bucket="s3-mpu-calls", Key="dropped")["UploadId"]
    s3.upload_part(Bucket="s3-mpu-calls", Key="dropped", UploadId=other, PartNumber=1, Body=b"x")
    with pytest.raises(ClientError) as e:  # an upload id belongs to its key
        s3.list_parts(Bucket="s3-mpu-calls", Key="joined", UploadId=other)
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"
    s3.abort_multipart_upload(Bucket="s3-mpu-calls", Key="dropped", UploadId=other)
    with pytest.raises(ClientError) as e:
        s3.upload_part(
            Bucket="s3-mpu-calls", Key="dropped", UploadId=other, PartNumber=2, Body=b"y"
        )
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="s3-mpu-calls")["Contents"]] == ["joined"]
