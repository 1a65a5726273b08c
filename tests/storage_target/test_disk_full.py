"""A full disk is 507 ``InsufficientStorage``, never a 500 or a retryable 503.

Each test mounts a small tmpfs (``tests/tmpfs.py``; root only, skipped
elsewhere with the reason) as a real target's data dir, fills it with real
PUTs and checks what every client sees: the target's own answer, the
gateway's (streamed and redirected PUTs), the SDK's exception (raised
without a retry), a copy refused by a full peer; and that nothing of a
refused write is left behind while earlier objects stay readable.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from etl_runtime import Client, InsufficientStorage, RetryPolicy, ServerError
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.gateway import create_gateway_app
from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import zerocopy
from tests.cluster.conftest import MapCluster
from tests.gateway.conftest import DictBackend, StaticDiscovery
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry
from tests.tmpfs import mounted_tmpfs

CHUNK = 256 << 10  # objects small enough that several fit in the 2 MiB disk


class CountPuts:
    """ASGI wrapper that records the path of every PUT the target receives."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.puts: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "PUT":
            self.puts.append(scope["path"])
        await self.app(scope, receive, send)


@contextlib.contextmanager
def target_on(data: Path, tid: str = "t0") -> Iterator[tuple[str, CountPuts]]:
    app = CountPuts(create_target_app(tid, data, DictRegistry(), cluster_key=CLUSTER_KEY))
    with serve_in_thread(app, http=zerocopy.http_protocol({})) as url:  # as run_server
        yield url, app


def fill(http: httpx.Client, prefix: str) -> tuple[dict[str, bytes], httpx.Response]:
    """PUT ``CHUNK``-sized objects until one is refused; what was stored, and the refusal."""
    stored: dict[str, bytes] = {}
    for i in range(64):
        name, data = f"{prefix}/{i:02d}.bin", os.urandom(CHUNK)
        r = http.put(f"/v1/objects/bkt/{name}", content=data)
        if r.status_code != 200:
            return stored, r
        assert r.json()["etag"] == hashlib.md5(data).hexdigest()
        stored[name] = data
    raise AssertionError("a 2 MiB disk took 16 MiB")


def assert_507(r: httpx.Response, target: str, name: str) -> None:
    assert r.status_code == 507, r.text
    body = r.json()
    assert body["kind"] == "InsufficientStorage"
    assert (body["target"], body["bucket"], body["object"]) == (target, "bkt", name)
    assert f"target {target!r} has no space left" in body["error"]
    assert "retry-after" not in r.headers  # nothing says "try again soon"


def assert_clean(data: Path, stored: dict[str, bytes], http: httpx.Client) -> None:
    """Earlier objects intact, no temp file left, nothing of a refused write published."""
    assert list((data / ".tmp").iterdir()) == []
    on_disk = {
        str(p.relative_to(data / "buckets" / "bkt"))
        for p in (data / "buckets" / "bkt").rglob("*")
        if p.is_file()
    }
    assert on_disk == set(stored)
    for name, blob in stored.items():
        r = http.get(f"/v1/objects/bkt/{name}")
        assert r.status_code == 200 and r.content == blob


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk", size="2m") as mnt:
        yield mnt


def test_put_on_a_full_disk_is_507_naming_target_bucket_object(disk: Path) -> None:
    with target_on(disk / "data") as (url, _app), httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        stored, refused = fill(http, "a/b")
        assert stored, "not even one object fit"
        assert_507(refused, "t0", f"a/b/{len(stored):02d}.bin")
        big = os.urandom(3 << 20)  # larger than the whole disk: refused mid-body
        r = http.put("/v1/objects/bkt/new/dir/big.bin", content=big)
        assert_507(r, "t0", "new/dir/big.bin")
        assert not (disk / "data" / "buckets" / "bkt" / "new").exists()  # no empty dirs either
        r = http.put("/v1/objects/bkt/a/b/00.bin", content=big)  # overwrite refused: old one kept
        assert_507(r, "t0", "a/b/00.bin")
        assert_clean(disk / "data", stored, http)
        assert http.get("/v1/objects/bkt/new/dir/big.bin").status_code == 404


def test_full_disk_through_gateway_and_sdk_is_507_not_retried(disk: Path) -> None:
    with contextlib.ExitStack() as stack:
        url, counted = stack.enter_context(target_on(disk / "data"))
        gw = create_gateway_app(
            StaticDiscovery([TargetInfo(id="t0", url=url)]),
            DictBackend(DictRegistry()),
            cluster_key=CLUSTER_KEY,
        )
        gw_url = stack.enter_context(serve_in_thread(gw))
        http = stack.enter_context(httpx.Client(base_url=gw_url, timeout=30))
        assert http.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        stored, refused = fill(http, "gw")  # httpx sends the body: the gateway streams it
        assert not refused.history  # the gateway's own answer: the target's, passed on
        assert_507(refused, "t0", f"gw/{len(stored):02d}.bin")
        r = http.put("/v1/objects/bkt/gw/big.bin", content=os.urandom(3 << 20))
        assert_507(r, "t0", "gw/big.bin")  # not 503 NoTargets

        client = stack.enter_context(
            Client(gw_url, retries=RetryPolicy(retries=5, backoff=1.0, max_delay=1.0))
        )
        bucket = client.bucket("bkt")
        for put in (
            lambda: bucket.object("sdk/bytes.bin").put_content(os.urandom(CHUNK)),
            lambda: bucket.object("sdk/file.bin").put_file(big_file(disk.parent)),
        ):
            counted.puts.clear()
            started = time.monotonic()
            with pytest.raises(InsufficientStorage) as info:
                put()
            e = info.value
            assert isinstance(e, ServerError) and e.status == 507
            assert e.kind == "InsufficientStorage" and e.tries == 1
            assert (e.target, e.bucket) == ("t0", "bkt") and e.object in e.message
            assert len(counted.puts) == 1  # the body went to the target once: no retry
            assert time.monotonic() - started < 1.0  # and no back-off was slept
        target_http = stack.enter_context(httpx.Client(base_url=url, timeout=30))
        assert_clean(disk / "data", stored, target_http)


def big_file(where: Path) -> Path:
    path = where / "big.bin"
    path.write_bytes(os.urandom(3 << 20))
    return path


def test_copy_refused_by_a_full_peer_is_507_naming_it(tmp_path: Path) -> None:
    """Bucket with 2 copies over t0 (roomy) and t1 (2 MiB): t0's write-through is refused."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mounted_tmpfs(tmp_path / "t1", size="2m"))
        c = MapCluster(tmp_path, stack)
        stack.callback(c.close)
        c.add_target("t0")
        c.add_target("t1")
        c.start_gateway()
        http = stack.enter_context(c.client())
        r = http.post("/v1/buckets/bkt", json={"action": "create-bck", "props": {"copies": 2}})
        assert r.status_code == 200, r.text
        names = [
            n
            for n in (f"p/{i:03d}" for i in range(500))
            if c.cmap.get().owners("bkt", n)[0] == "t0"
        ]
        stored: dict[str, bytes] = {}
        for name in names:  # t0 owns each first and writes it through to t1
            data = os.urandom(CHUNK)
            r = http.put(f"/v1/objects/bkt/{name}", content=data)
            if r.status_code != 200:
                break
            stored[name] = data
        else:
            raise AssertionError("t1's 2 MiB disk took every copy")
        assert stored
        assert_507(r, "t1", name)
        assert "copy" in r.json()["error"]
        assert name not in c.objects_on("t0", "bkt")  # not published at the owner either
        assert c.objects_on("t0", "bkt") == c.objects_on("t1", "bkt") == set(stored)
        for tid in ("t0", "t1"):
            assert list((tmp_path / tid / ".tmp").iterdir()) == []
        for n, data in stored.items():
            assert http.get(f"/v1/objects/bkt/{n}").content == data


def test_no_inodes_left_is_507_and_leaves_no_empty_directories(tmp_path: Path) -> None:
    """ENOSPC from creating the name's directories (inodes spent), not from the bytes."""
    with (
        mounted_tmpfs(tmp_path / "disk", size="4m", nr_inodes=12) as mnt,
        target_on(mnt / "data") as (url, _app),
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        assert http.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        stored: dict[str, bytes] = {}
        for i in range(12):
            name = f"d{i}/e/f/o.bin"
            r = http.put(f"/v1/objects/bkt/{name}", content=b"x" * i)
            if r.status_code != 200:
                break
            stored[name] = b"x" * i
        else:
            raise AssertionError("12 inodes held 48 files and directories")
        assert_507(r, "t0", name)
        top = name.split("/")[0]
        assert not (mnt / "data" / "buckets" / "bkt" / top).exists()
        assert_clean(mnt / "data", stored, http)
