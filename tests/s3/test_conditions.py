"""Conditional requests as S3 specifies them: GET/HEAD by date, conditional PUT and
CompleteMultipartUpload, and the native GET with the same date conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

PAST, FUTURE = datetime(1994, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)


def status(e: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = e.value.response
    return str(r["Error"]["Code"]), int(r["ResponseMetadata"]["HTTPStatusCode"])


@pytest.fixture(scope="module")
def bucket(s3: Any) -> str:
    s3.create_bucket(Bucket="conditions")
    s3.put_object(Bucket="conditions", Key="k", Body=b"version one")
    return "conditions"


def test_get_and_head_by_date(s3: Any, bucket: str, endpoint: str) -> None:
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as e:
            call(Bucket=bucket, Key="k", IfUnmodifiedSince=PAST)
        assert status(e)[1] == 412
        with pytest.raises(ClientError) as e:
            call(Bucket=bucket, Key="k", IfModifiedSince=FUTURE)
        assert status(e)[1] == 304
        call(Bucket=bucket, Key="k", IfModifiedSince=PAST)
        call(Bucket=bucket, Key="k", IfUnmodifiedSince=FUTURE)
    etag = s3.head_object(Bucket=bucket, Key="k")["ETag"]
    # If-Match wins over a failing If-Unmodified-Since; If-None-Match over If-Modified-Since.
    got = s3.get_object(Bucket=bucket, Key="k", IfMatch=etag, IfUnmodifiedSince=PAST)
    assert got["Body"].read() == b"version one"
    got = s3.get_object(Bucket=bucket, Key="k", IfNoneMatch='"0000"', IfModifiedSince=FUTURE)
    assert got["Body"].read() == b"version one"
    native = f"{endpoint}/v1/objects/{bucket}/k"
    old = "Sat, 01 Jan 1994 00:00:00 GMT"
    later = "Fri, 01 Jan 2100 00:00:00 GMT"
    r = httpx.get(native, headers={"If-Unmodified-Since": old}, follow_redirects=True)
    assert r.status_code == 412
    r = httpx.get(native, headers={"If-Modified-Since": later}, follow_redirects=True)
    assert r.status_code == 304 and r.content == b""
    r = httpx.get(native, headers={"If-Modified-Since": "not a date"}, follow_redirects=True)
    assert r.status_code == 200 and r.content == b"version one"


def test_conditional_put(s3: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k", Body=b"overwrite", IfNoneMatch="*")
    assert status(e) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k", Body=b"overwrite", IfMatch='"0000"')
    assert status(e) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"version one"
    s3.put_object(Bucket=bucket, Key="new", Body=b"first", IfNoneMatch="*")
    etag = s3.head_object(Bucket=bucket, Key="new")["ETag"]
    s3.put_object(Bucket=bucket, Key="new", Body=b"second", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="new")["Body"].read() == b"second"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="absent", Body=b"x", IfMatch=etag)
    assert status(e)[1] == 404


def test_conditional_complete(s3: Any, bucket: str) -> None:
    up = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="k", UploadId=up, PartNumber=1, Body=b"parted")
    parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=up, MultipartUpload=parts, IfNoneMatch="*"
        )
    assert status(e) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"version one"
    etag = s3.head_object(Bucket=bucket, Key="k")["ETag"]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="k", UploadId=up, MultipartUpload=parts, IfMatch=etag
    )
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"parted"
