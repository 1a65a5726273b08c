"""Content type and user metadata on the native API: the SDK, curl, and every copy."""

from __future__ import annotations

import httpx
import pytest

from etl_runtime import BadRequest, Client


@pytest.fixture
def client(endpoint: str):
    with Client(endpoint) as c:
        yield c


def test_the_sdk_stores_metadata_and_every_copy_keeps_it(client: Client) -> None:
    bucket = client.bucket("e2e-meta").create(copies=2)
    obj = bucket.object("labels/cat.json")
    obj.put_content(b'{"cat": 1}', content_type="application/json", metadata={"Split": "train"})
    info = obj.head()
    assert info.content_type == "application/json" and info.metadata == {"split": "train"}
    # Each target that holds a copy answers it with the same metadata (read there directly).
    answers = []
    for t in client.cluster()["targets"]:
        r = httpx.get(f"{t['url']}/v1/objects/e2e-meta/labels/cat.json", timeout=10)
        if r.status_code == 200:
            answers.append((r.content, r.headers["content-type"], r.headers["x-sluice-meta-split"]))
    assert answers == [(b'{"cat": 1}', "application/json", "train")] * 2
    # Without metadata, a new version has none (and the default type).
    obj.put_content(b"{}")
    info = obj.head()
    assert info.content_type is None and info.metadata == {}


def test_metadata_is_bounded(client: Client) -> None:
    bucket = client.bucket("e2e-meta-big").create()
    with pytest.raises(BadRequest, match="e2e-meta-big/k is over 2048 bytes"):
        bucket.object("k").put_content(b"x", metadata={"blob": "x" * 2100})
    assert not bucket.object("k").exists()
