"""CopyObject and UploadPartCopy with boto3, and ETL views read by S3 clients that size
their reads by HEAD (boto3 ``download_file``, pyarrow)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from etl_runtime import Client

ETL = "s3-copy-shout"


def shout(data: bytes, args: str) -> bytes:
    return data.upper() * 3


def code(e: pytest.ExceptionInfo[ClientError]) -> str:
    return str(e.value.response["Error"]["Code"])


@pytest.fixture(scope="module")
def buckets(s3: Any) -> Any:
    for b in ("copy-a", "copy-b"):
        try:
            s3.create_bucket(Bucket=b)
        except ClientError:
            pass
    return s3


def test_copy_object_same_and_other_bucket_with_directives(buckets: Any) -> None:
    s3 = buckets
    s3.put_object(
        Bucket="copy-a",
        Key="src/one",
        Body=b"copied bytes",
        ContentType="text/plain",
        Metadata={"who": "me"},
        CacheControl="max-age=60",
    )
    etag = s3.head_object(Bucket="copy-a", Key="src/one")["ETag"]
    out = s3.copy_object(Bucket="copy-a", Key="dst/one", CopySource="copy-a/src/one")
    assert out["CopyObjectResult"]["ETag"] == etag
    got = s3.get_object(Bucket="copy-a", Key="dst/one")
    assert got["Body"].read() == b"copied bytes"
    assert (got["ContentType"], got["Metadata"], got["CacheControl"]) == (
        "text/plain",
        {"who": "me"},
        "max-age=60",
    )
    s3.copy_object(
        Bucket="copy-b",
        Key="other",
        CopySource={"Bucket": "copy-a", "Key": "src/one"},
        MetadataDirective="REPLACE",
        ContentType="application/json",
        Metadata={"new": "yes"},
    )
    got = s3.get_object(Bucket="copy-b", Key="other")
    assert got["Body"].read() == b"copied bytes"
    assert (got["ContentType"], got["Metadata"]) == ("application/json", {"new": "yes"})
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="copy-a", Key="src/one", CopySource="copy-a/src/one")
    assert code(e) == "InvalidRequest"
    s3.copy_object(
        Bucket="copy-a",
        Key="src/one",
        CopySource="copy-a/src/one",
        MetadataDirective="REPLACE",
        Metadata={"again": "1"},
    )
    assert s3.head_object(Bucket="copy-a", Key="src/one")["Metadata"] == {"again": "1"}
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="copy-a", Key="x", CopySource="copy-a/missing")
    assert code(e) == "NoSuchKey"


def test_copy_conditions(buckets: Any) -> None:
    s3 = buckets
    s3.put_object(Bucket="copy-a", Key="cond", Body=b"conditional")
    etag = s3.head_object(Bucket="copy-a", Key="cond")["ETag"]
    past, future = datetime(1994, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
    ok: list[dict[str, Any]] = [
        {"CopySourceIfMatch": etag},
        {"CopySourceIfNoneMatch": '"0000"'},
        {"CopySourceIfModifiedSince": past},
        {"CopySourceIfUnmodifiedSince": future},
    ]
    failing: list[dict[str, Any]] = [
        {"CopySourceIfMatch": '"0000"'},
        {"CopySourceIfNoneMatch": etag},
        {"CopySourceIfModifiedSince": future},
        {"CopySourceIfUnmodifiedSince": past},
    ]
    for i, kw in enumerate(ok):
        s3.copy_object(Bucket="copy-b", Key=f"cond-{i}", CopySource="copy-a/cond", **kw)
        assert s3.get_object(Bucket="copy-b", Key=f"cond-{i}")["Body"].read() == b"conditional"
    for i, kw in enumerate(failing):
        with pytest.raises(ClientError) as e:
            s3.copy_object(Bucket="copy-b", Key=f"nocond-{i}", CopySource="copy-a/cond", **kw)
        assert code(e) == "PreconditionFailed", kw
        with pytest.raises(ClientError):
            s3.head_object(Bucket="copy-b", Key=f"nocond-{i}")


def test_upload_part_copy_and_boto3_managed_copy(buckets: Any) -> None:
    s3 = buckets
    big = bytes(range(256)) * (24 << 10)  # 6 MiB
    s3.put_object(Bucket="copy-a", Key="big", Body=big)
    up = s3.create_multipart_upload(Bucket="copy-b", Key="assembled")["UploadId"]
    p1 = s3.upload_part_copy(
        Bucket="copy-b",
        Key="assembled",
        UploadId=up,
        PartNumber=1,
        CopySource="copy-a/big",
        CopySourceRange=f"bytes=0-{(5 << 20) - 1}",
    )
    p2 = s3.upload_part_copy(
        Bucket="copy-b", Key="assembled", UploadId=up, PartNumber=2, CopySource="copy-a/big"
    )
    s3.complete_multipart_upload(
        Bucket="copy-b",
        Key="assembled",
        UploadId=up,
        MultipartUpload={
            "Parts": [
                {"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]},
                {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]},
            ]
        },
    )
    got = s3.get_object(Bucket="copy-b", Key="assembled")["Body"].read()
    assert got == big[: 5 << 20] + big
    s3.copy({"Bucket": "copy-a", "Key": "big"}, "copy-b", "managed")  # s3transfer's copy
    assert s3.get_object(Bucket="copy-b", Key="managed")["Body"].read() == big


@pytest.fixture(scope="module")
def view(endpoint: str, buckets: Any) -> str:
    with Client(endpoint) as c:
        c.etl(ETL).init_code(transform=shout, timeout=120)
        buckets.create_bucket(Bucket="copy-view-src")
        buckets.put_object(Bucket="copy-view-src", Key="v.txt", Body=b"quiet words")
        c.bucket("copy-loud").create(view_of="copy-view-src", etl=ETL)
    return "copy-loud"


def test_views_through_s3_are_never_short(buckets: Any, view: str, tmp_path: Path) -> None:
    s3, expected = buckets, b"QUIET WORDS" * 3
    assert s3.head_object(Bucket=view, Key="v.txt")["ContentLength"] == len(expected)
    s3.download_file(view, "v.txt", str(tmp_path / "v"))
    assert (tmp_path / "v").read_bytes() == expected
    s3.copy_object(Bucket="copy-b", Key="from-view", CopySource=f"{view}/v.txt")
    assert s3.get_object(Bucket="copy-b", Key="from-view")["Body"].read() == expected


def test_pyarrow_reads_a_view(endpoint: str, writer: dict[str, Any], view: str) -> None:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=writer["access_key"],
        secret_key=writer["secret_key"],
        endpoint_override=f"{endpoint}/s3",
        region="us-east-1",
    )
    with fs.open_input_file(f"{view}/v.txt") as f:
        assert f.read() == b"QUIET WORDS" * 3
