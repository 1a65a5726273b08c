"""S3 behaviours Ceph's s3-tests checks (docs/s3-api.md, "Conformance"), each against Sluice
and, where S3 and MinIO agree, the project's MinIO with the same boto3 calls.

ListObjectVersions of a bucket without versioning (what s3-tests and ``aws s3 rb`` tooling
use to empty a bucket), ``response-*`` overrides on GET, ``If-None-Match: ETAG`` on writes,
the listing's ``Owner``, and copy sources whose key holds ``?`` or a space."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.providers.minio import ACCESS_KEY, REGION, SECRET_KEY, MinioServer
from tests.s3.conftest import CONFIG
from tests.s3.test_side_by_side import both, seen

NO_ETAG = '"00000000000000000000000000000000"'


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data: Path = tmp_path_factory.mktemp("minio-conformance") / "data"
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


def versions_scenario(c: Any, b: str) -> list[Any]:
    for k in ("a", "b/1", "b/2", "c"):
        c.put_object(Bucket=b, Key=k, Body=k.encode())

    def versions(**kw: Any) -> list[Any]:
        r = c.list_object_versions(Bucket=b, **kw)
        listed = [(v["Key"], v["VersionId"], v["IsLatest"], v["Size"]) for v in r["Versions"]]
        prefixes = [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        return [listed, prefixes, r["IsTruncated"], "DeleteMarkers" in r]

    def drop(*objects: dict[str, str]) -> Any:
        return c.delete_objects(Bucket=b, Delete={"Objects": list(objects)})["Deleted"]

    return [
        seen(lambda: versions(MaxKeys=2)),
        seen(lambda: versions(KeyMarker="b/1")),
        seen(lambda: versions(Delimiter="/")),
        seen(lambda: versions(Prefix="b/")),
        seen(lambda: drop({"Key": "a", "VersionId": "null"}, {"Key": "c"})),
        seen(lambda: [o["Key"] for o in c.list_objects_v2(Bucket=b)["Contents"]]),
        seen(lambda: c.list_objects_v2(Bucket=b, FetchOwner=True)["Contents"][0]["Owner"] != {}),
        seen(lambda: "Owner" in c.list_objects_v2(Bucket=b)["Contents"][0]),
        seen(lambda: "Owner" in c.list_objects(Bucket=b)["Contents"][0]),
    ]


def overrides_scenario(c: Any, b: str) -> list[Any]:
    c.put_object(Bucket=b, Key="k", Body=b"data", ContentType="text/csv")
    asked = {
        "ResponseContentType": "application/pdf",
        "ResponseContentDisposition": 'attachment; filename="report.pdf"',
        "ResponseCacheControl": "no-cache",
        "ResponseExpires": "Thu, 01 Dec 1994 16:00:00 GMT",
        "ResponseContentLanguage": "en",
        "ResponseContentEncoding": "identity",
    }
    names = ("content-type", "content-disposition", "cache-control", "expires")
    names += ("content-language", "content-encoding")

    def headers(op: str, **kw: Any) -> list[Any]:
        r = getattr(c, f"{op}_object")(Bucket=b, Key="k", **kw)
        h = r["ResponseMetadata"]["HTTPHeaders"]
        return [h.get(n) for n in names]

    url = c.generate_presigned_url(
        "get_object", Params={"Bucket": b, "Key": "k", "ResponseContentDisposition": "attachment"}
    )
    etag = c.head_object(Bucket=b, Key="k")["ETag"]
    linked = httpx.get(url, timeout=10)
    return [
        seen(lambda: headers("get", **asked)),
        seen(lambda: headers("get", ResponseContentType="a/b", Range="bytes=0-1")),
        seen(lambda: headers("head", ResponseContentType="a/b")),
        seen(lambda: headers("get")),  # nothing stored from the overrides
        (linked.status_code, linked.headers.get("content-disposition"), linked.content),
        seen(lambda: c.get_object(Bucket=b, Key="k", IfNoneMatch=etag, ResponseContentType="a/b")),
    ]


def if_none_match_scenario(c: Any, b: str) -> list[Any]:
    etag = c.put_object(Bucket=b, Key="k", Body=b"one")["ETag"]

    def put(key: str, body: bytes, condition: str) -> Any:
        return c.put_object(Bucket=b, Key=key, Body=body, IfNoneMatch=condition)["ETag"]

    def complete(condition: str) -> Any:
        up = c.create_multipart_upload(Bucket=b, Key="k")["UploadId"]
        part = c.upload_part(Bucket=b, Key="k", UploadId=up, PartNumber=1, Body=b"mp")
        done = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        return c.complete_multipart_upload(
            Bucket=b, Key="k", UploadId=up, MultipartUpload=done, IfNoneMatch=condition
        )["Key"]

    return [
        seen(lambda: put("k", b"two", etag)),  # that version is there: 412
        seen(lambda: c.get_object(Bucket=b, Key="k")["Body"].read()),  # nothing written
        seen(lambda: put("k", b"two", NO_ETAG)),  # another version: written
        seen(lambda: put("new", b"n", NO_ETAG)),  # none: written
        seen(lambda: complete(c.head_object(Bucket=b, Key="k")["ETag"])),
        seen(lambda: complete(NO_ETAG)),
        seen(lambda: c.get_object(Bucket=b, Key="k")["Body"].read()),
    ]


def copy_names_scenario(c: Any, b: str) -> list[Any]:
    out = []
    for key in (" ", "?versionId", "q?x=1", "a%b", "_ _"):
        c.put_object(Bucket=b, Key=key, Body=key.encode())

        def copied(key: str = key) -> Any:
            c.copy_object(Bucket=b, Key="dst", CopySource={"Bucket": b, "Key": key})
            return c.get_object(Bucket=b, Key="dst")["Body"].read()

        def part_copied(key: str = key) -> Any:
            up = c.create_multipart_upload(Bucket=b, Key="mp")["UploadId"]
            r = c.upload_part_copy(
                Bucket=b, Key="mp", UploadId=up, PartNumber=1, CopySource={"Bucket": b, "Key": key}
            )
            done = {"Parts": [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}]}
            c.complete_multipart_upload(Bucket=b, Key="mp", UploadId=up, MultipartUpload=done)
            return c.get_object(Bucket=b, Key="mp")["Body"].read()

        out += [seen(copied), seen(part_copied)]
    source = {"Bucket": b, "Key": " ", "VersionId": "null"}  # the one version of a key
    out.append(seen(lambda: c.copy_object(Bucket=b, Key="dst", CopySource=source) and "copied"))
    return out


def test_list_object_versions_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "conf-versions", versions_scenario)


def test_response_header_overrides_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "conf-overrides", overrides_scenario)


def test_if_none_match_etag_on_writes_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "conf-if-none", if_none_match_scenario)


def test_copy_source_names_as_minio(s3: Any, minio: Any) -> None:
    both(s3, minio, "conf-copy-names", copy_names_scenario)


def test_version_arguments_s3_refuses(s3: Any) -> None:
    """What S3 answers for a bucket without versioning, where MinIO is looser."""
    s3.create_bucket(Bucket="conf-version-args")
    b = "conf-version-args"
    s3.put_object(Bucket=b, Key="k", Body=b"kept")
    page = s3.list_object_versions(Bucket=b, MaxKeys=1, Prefix="k")
    assert (page["IsTruncated"], page.get("NextVersionIdMarker")) == (False, None)
    s3.put_object(Bucket=b, Key="l", Body=b"l")
    page = s3.list_object_versions(Bucket=b, MaxKeys=1)
    assert (page["NextKeyMarker"], page["NextVersionIdMarker"]) == ("k", "null")
    rest = s3.list_object_versions(Bucket=b, KeyMarker="k", VersionIdMarker="null")
    assert [v["Key"] for v in rest["Versions"]] == ["l"]
    for kw in ({"VersionIdMarker": "null"}, {"KeyMarker": "k", "VersionIdMarker": "v2"}):
        assert seen(lambda kw=kw: s3.list_object_versions(Bucket=b, **kw)) == (
            "error",
            400,
            "InvalidArgument",
        )
    other = {"Key": "k", "VersionId": "3b2f6c1a-0000-0000-0000-000000000000"}
    errors = s3.delete_objects(Bucket=b, Delete={"Objects": [other]})["Errors"]
    assert [(e["Key"], e["Code"]) for e in errors] == [("k", "NoSuchVersion")]
    assert s3.get_object(Bucket=b, Key="k")["Body"].read() == b"kept"  # not deleted
    source = {"Bucket": b, "Key": "k", "VersionId": "v2"}
    assert seen(lambda: s3.copy_object(Bucket=b, Key="c", CopySource=source)) == (
        "error",
        404,
        "NoSuchVersion",
    )
    etag = s3.head_object(Bucket=b, Key="k")["ETag"]
    assert seen(lambda: s3.put_object(Bucket=b, Key="k", IfNoneMatch=f"{NO_ETAG}, {etag}")) == (
        "error",
        412,
        "PreconditionFailed",
    )  # HTTP's list: any ETag named (MinIO reads the first only)
    listed = s3.list_objects_v2(Bucket=b, ContinuationToken="")
    assert (listed["ContinuationToken"], listed["KeyCount"]) == ("", 2)
    # ?versions names a bucket's listing only; on an object it is still refused
    r = httpx.get(f"{s3.meta.endpoint_url}/{b}/k?versions", timeout=10)
    assert r.status_code == 501 and b"NotImplemented" in r.content


def test_response_overrides_refused_when_anonymous_or_unknown(endpoint: str, s3: Any) -> None:
    s3.create_bucket(Bucket="conf-anon")
    s3.put_object(Bucket="conf-anon", Key="k", Body=b"x")
    url = f"{endpoint}/s3/conf-anon/k"
    anonymous = httpx.get(url, params={"response-content-type": "a/b"}, timeout=10)
    assert anonymous.status_code == 400 and b"InvalidRequest" in anonymous.content
    assert httpx.get(url, timeout=10).headers["content-type"] == "binary/octet-stream"
    unknown = httpx.get(url, params={"response-content-typo": "a/b"}, timeout=10)
    assert unknown.status_code == 400 and b"response-content-typo" in unknown.content
    signed = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "conf-anon", "Key": "k", "ResponseContentType": "a\nb"}
    )
    injected = httpx.get(signed, timeout=10)
    assert injected.status_code == 400 and b"response-content-type" in injected.content


def test_a_retried_complete_gets_the_same_answer(s3: Any) -> None:
    """S3 answers a CompleteMultipartUpload sent again (its answer lost) as the first time;
    the upload is otherwise gone: its parts, ListParts, another parts list, abort."""
    b = "conf-recomplete"
    s3.create_bucket(Bucket=b)
    up = s3.create_multipart_upload(Bucket=b, Key="k")["UploadId"]
    done = []
    for n, body in enumerate([b"a" * (5 << 20), b"tail"], 1):
        r = s3.upload_part(Bucket=b, Key="k", UploadId=up, PartNumber=n, Body=body)
        done.append({"PartNumber": n, "ETag": r["ETag"]})

    def complete(parts: list[dict[str, Any]]) -> Any:
        return s3.complete_multipart_upload(
            Bucket=b, Key="k", UploadId=up, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
        )["ETag"]

    first = complete(done)
    assert first.endswith('-2"')
    assert seen(lambda: complete(done)) == first  # If-None-Match was for the first one
    gone = ("error", 404, "NoSuchUpload")
    assert seen(lambda: complete(done[:1])) == gone
    assert seen(lambda: s3.list_parts(Bucket=b, Key="k", UploadId=up)) == gone
    assert seen(lambda: s3.abort_multipart_upload(Bucket=b, Key="k", UploadId=up)) == gone
    assert not s3.list_multipart_uploads(Bucket=b).get("Uploads")
    assert s3.get_object(Bucket=b, Key="k")["ContentLength"] == (5 << 20) + 4


def test_a_presigned_url_of_zero_seconds_is_expired(s3: Any, writer: dict[str, Any]) -> None:
    s3.create_bucket(Bucket="conf-expiry")
    s3.put_object(Bucket="conf-expiry", Key="k", Body=b"x")
    credentials = Credentials(writer["access_key"], writer["secret_key"])
    request = AWSRequest("GET", f"{s3.meta.endpoint_url}/conf-expiry/k")
    S3SigV4QueryAuth(credentials, "s3", "us-east-1", expires=0).add_auth(request)  # no CRT
    r = httpx.get(request.url, timeout=10)
    assert r.status_code == 403 and b"expired" in r.content


def test_list_buckets_pages(s3: Any) -> None:
    for n in (1, 2, 3):
        s3.create_bucket(Bucket=f"conf-lb-{n}")
    first = s3.list_buckets(Prefix="conf-lb-", MaxBuckets=2)
    assert [b["Name"] for b in first["Buckets"]] == ["conf-lb-1", "conf-lb-2"]
    assert first["Prefix"] == "conf-lb-"
    rest = s3.list_buckets(
        Prefix="conf-lb-", MaxBuckets=2, ContinuationToken=first["ContinuationToken"]
    )
    assert [b["Name"] for b in rest["Buckets"]] == ["conf-lb-3"]
    assert "ContinuationToken" not in rest
    everything = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert {"conf-lb-1", "conf-lb-2", "conf-lb-3"} <= set(everything)
    assert everything == sorted(everything)
    assert seen(lambda: s3.list_buckets(MaxBuckets=10001)) == ("error", 400, "InvalidArgument")


def test_utf8_metadata_is_signed_as_sent_and_kept_mail_safe(s3: Any, minio: Any) -> None:
    """botocore signs a UTF-8 ``x-amz-meta-*`` value as its UTF-8 bytes: verified as such,
    and stored RFC 2047-encoded as S3 and MinIO keep it (a 403 and then a 500 before)."""

    def put_utf8(c: Any, b: str) -> list[Any]:
        def header(**kw: Any) -> None:
            kw["params"]["headers"]["x-amz-meta-meta1"] = "Hello World\xe9"
            kw["params"]["headers"]["Content-Disposition"] = 'attachment; filename="\u00e9t\u00e9"'

        c.meta.events.register("before-call.s3.PutObject", header)
        try:
            c.put_object(Bucket=b, Key="k", Body=b"bar")
        finally:
            c.meta.events.unregister("before-call.s3.PutObject", header)
        r = c.get_object(Bucket=b, Key="k")
        return [r["Metadata"], r["Body"].read()]

    both(s3, minio, "conf-utf8-meta", put_utf8)


def test_a_key_that_is_also_a_prefix_as_s3(s3: Any) -> None:
    """S3 keeps ``foo/bar`` beside ``foo/bar/x`` (s3-tests' listing tests write such keys),
    whichever comes first and on whichever target both land. (The project's single-drive
    MinIO stores them but lists only the shortest: not a reference here.)"""
    b = "conf-prefix-keys"
    s3.create_bucket(Bucket=b)
    keys = ["foo/bar", "foo/bar/x", "foo", "foo/bar/x/y"]
    keys += [f"p{i}/q" for i in range(6)] + [f"p{i}" for i in range(6)]  # dirs first
    keys += [f"r{i}" for i in range(6)] + [f"r{i}/s" for i in range(6)]  # objects first
    for k in keys:
        s3.put_object(Bucket=b, Key=k, Body=k.encode())
    for k in keys:
        assert s3.get_object(Bucket=b, Key=k)["Body"].read() == k.encode(), k
        assert s3.head_object(Bucket=b, Key=k)["ContentLength"] == len(k), k
    listed = s3.list_objects_v2(Bucket=b)
    assert [o["Key"] for o in listed["Contents"]] == sorted(keys)
    top = s3.list_objects_v2(Bucket=b, Delimiter="/", Prefix="foo/")
    assert [o["Key"] for o in top["Contents"]] == ["foo/bar"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["foo/bar/"]
    # Copied onto, uploaded in parts onto, deleted from under the others.
    s3.copy_object(Bucket=b, Key="r0", CopySource=f"{b}/foo")
    assert s3.get_object(Bucket=b, Key="r0")["Body"].read() == b"foo"
    up = s3.create_multipart_upload(Bucket=b, Key="p1")["UploadId"]
    etag = s3.upload_part(Bucket=b, Key="p1", UploadId=up, PartNumber=1, Body=b"parts")["ETag"]
    s3.complete_multipart_upload(
        Bucket=b,
        Key="p1",
        UploadId=up,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert s3.get_object(Bucket=b, Key="p1")["Body"].read() == b"parts"
    s3.delete_object(Bucket=b, Key="foo/bar")
    assert seen(lambda: s3.head_object(Bucket=b, Key="foo/bar")) == ("error", 404, "404")
    assert s3.get_object(Bucket=b, Key="foo/bar/x")["Body"].read() == b"foo/bar/x"
    remaining = sorted(set(keys) - {"foo/bar"})
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]] == remaining
