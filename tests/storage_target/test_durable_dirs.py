"""New directories of acknowledged data are fsynced into their parents (power-loss safety).

A power loss cannot be caused in a test, so ``os.fsync`` is wrapped to record
which directories were fsynced (the wrapper still calls the real one). The
writes themselves are real: a target over HTTP, the replica route other
targets use, the store's first use of a bucket, a dSort workdir.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from etl_runtime.core import auth
from etl_runtime.core.durable import make_dirs
from etl_runtime.dsort import job as dsort_job
from etl_runtime.storage.peers import INTERNAL_HEADER
from etl_runtime.storage.store import ObjectStore
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import CLUSTER_KEY


@pytest.fixture
def dir_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory fsynced from now on, in order (by its real path)."""
    seen: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_nested_put_fsyncs_each_new_directory_into_its_parent(
    target: RunningTarget, dir_fsyncs: list[Path]
) -> None:
    buckets = (target.data_dir / "buckets").resolve()
    b = buckets / "bkt"
    assert target.client.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
    assert dir_fsyncs == [buckets]  # the bucket's own entry

    dir_fsyncs.clear()
    assert target.client.put("/v1/objects/bkt/a/b/c.jpg", content=b"one").status_code == 200
    # a/b's entry into a, a's into the bucket (deepest first), then the rename's
    assert dir_fsyncs == [b / "a", b, b / "a" / "b"]

    dir_fsyncs.clear()
    assert target.client.put("/v1/objects/bkt/a/b/d.jpg", content=b"two").status_code == 200
    assert dir_fsyncs == [b / "a" / "b"]  # nothing created: only what the rename needs

    dir_fsyncs.clear()
    assert target.client.put("/v1/objects/bkt/a/b/c.jpg", content=b"new").status_code == 200
    assert dir_fsyncs == [b / "a" / "b"]  # an overwrite, the same

    dir_fsyncs.clear()
    assert target.client.put("/v1/objects/bkt/a/x/y.jpg", content=b"three").status_code == 200
    assert dir_fsyncs == [b / "a", b / "a" / "x"]  # only the new x, into the existing a

    dir_fsyncs.clear()
    assert target.client.put("/v1/objects/bkt/top.jpg", content=b"four").status_code == 200
    assert dir_fsyncs == [b]
    for name, data in [("a/b/c.jpg", b"new"), ("a/b/d.jpg", b"two"), ("a/x/y.jpg", b"three")]:
        assert target.client.get(f"/v1/objects/bkt/{name}").content == data


def test_copy_from_a_peer_fsyncs_its_new_directories(
    target: RunningTarget, dir_fsyncs: list[Path]
) -> None:
    """``/v1/_replica``: what write-through copies and rebalance moves are written by."""
    b = (target.data_dir / "buckets" / "bkt").resolve()
    target.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    headers = {INTERNAL_HEADER: auth.internal_token(CLUSTER_KEY)}
    dir_fsyncs.clear()
    r = target.client.put("/v1/_replica/bkt/r/s/t.bin", content=b"copy", headers=headers)
    assert r.status_code == 200 and r.json()["stored"] is True, r.text
    assert dir_fsyncs == [b / "r", b, b / "r" / "s"]
    dir_fsyncs.clear()
    r = target.client.put(
        "/v1/_replica/bkt/r/s/u.bin", params={"if_absent": "1"}, content=b"x", headers=headers
    )
    assert r.status_code == 200 and dir_fsyncs == [b / "r" / "s"]


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_bucket_directory_made_on_first_use_is_fsynced(
    tmp_path: Path, dir_fsyncs: list[Path]
) -> None:
    """With a cluster map a target makes a bucket's directory when it first needs it."""
    store = ObjectStore(tmp_path / "data", bucket_known=lambda b: True)
    buckets = store.buckets_dir.resolve()
    dir_fsyncs.clear()
    info = asyncio.run(store.write_object("m", "x/y.bin", _body(b"data")))
    assert info is not None and info.size == 4
    assert dir_fsyncs == [buckets, buckets / "m", buckets / "m" / "x"]
    dir_fsyncs.clear()
    asyncio.run(store.write_object("m", "x/z.bin", _body(b"more")))
    assert dir_fsyncs == [buckets / "m" / "x"]


def test_dsort_workdir_is_made_durably_once(tmp_path: Path, dir_fsyncs: list[Path]) -> None:
    data = tmp_path.resolve() / "data"
    data.mkdir()
    ctx: Any = SimpleNamespace(workdir=data / ".jobs" / "j1")
    assert dsort_job._workdir(ctx) == data / ".jobs" / "j1"
    assert dir_fsyncs == [data / ".jobs", data]
    dir_fsyncs.clear()
    dsort_job._workdir(ctx)
    assert dir_fsyncs == []


def test_make_dirs(tmp_path: Path, dir_fsyncs: list[Path]) -> None:
    root = tmp_path.resolve()
    assert make_dirs(root) == [] and dir_fsyncs == []
    made = make_dirs(root / "a" / "b" / "c", root=root)
    assert made == [root / "a" / "b" / "c", root / "a" / "b", root / "a"]
    assert dir_fsyncs == [root / "a" / "b", root / "a", root]
    (root / "a" / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):  # a file in the way: nothing made below it
        make_dirs(root / "a" / "file" / "d")
    with pytest.raises(FileNotFoundError):  # ``root`` itself is never made
        make_dirs(root / "gone" / "x", root=root / "gone")
    assert not (root / "gone").exists()
    assert sorted(p.name for p in root.rglob("*")) == ["a", "b", "c", "file"]
