"""S3's bucket-name rules, the headers S3 keeps with an object, and listing edges
(V1's NextMarker with a delimiter, MaxKeys=0)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("a", "3 to 63"),
        ("aa", "3 to 63"),
        ("x" * 64, "3 to 63"),
        ("Upper-case", "lower-case"),
        ("under_score", "lower-case"),
        ("-dash-first", "begin and end"),
        ("two..dots", "adjacent periods"),
        ("dot.-dash", "period next to a hyphen"),
        ("192.168.5.4", "IP address"),
        ("xn--punycode", "may not start"),
        ("some-s3alias", "may not end"),
    ],
)
def test_bucket_names_follow_s3_rules(s3: Any, name: str, rule: str) -> None:
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    err = e.value.response["Error"]
    assert err["Code"] == "InvalidBucketName" and rule in err["Message"], err


def test_kept_headers(s3: Any) -> None:
    s3.create_bucket(Bucket="kept-headers")
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    s3.put_object(
        Bucket="kept-headers",
        Key="k",
        Body=b"data",
        CacheControl="no-cache",
        Expires=expires,
        ContentDisposition='attachment; filename="k.bin"',
        ContentEncoding="identity",
        ContentLanguage="fr",
    )
    for got in (
        s3.head_object(Bucket="kept-headers", Key="k"),
        s3.get_object(Bucket="kept-headers", Key="k"),
    ):
        assert got["CacheControl"] == "no-cache"
        assert got["Expires"] == expires
        assert got["ContentDisposition"] == 'attachment; filename="k.bin"'
        assert got["ContentEncoding"] == "identity"
        assert got["ContentLanguage"] == "fr"
        assert got["Metadata"] == {}
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="kept-headers", Key="bad", Body=b"x", Metadata={"~x": "y"})
    assert e.value.response["Error"]["Code"] == "InvalidArgument"


def test_v1_next_marker_and_max_keys_zero(s3: Any) -> None:
    s3.create_bucket(Bucket="listing-edges")
    for key in ("a", "boo/1", "boo/2", "c", "dir/x", "e"):
        s3.put_object(Bucket="listing-edges", Key=key, Body=b"x")
    seen: list[str] = []
    marker = ""
    for _ in range(10):
        page = s3.list_objects(Bucket="listing-edges", Delimiter="/", MaxKeys=2, Marker=marker)
        seen += [o["Key"] for o in page.get("Contents", [])]
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if not page["IsTruncated"]:
            break
        marker = page["NextMarker"]
        assert "\U0010ffff" not in marker
        assert marker == max(seen)
    assert sorted(seen) == ["a", "boo/", "c", "dir/", "e"] and len(seen) == 5
    for call in (s3.list_objects, s3.list_objects_v2):
        zero = call(Bucket="listing-edges", MaxKeys=0)
        assert zero["IsTruncated"] is False and "Contents" not in zero


def test_folder_marker_keys(s3: Any) -> None:
    s3.create_bucket(Bucket="folder-markers")
    s3.put_object(Bucket="folder-markers", Key="asdf/", Body=b"")
    s3.put_object(Bucket="folder-markers", Key="asdf/inside", Body=b"in")
    assert s3.head_object(Bucket="folder-markers", Key="asdf/")["ContentLength"] == 0
    assert s3.get_object(Bucket="folder-markers", Key="asdf/inside")["Body"].read() == b"in"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="folder-markers")["Contents"]]
    assert sorted(keys) == ["asdf/", "asdf/inside"]
    listed = s3.list_objects_v2(Bucket="folder-markers", Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["asdf/"]
    s3.copy_object(Bucket="folder-markers", Key="copied/", CopySource="folder-markers/asdf/")
    s3.delete_object(Bucket="folder-markers", Key="asdf/")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="folder-markers")["Contents"]]
    assert sorted(keys) == ["asdf/inside", "copied/"]
    with pytest.raises(ClientError):
        s3.put_object(Bucket="folder-markers", Key="x/.s3-folder", Body=b"")
