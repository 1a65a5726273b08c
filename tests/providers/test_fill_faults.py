"""What a remote bucket's cache does when a fill goes wrong: a backend answer cut
mid-stream, and a cached copy found torn on disk afterwards (a fill is not fsynced:
``providers/cache.py``, "Durability"). A real MinIO, behind a cutting proxy where
it must break, and the package's real ``sluice up``.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.providers.conftest import cached_files, leftovers, metric
from tests.providers.cutproxy import CutProxy
from tests.providers.minio import MinioServer
from tests.providers.test_remote import FETCHES, eventually, get, new_bucket

ERRORS = "sluice_remote_backend_fetch_errors_total"
CORRUPTED = "sluice_integrity_corrupted_reads_total"
MiB = 1 << 20


def remote_via(endpoint: str, minio: MinioServer, proxy: CutProxy, data: bytes) -> str:
    """A new aws bucket holding ``cut.bin``, reached through ``proxy``."""
    bucket = new_bucket(minio, {"cut.bin": data})
    r = httpx.post(
        f"{endpoint}/v1/buckets/{bucket}",
        params={"provider": "aws"},
        json={"action": "create-bck", "props": {"endpoint": proxy.endpoint}},
    )
    assert r.status_code == 200, r.text
    return bucket


@pytest.mark.parametrize("size", [1 * MiB, 4 * MiB], ids=["one-piece", "streamed"])
def test_a_fill_cut_mid_stream_breaks_the_answer_caches_nothing_and_is_fetched_again(
    endpoint: str, minio: MinioServer, proxy: CutProxy, cluster_dir: Path, size: int
) -> None:
    data = os.urandom(size)
    bucket = remote_via(endpoint, minio, proxy, data)
    errors, cuts = metric(endpoint, ERRORS), proxy.cuts
    # Half-way through, the backend dies (and stays dead for the client's retries).
    proxy.arm(f"/{bucket}/cut.bin", size // 2)
    got = b""
    try:
        url = f"{endpoint}/v1/objects/{bucket}/cut.bin"
        with httpx.stream("GET", url, follow_redirects=True, timeout=60) as answer:
            # The head went out with the whole size: the answer breaks off, so no
            # client takes the bytes it got for the object.
            assert answer.status_code == 200
            assert answer.headers["content-length"] == str(size)
            with pytest.raises(httpx.RemoteProtocolError):
                for chunk in answer.iter_bytes():
                    got += chunk
    finally:
        proxy.cut = None
    assert len(got) < size and data.startswith(got)
    assert proxy.cuts > cuts  # the backend's answer was cut indeed
    eventually(lambda: metric(endpoint, ERRORS) > errors, True)
    assert cached_files(cluster_dir, bucket, "cut.bin") == []
    eventually(lambda: leftovers(cluster_dir), [])

    fetches = metric(endpoint, FETCHES)
    again = get(endpoint, bucket, "cut.bin")
    assert again.status_code == 200 and again.content == data
    assert again.headers["x-sluice-cache"] == "miss"
    assert metric(endpoint, FETCHES) == fetches + 1
    eventually(lambda: len(cached_files(cluster_dir, bucket, "cut.bin")), 1)


def test_a_cut_the_backend_recovers_from_is_resumed_by_a_ranged_get(
    endpoint: str, minio: MinioServer, proxy: CutProxy, cluster_dir: Path
) -> None:
    data = os.urandom(4 * MiB)
    bucket = remote_via(endpoint, minio, proxy, data)
    cuts, errors = proxy.cuts, metric(endpoint, ERRORS)
    proxy.arm(f"/{bucket}/cut.bin", 2 * MiB, down=False)
    try:
        r = get(endpoint, bucket, "cut.bin")
    finally:
        proxy.cut = None
    assert r.status_code == 200 and r.content == data
    assert proxy.cuts == cuts + 1 and metric(endpoint, ERRORS) == errors
    eventually(lambda: len(cached_files(cluster_dir, bucket, "cut.bin")), 1)
    [path] = cached_files(cluster_dir, bucket, "cut.bin")
    assert path.read_bytes() == data


def test_a_cached_copy_torn_on_disk_is_fetched_again_never_served(
    endpoint: str, minio: MinioServer, cluster_dir: Path
) -> None:
    small, big = os.urandom(300 << 10), os.urandom(3 * MiB)
    objects = {"t/short.bin": small, "t/zeroed.bin": small, "t/big.bin": big}
    bucket = new_bucket(minio, objects)
    for name, data in objects.items():
        assert get(endpoint, bucket, name).content == data  # cold: filled
    for name in objects:
        eventually(lambda n=name: len(cached_files(cluster_dir, bucket, n)), 1)
    # What a crash before the kernel wrote a fill back can leave behind (the rename,
    # not all of the data): a shorter file, or zeros in place of bytes.
    [short] = cached_files(cluster_dir, bucket, "t/short.bin")
    os.truncate(short, len(small) // 3)
    for name, at, n in (("t/zeroed.bin", 0, len(small)), ("t/big.bin", MiB, MiB)):
        [path] = cached_files(cluster_dir, bucket, name)
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, bytes(n), at)
        os.close(fd)
    fetches, corrupted = metric(endpoint, FETCHES), metric(endpoint, CORRUPTED)

    # Found before the first byte: fetched again from the backend and served whole.
    for name in ("t/short.bin", "t/zeroed.bin"):
        r = get(endpoint, bucket, name)
        assert r.status_code == 200 and r.content == small, name
    assert metric(endpoint, FETCHES) == fetches + 2
    # A big one is checked as it streams: that answer is cut before its last byte,
    # and the next GET has the object fetched again.
    with pytest.raises(httpx.RemoteProtocolError):
        get(endpoint, bucket, "t/big.bin")
    eventually(lambda: get(endpoint, bucket, "t/big.bin").content == big, True)
    assert metric(endpoint, FETCHES) == fetches + 3
    assert metric(endpoint, CORRUPTED) == corrupted + 3
    for name, data in objects.items():  # the copies on disk are whole again
        [path] = cached_files(cluster_dir, bucket, name)
        assert path.read_bytes() == data
