"""The native API beside the S3 one: conditional PUTs (``If-None-Match: *``, ``If-Match``)
as S3's PutObject takes them, and an object and an object whose name is also a prefix of others."""

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


def test_an_object_and_a_directory_of_one_name_are_both_stored(endpoint: str, s3: Any) -> None:
    """S3 stores ``dir/f`` beside ``dir/f/x`` in either order; so does Sluice, whether the
    two land on one target or on two, through S3 and the native API alike."""
    s3.create_bucket(Bucket="name-clash")
    expected = {}
    for i in range(16):  # with 2 targets some pairs share one, some do not
        file, below = f"d{i}/f", f"d{i}/f/x"
        first, second = (file, below) if i % 2 else (below, file)
        s3.put_object(Bucket="name-clash", Key=first, Body=first.encode())
        native = httpx.put(
            f"{endpoint}/v1/objects/name-clash/{second}",
            content=second.encode(),
            follow_redirects=True,
            timeout=30,
        )
        assert native.status_code == 200, native.text
        expected |= {file: file.encode(), below: below.encode()}
    for key, body in expected.items():
        assert s3.get_object(Bucket="name-clash", Key=key)["Body"].read() == body
    listed = s3.list_objects_v2(Bucket="name-clash")["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(expected)
