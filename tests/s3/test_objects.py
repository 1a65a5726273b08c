"""boto3 against the gateway's S3 API: buckets, objects, conditions, listings, deletes."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError


def code(e: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = e.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


def test_buckets(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-buckets")
    s3.head_bucket(Bucket="s3-buckets")
    assert "s3-buckets" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="s3-buckets")
    assert code(e) == ("BucketAlreadyOwnedByYou", 409)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket="no-such-bucket")
    assert code(e)[1] == 404
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="no-such-bucket")
    assert code(e) == ("NoSuchBucket", 404)
    s3.put_object(Bucket="s3-buckets", Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket="s3-buckets")
    assert code(e) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket="s3-buckets", Key="k")
    s3.delete_bucket(Bucket="s3-buckets")
    assert "s3-buckets" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_put_get_head_delete(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-objects")
    data = bytes(range(256)) * 400
    md5 = hashlib.md5(data).hexdigest()
    put = s3.put_object(Bucket="s3-objects", Key="dir/a b+c.bin", Body=data, Metadata={"m": "1"})
    assert put["ETag"] == f'"{md5}"'
    got = s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin")
    assert got["Body"].read() == data and got["ETag"] == f'"{md5}"'
    assert got["ContentLength"] == len(data)
    assert got["ContentType"] == "binary/octet-stream"  # none given: S3's default
    assert got["Metadata"] == {"m": "1"}
    head = s3.head_object(Bucket="s3-objects", Key="dir/a b+c.bin")
    assert head["ContentLength"] == len(data) and head["ETag"] == f'"{md5}"'
    part = s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", Range="bytes=10-19")
    assert part["Body"].read() == data[10:20]
    assert part["ContentRange"] == f"bytes 10-19/{len(data)}"
    assert (
        s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", Range="bytes=-5")["Body"].read()
        == data[-5:]
    )
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", Range=f"bytes={len(data)}-")
    assert code(e) == ("InvalidRange", 416)
    ok = s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", IfMatch=f'"{md5}"')
    assert ok["Body"].read() == data
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", IfMatch='"0000"')
    assert code(e) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin", IfNoneMatch=f'"{md5}"')
    assert code(e)[1] == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-objects", Key="missing")
    assert code(e) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="s3-objects", Key="missing")
    assert code(e)[1] == 404
    s3.delete_object(Bucket="s3-objects", Key="dir/a b+c.bin")
    s3.delete_object(Bucket="s3-objects", Key="dir/a b+c.bin")  # S3: 204 again
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="s3-objects", Key="dir/a b+c.bin")
    assert code(e) == ("NoSuchKey", 404)
    s3.put_object(Bucket="s3-objects", Key="empty", Body=b"")
    assert s3.get_object(Bucket="s3-objects", Key="empty")["Body"].read() == b""


def test_listing_prefix_delimiter_pages(s3: Any, endpoint: str) -> None:
    s3.create_bucket(Bucket="s3-list")
    names = [f"img/{i:02d}.jpg" for i in range(7)] + ["img/sub/x.jpg", "txt/a b.txt", "top"]
    names += [f"deep/{d}/f{i}" for d in "abc" for i in range(3)]
    for n in names:
        s3.put_object(Bucket="s3-list", Key=n, Body=n.encode())
    listed = s3.list_objects_v2(Bucket="s3-list")
    assert [o["Key"] for o in listed["Contents"]] == sorted(names)
    assert listed["KeyCount"] == len(names) and not listed["IsTruncated"]
    root = s3.list_objects_v2(Bucket="s3-list", Delimiter="/")
    assert [o["Key"] for o in root["Contents"]] == ["top"]
    assert [p["Prefix"] for p in root["CommonPrefixes"]] == ["deep/", "img/", "txt/"]
    img = s3.list_objects_v2(Bucket="s3-list", Prefix="img/", Delimiter="/")
    assert len(img["Contents"]) == 7 and img["CommonPrefixes"] == [{"Prefix": "img/sub/"}]
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket="s3-list", PaginationConfig={"PageSize": 3}
    )
    seen, count = [], 0
    for page in pages:
        count += 1
        assert page["KeyCount"] <= 3
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == sorted(names) and count >= 6
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket="s3-list", Prefix="deep/", Delimiter="/", PaginationConfig={"PageSize": 2}
    )
    prefixes = [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]
    assert prefixes == ["deep/a/", "deep/b/", "deep/c/"]
    v1 = s3.list_objects(Bucket="s3-list", Prefix="img/", MaxKeys=4)
    assert len(v1["Contents"]) == 4 and v1["IsTruncated"]
    # With a trailing slash (some clients send it), the bucket's listing, not the
    # object route's fast path with an empty key (wire/http/fastpath.py).
    r = httpx.get(f"{endpoint}/s3/s3-list/?list-type=2&prefix=txt/")
    assert r.status_code == 200 and "<Key>txt/a b.txt</Key>" in r.text, r.text


def test_delete_objects(s3: Any) -> None:
    s3.create_bucket(Bucket="s3-multi-delete")
    for i in range(5):
        s3.put_object(Bucket="s3-multi-delete", Key=f"d/{i}", Body=b"x")
    out = s3.delete_objects(
        Bucket="s3-multi-delete",
        Delete={"Objects": [{"Key": f"d/{i}"} for i in range(5)] + [{"Key": "never"}]},
    )
    assert sorted(d["Key"] for d in out["Deleted"]) == sorted(
        [*(f"d/{i}" for i in range(5)), "never"]
    )
    assert not out.get("Errors")
    assert s3.list_objects_v2(Bucket="s3-multi-delete")["KeyCount"] == 0
