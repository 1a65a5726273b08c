"""The native API beside the S3 one: conditional PUTs (``If-None-Match: *``, ``If-Match``)
as S3's PutObject takes them, and an object and a "directory" of the same name."""

from __future__ import annotations

from typing import Any

import httpx


def put(endpoint: str, name: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.put(
        f"{endpoint}/v1/objects/native-cond/{name}",
        content=body,
        headers=headers,
        follow_redirects=True,
        timeout=30,
    )


def test_native_conditional_put(endpoint: str, s3: Any) -> None:
    s3.create_bucket(Bucket="native-cond")
    first = put(endpoint, "k", b"one", **{"If-None-Match": "*"})
    assert first.status_code == 200, first.text
    etag = first.json()["etag"]
    again = put(endpoint, "k", b"two", **{"If-None-Match": "*"})
    assert again.status_code == 412 and again.json()["kind"] == "PreconditionFailed"
    assert "native-cond/k exists" in again.json()["error"]
    wrong = put(endpoint, "k", b"two", **{"If-Match": '"0123456789abcdef0123456789abcdef"'})
    assert wrong.status_code == 412 and "another version" in wrong.json()["error"]
    missing = put(endpoint, "nothing", b"x", **{"If-Match": f'"{etag}"'})
    assert missing.status_code == 404 and missing.json()["kind"] == "ObjectNotFound"
    bad = put(endpoint, "k", b"two", **{"If-None-Match": f'"{etag}"'})
    assert bad.status_code == 400 and "takes only '*'" in bad.json()["error"]
    got = httpx.get(f"{endpoint}/v1/objects/native-cond/k", follow_redirects=True)
    assert got.content == b"one"  # none of the refused PUTs stored anything
    assert put(endpoint, "k", b"two", **{"If-Match": f'"{etag}"'}).status_code == 200
    assert put(endpoint, "k", b"three", **{"If-Match": "*"}).status_code == 200
    assert s3.get_object(Bucket="native-cond", Key="k")["Body"].read() == b"three"


def test_an_object_and_a_directory_of_one_name_both_stored_or_a_409_naming_both(
    endpoint: str, s3: Any
) -> None:
    """S3 stores ``dir/f`` beside ``dir/f/x``; Sluice does where the two land on different
    targets, and where they share one (a file cannot be a directory too) answers 409
    naming both keys, storing nothing."""
    from botocore.exceptions import ClientError

    s3.create_bucket(Bucket="name-clash")
    clashes = 0
    for i in range(16):  # with 2 targets some pairs share one, some do not
        file, below = f"d{i}/f", f"d{i}/f/x"
        s3.put_object(Bucket="name-clash", Key=file, Body=b"file")
        try:
            s3.put_object(Bucket="name-clash", Key=below, Body=b"below")
        except ClientError as e:
            clashes += 1
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 409
            assert f"'{below}'" in e.response["Error"]["Message"]
            assert f"'{file}'" in e.response["Error"]["Message"]
            native = httpx.put(
                f"{endpoint}/v1/objects/name-clash/{below}", content=b"y", follow_redirects=True
            )
            assert native.status_code == 409 and f"'{file}'" in native.json()["error"]
        else:
            assert s3.get_object(Bucket="name-clash", Key=below)["Body"].read() == b"below"
        assert s3.get_object(Bucket="name-clash", Key=file)["Body"].read() == b"file"
    assert 0 < clashes < 16
