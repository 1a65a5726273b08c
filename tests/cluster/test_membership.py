"""Changing the number of targets: 3 -> 4 -> 2 on one data dir, with ``sluice up``.

Every object stays readable with its content and its metadata (content type,
``X-Sluice-Meta-*``) during and after each rebalance (reads that reach a new
owner before the object moved are served from the previous owner:
get-from-neighbor, which copies it there), and afterwards each object is stored at
its owner and nowhere else; targets that leave hand everything over first.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from etl_runtime.cluster.clustermap import FileClusterMap
from etl_runtime.local import LocalCluster
from tests.cluster.conftest import wait_for

OBJECTS = 500


def body(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (8 + i % 64)


def kind(i: int) -> str:
    return f"application/x-kind-{i % 3}"


class ThreadClients:
    """One httpx.Client per pool thread: httpx does not promise that one client's
    connection pool is safe to share between threads (shared, it once raised
    EBADF here in the middle of a rebalance)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[httpx.Client] = []
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = httpx.Client(timeout=60, follow_redirects=True)
            with self._lock:
                self._all.append(c)
        return c

    def __enter__(self) -> ThreadClients:
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self._all:
            c.close()


def read_all(ep: str) -> list[str]:
    """Names whose read failed or returned the wrong bytes."""
    clients = ThreadClients()

    def one(i: int) -> str | None:
        r = clients.get().get(f"{ep}/v1/objects/data/dir{i % 7}/obj-{i}")
        ok = r.status_code == 200 and r.content == body(i)
        kept = r.headers.get("content-type") == kind(i) and r.headers.get("x-sluice-meta-n") == str(
            i
        )
        return None if ok and kept else f"{i}:{r.status_code}:{kept}"

    with clients, ThreadPoolExecutor(8) as pool:
        return [bad for bad in pool.map(one, range(OBJECTS)) if bad]


def stored(data: Path) -> dict[str, set[str]]:
    out = {}
    for tdir in sorted((data / "targets").iterdir()):
        root = tdir / "buckets" / "data"
        out[tdir.name] = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    return out


def check_placement(data: Path, members: list[str]) -> None:
    cmap = FileClusterMap(data / "cluster.json").get()
    assert list(cmap.members) == members and not cmap.rebalancing
    where = stored(data)
    for i in range(OBJECTS):
        name = f"dir{i % 7}/obj-{i}"
        holders = {t for t, names in where.items() if name in names}
        assert holders == {cmap.owners("data", name)[0]}, (name, holders)


def wait_rebalanced(ep: str) -> None:
    wait_for(
        lambda: httpx.get(f"{ep}/v1/cluster").json()["rebalance"]["state"] == "idle",
        120,
        "the rebalance to finish",
    )


@pytest.mark.timeout(420)
def test_three_four_two_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_ZYGOTE", "off")  # no ETL here: no transformer runtime to warm
    data = tmp_path / "data"
    with LocalCluster(data, targets=3) as cluster:
        ep = cluster.endpoint
        assert httpx.post(f"{ep}/v1/buckets/data", json={"action": "create-bck"}).is_success
        clients = ThreadClients()

        def put(i: int) -> int:
            return (
                clients.get()
                .put(
                    f"{ep}/v1/objects/data/dir{i % 7}/obj-{i}",
                    content=body(i),
                    headers={"Content-Type": kind(i), "X-Sluice-Meta-N": str(i)},
                )
                .status_code
            )

        with clients, ThreadPoolExecutor(8) as pool:
            assert set(pool.map(put, range(OBJECTS))) == {200}
        check_placement(data, ["t0", "t1", "t2"])

    with LocalCluster(data, targets=4) as cluster:  # t3 joins
        ep = cluster.endpoint
        assert read_all(ep) == []  # during the rebalance (or right after it)
        wait_rebalanced(ep)
        view = httpx.get(f"{ep}/v1/cluster").json()
        assert (
            view["members"] == ["t0", "t1", "t2", "t3"] and view["rebalance"]["objects_moved"] > 0
        )
        assert httpx.get(f"{ep}/v1/buckets").json()["buckets"] == ["data"]  # t3 knows it
        assert read_all(ep) == []
        check_placement(data, ["t0", "t1", "t2", "t3"])
        assert 0 < len(stored(data)["t3"]) < OBJECTS

    with LocalCluster(data, targets=2) as cluster:  # t2 and t3 leave
        ep = cluster.endpoint
        assert read_all(ep) == []
        wait_rebalanced(ep)
        wait_for(lambda: "target t3 left the cluster" in cluster.output, 30, "t3 to leave")
        assert "target t2 left the cluster" in cluster.output
        assert read_all(ep) == []
        listing = httpx.get(f"{ep}/v1/buckets/data", params={"limit": 1000}).json()
        assert len(listing["objects"]) == OBJECTS
        check_placement(data, ["t0", "t1"])
