"""The same boto3 calls against Sluice and the project's MinIO (scripts/minio.sh), and the
same answers: error codes and statuses for the edge cases clients meet, listing
pagination, conditional requests. Each scenario runs on both servers and records what a
client sees (a value, or the error's status and code); the two records must be equal."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.providers.minio import ACCESS_KEY, REGION, SECRET_KEY, MinioServer
from tests.s3.conftest import CONFIG

Scenario = Callable[[Any, str], list[Any]]


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data: Path = tmp_path_factory.mktemp("minio-side") / "data"
    data.mkdir()
    server = MinioServer(data).start()
    try:
        yield boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=CONFIG,
        )
    finally:
        server.stop()


def seen(call: Callable[[], Any]) -> Any:
    """What a client sees of one call: its value, or ("error", status, code)."""
    try:
        return call()
    except ClientError as e:
        error = e.response.get("Error", {})
        return ("error", e.response["ResponseMetadata"]["HTTPStatusCode"], error.get("Code"))


def both(s3: Any, minio: Any, bucket: str, scenario: Scenario) -> None:
    answers = []
    for client in (s3, minio):
        client.create_bucket(Bucket=bucket)
        answers.append(scenario(client, bucket))
    sluice, theirs = answers
    assert sluice == theirs, "\n".join(
        f"step {i}: sluice {a!r}, minio {b!r}"
        for i, (a, b) in enumerate(zip(sluice, theirs, strict=False))
        if a != b
    )


def errors_scenario(c: Any, b: str) -> list[Any]:
    c.put_object(Bucket=b, Key="small", Body=b"0123456789")
    md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    up = c.create_multipart_upload(Bucket=b, Key="mp")["UploadId"]
    p1 = c.upload_part(Bucket=b, Key="mp", UploadId=up, PartNumber=1, Body=b"a" * 1024)
    p2 = c.upload_part(Bucket=b, Key="mp", UploadId=up, PartNumber=2, Body=b"b" * 1024)
    return [
        seen(lambda: c.get_object(Bucket=b, Key="missing")),
        seen(lambda: c.head_object(Bucket=b, Key="missing")),
        seen(lambda: c.get_object(Bucket=b + "-none", Key="k")),
        seen(lambda: c.list_objects_v2(Bucket=b + "-none")),
        seen(lambda: c.head_bucket(Bucket=b + "-none")),
        seen(lambda: c.create_bucket(Bucket=b)),
        seen(lambda: c.delete_bucket(Bucket=b)),  # not empty
        seen(lambda: c.get_object(Bucket=b, Key="small", Range="bytes=100-200")),
        seen(lambda: c.get_object(Bucket=b, Key="small", Range="bytes=2-4")["Body"].read()),
        seen(lambda: c.get_object(Bucket=b, Key="small", Range="bytes=-3")["ContentRange"]),
        seen(
            lambda: c.delete_object(Bucket=b, Key="missing")["ResponseMetadata"]["HTTPStatusCode"]
        ),
        seen(lambda: c.put_object(Bucket=b, Key="bad-md5", Body=b"data", ContentMD5=md5)),
        seen(lambda: c.head_object(Bucket=b, Key="bad-md5")),  # nothing stored
        seen(lambda: c.upload_part(Bucket=b, Key="mp", UploadId="nosuch", PartNumber=1, Body=b"x")),
        seen(
            lambda: c.complete_multipart_upload(
                Bucket=b,
                Key="mp",
                UploadId=up,
                MultipartUpload={
                    "Parts": [
                        {"PartNumber": 1, "ETag": p1["ETag"]},
                        {"PartNumber": 2, "ETag": p2["ETag"]},
                    ]
                },
            )
        ),  # parts under 5 MiB
        seen(
            lambda: c.complete_multipart_upload(
                Bucket=b,
                Key="mp",
                UploadId=up,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"' + "0" * 32 + '"'}]},
            )
        ),  # a wrong ETag
        seen(lambda: c.abort_multipart_upload(Bucket=b, Key="mp", UploadId=up) and "aborted"),
        seen(lambda: c.list_parts(Bucket=b, Key="mp", UploadId=up)),
    ]


def names_scenario(c: Any, b: str) -> list[Any]:
    out = []
    for name in (
        "a",
        "ab",
        "Upper-case",
        "under_score",
        "192.168.5.4",
        "dot..dot",
        "-start",
        "x" * 64,
    ):
        out.append(seen(lambda name=name: c.create_bucket(Bucket=name)))
    c.put_object(Bucket=b, Key="dir/", Body=b"")
    c.put_object(Bucket=b, Key="dir/x", Body=b"x")
    listing = c.list_objects_v2(Bucket=b)
    out.append([(o["Key"], o["Size"]) for o in listing["Contents"]])
    out.append(seen(lambda: c.head_object(Bucket=b, Key="dir/")["ContentLength"]))
    return out


KEYS = ["a/1", "a/2", "b/1", "b/2/x", "c", "d", "e/f/g"]


def pages(c: Any, **kw: Any) -> list[Any]:
    """Every page of a V2 listing: its keys, common prefixes, truncation."""
    out, token = [], None
    while True:
        page = c.list_objects_v2(**kw, **({"ContinuationToken": token} if token else {}))
        out.append(
            (
                [o["Key"] for o in page.get("Contents", [])],
                [p["Prefix"] for p in page.get("CommonPrefixes", [])],
                page["IsTruncated"],
                page["KeyCount"],
            )
        )
        token = page.get("NextContinuationToken")
        if not page["IsTruncated"] or len(out) > 20:
            return out


def v1_pages(c: Any, **kw: Any) -> list[Any]:
    out, marker = [], ""
    while True:
        page = c.list_objects(**kw, Marker=marker)
        keys = [o["Key"] for o in page.get("Contents", [])]
        prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        out.append((keys, prefixes, page["IsTruncated"]))
        if not page["IsTruncated"] or len(out) > 20:
            return out
        marker = page.get("NextMarker") or (keys or prefixes)[-1]


def listing_scenario(c: Any, b: str) -> list[Any]:
    for k in KEYS:
        c.put_object(Bucket=b, Key=k, Body=k.encode())
    return [
        pages(c, Bucket=b, MaxKeys=2),
        pages(c, Bucket=b, MaxKeys=2, Delimiter="/"),
        pages(c, Bucket=b, MaxKeys=1, Delimiter="/", Prefix="b/"),
        pages(c, Bucket=b, StartAfter="b/1"),
        pages(c, Bucket=b, Prefix="a/", Delimiter="/"),
        pages(c, Bucket=b, Prefix="zzz"),
        v1_pages(c, Bucket=b, MaxKeys=2, Delimiter="/"),
        v1_pages(c, Bucket=b, MaxKeys=3),
        seen(lambda: c.list_objects_v2(Bucket=b, MaxKeys=0)["IsTruncated"]),
    ]


def conditions_scenario(c: Any, b: str) -> list[Any]:
    etag = c.put_object(Bucket=b, Key="k", Body=b"version one")["ETag"]
    past, future = datetime(1994, 1, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(days=2)
    recent = datetime.now(UTC) - timedelta(days=2)

    def body(**kw: Any) -> Any:
        return c.get_object(Bucket=b, Key="k", **kw)["Body"].read()

    return [
        seen(lambda: body(IfMatch=etag)),
        seen(lambda: body(IfMatch='"0123456789abcdef0123456789abcdef"')),
        seen(lambda: body(IfNoneMatch=etag)),
        seen(lambda: body(IfNoneMatch='"0123456789abcdef0123456789abcdef"')),
        seen(lambda: body(IfModifiedSince=recent)),
        seen(lambda: body(IfModifiedSince=future)),
        seen(lambda: body(IfUnmodifiedSince=past)),
        seen(lambda: body(IfUnmodifiedSince=future)),
        seen(lambda: body(IfMatch=etag, IfUnmodifiedSince=past)),  # If-Match wins
        seen(lambda: body(IfNoneMatch=etag, IfModifiedSince=past)),  # S3's rule: 304
        seen(lambda: c.head_object(Bucket=b, Key="k", IfNoneMatch=etag)),
        seen(lambda: c.head_object(Bucket=b, Key="k", IfMatch='"0"')),
        seen(lambda: c.put_object(Bucket=b, Key="k", Body=b"two", IfNoneMatch="*")),
        seen(lambda: c.put_object(Bucket=b, Key="k", Body=b"two", IfMatch='"0"')),
        seen(lambda: c.put_object(Bucket=b, Key="new", Body=b"n", IfNoneMatch="*") and "stored"),
        seen(lambda: c.put_object(Bucket=b, Key="k", Body=b"two", IfMatch=etag) and "replaced"),
        seen(lambda: body()),
        seen(
            lambda: c.copy_object(
                Bucket=b, Key="copy", CopySource=f"{b}/k", CopySourceIfMatch='"0"'
            )
        ),
        seen(
            lambda: c.copy_object(
                Bucket=b, Key="copy", CopySource=f"{b}/k", CopySourceIfUnmodifiedSince=past
            )
        ),
        seen(lambda: c.head_object(Bucket=b, Key="copy")),  # nothing written
    ]


def part_numbers_scenario(c: Any, b: str) -> list[Any]:
    c.put_object(Bucket=b, Key="single", Body=b"0123456789")
    up = c.create_multipart_upload(Bucket=b, Key="mp")["UploadId"]
    done = []
    for n, body in enumerate([b"a" * (5 << 20), b"b" * 1000], 1):
        etag = c.upload_part(Bucket=b, Key="mp", UploadId=up, PartNumber=n, Body=body)["ETag"]
        done.append({"PartNumber": n, "ETag": etag})
    c.complete_multipart_upload(Bucket=b, Key="mp", UploadId=up, MultipartUpload={"Parts": done})

    def part(op: str, key: str, n: int, **kw: Any) -> Any:
        r = getattr(c, f"{op}_object")(Bucket=b, Key=key, PartNumber=n, **kw)
        got = [r["ResponseMetadata"]["HTTPStatusCode"], r["ContentLength"], r.get("ContentRange")]
        got.append(r.get("PartsCount"))
        if op == "get":
            got.append(hashlib.md5(r["Body"].read()).hexdigest())
        return got

    return [
        seen(lambda op=op, key=key, n=n: part(op, key, n))
        for key in ("single", "mp")
        for n in (1, 2, 3)
        for op in ("get", "head")
    ] + [seen(lambda: part("get", "mp", 1, Range="bytes=0-1"))]


def test_errors_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "side-errors", errors_scenario)


def test_bucket_names_and_folders_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "side-names", names_scenario)


def test_listing_pages_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "side-listing", listing_scenario)


def test_conditional_requests_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "side-conditions", conditions_scenario)


def test_get_by_part_number_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "side-parts", part_numbers_scenario)
