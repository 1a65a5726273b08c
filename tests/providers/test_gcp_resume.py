"""A ``gcp`` write-through PUT whose resumable upload is interrupted (issue #40).

A ``FaultProxy`` on loopback sits between Sluice and fake-gcs-server and
breaks chosen chunk requests: a reset after part of a chunk's body, a 503 of
its own, a session id the emulator never issued (its own 404), a 403. What
is checked is what a user sees (the PUT's answer, the object as the official
client reads it from the emulator) and what the proxy saw go up.

fake-gcs-server 1.56 finishes a session on the status query
(``Content-Range: bytes */SIZE``) with whatever it holds, so against it an
interrupted upload restarts on a new session and the torn object that the
query made is overwritten; the resume from the byte GCS lacks is shown by
``test_gcs_resume.py`` against a server that keeps sessions as GCS documents.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest

from etl_runtime.core.errors import BackendError, BackendForbidden
from etl_runtime.providers.gcp import GcsBackend
from etl_runtime.providers.gcp_upload import RESUMABLE_CHUNK
from tests.providers.emulators import FakeGcs
from tests.providers.faultproxy import Fault, FaultProxy
from tests.providers.remote_suite import new_bucket

SIZE = 2 * RESUMABLE_CHUNK + (1 << 20)  # three chunk requests: 8 MiB, 8 MiB, 1 MiB
SECOND = rf"^bytes {RESUMABLE_CHUNK}-"  # the Content-Range of the second chunk


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = FakeGcs(tmp_path_factory.mktemp("fake-gcs") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(emu: FakeGcs) -> Iterator[FaultProxy]:
    p = FaultProxy(emu.endpoint)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def body(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("body") / "big.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def put(proxy: FaultProxy, bucket: str, name: str, path: Path) -> None:
    backend = GcsBackend.for_bucket(bucket, {"endpoint": proxy.endpoint}, env={})

    async def go() -> None:
        meta = await backend.put_file(name, path)
        assert meta.size == SIZE

    asyncio.run(go())


def sessions(proxy: FaultProxy) -> list[str]:
    return [
        s.target for s in proxy.seen if s.method == "POST" and "uploadType=resumable" in s.target
    ]


def queries(proxy: FaultProxy) -> list[str]:
    return [
        s.headers["content-range"]
        for s in proxy.seen
        if s.method == "PUT" and s.headers.get("content-range", "").startswith("bytes */")
    ]


def test_a_chunk_cut_mid_body_is_queried_and_restarted_on_fake_gcs(
    emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    cut = proxy.add(Fault("PUT", "upload_id=", reset=3 << 20, header=("content-range", SECOND)))
    put(proxy, bucket, "big.bin", body)
    assert cut.fired == 1
    # The session was asked where it stands, as GCS documents; fake-gcs-server answers
    # it by finishing the object with the 8 MiB it held, which Sluice sees is torn and
    # replaces on a new session.
    assert queries(proxy) == [f"bytes */{SIZE}"]
    assert len(sessions(proxy)) == 2
    assert emu.read(bucket, "big.bin") == body.read_bytes()


def test_a_503_on_a_chunk_is_retried_with_backoff_and_the_object_is_whole(
    emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    proxy.add(Fault("PUT", "upload_id=", status=503, header=("content-range", SECOND)))
    put(proxy, bucket, "big.bin", body)
    answered = [s.status for s in proxy.seen if s.method == "PUT"]
    assert 503 in answered and answered[-1] == 200
    assert emu.read(bucket, "big.bin") == body.read_bytes()


def test_a_session_that_is_gone_restarts_once_on_a_new_session(
    emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    # The second chunk names a session fake-gcs-server never issued: its own 404.
    gone = Fault("PUT", "upload_id=", rewrite=(r"upload_id=[^&]+", "upload_id=expired"))
    gone.header = ("content-range", SECOND)
    proxy.add(gone)
    put(proxy, bucket, "big.bin", body)
    assert [s.status for s in proxy.seen if "upload_id=expired" in s.fault] == [404]
    assert len(sessions(proxy)) == 2
    assert emu.read(bucket, "big.bin") == body.read_bytes()
    # Gone on the new session too: given up, naming the object and the backend, and
    # nothing on the backend.
    proxy.seen.clear()
    proxy.add(Fault("PUT", "upload_id=", rewrite=gone.rewrite, times=None))
    with pytest.raises(BackendError) as e:
        put(proxy, bucket, "again.bin", body)
    assert len(sessions(proxy)) == 2
    assert f"gcp://{bucket}/again.bin" in str(e.value) and proxy.endpoint in str(e.value)
    assert emu.read(bucket, "again.bin") is None


def test_a_refusal_that_is_the_requests_fault_fails_at_once(
    emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    proxy.add(Fault("PUT", "upload_id=", status=403, header=("content-range", SECOND)))
    with pytest.raises(BackendForbidden) as e:
        put(proxy, bucket, "big.bin", body)
    chunks = [s for s in proxy.seen if s.method == "PUT" and "upload_id=" in s.target]
    assert [s.status for s in chunks] == [308, 403]  # no retry, no status query
    assert f"gcp://{bucket}/big.bin" in str(e.value) and proxy.endpoint in str(e.value)
    assert emu.read(bucket, "big.bin") is None


def test_resets_on_every_try_give_up_and_leave_no_torn_object(
    emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    # Every second chunk is cut: each status query makes fake-gcs-server finish a torn
    # 8 MiB object, which the upload deletes when it gives up.
    proxy.add(
        Fault("PUT", "upload_id=", reset=1 << 20, header=("content-range", SECOND), times=None)
    )
    with pytest.raises(BackendError) as e:
        put(proxy, bucket, "big.bin", body)
    assert len(sessions(proxy)) == 2 and "again" in str(e.value)
    assert emu.read(bucket, "big.bin") is None


@pytest.fixture(scope="module")
def cluster(emu: FakeGcs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from etl_runtime.local.api import LocalCluster

    with (
        mock.patch.dict(os.environ, emu.env()),
        LocalCluster(tmp_path_factory.mktemp("cluster"), targets=1, port=0) as c,
    ):
        yield str(c.endpoint).rstrip("/")


def test_a_hopeless_backend_is_a_503_naming_the_object_and_nothing_is_stored(
    cluster: str, emu: FakeGcs, proxy: FaultProxy, body: Path
) -> None:
    bucket = new_bucket(emu, {})
    r = httpx.post(
        f"{cluster}/v1/buckets/{bucket}",
        params={"provider": "gcp"},
        json={"action": "create-bck", "props": {"endpoint": proxy.endpoint}},
    )
    assert r.status_code == 200, r.text
    # The second chunk and every status query after it: a front end that stays down.
    down = ("content-range", rf"^bytes ({RESUMABLE_CHUNK}-|\*/)")
    proxy.add(Fault("PUT", "upload_id=", status=503, header=down, times=None))
    put_ = httpx.put(
        f"{cluster}/v1/objects/{bucket}/big.bin",
        content=body.read_bytes(),
        follow_redirects=True,
        timeout=120,
    )
    assert put_.status_code == 503, put_.text
    assert put_.headers.get("retry-after")
    error = put_.json()["error"]
    assert f"gcp://{bucket}/big.bin" in error and proxy.endpoint in error, error
    assert "/tmp" not in error and str(Path.home()) not in error, error
    attempts = [s for s in proxy.seen if s.status == 503]
    assert len(attempts) == 5  # bounded: ATTEMPTS tries, then given up
    assert emu.read(bucket, "big.bin") is None
    got = httpx.get(f"{cluster}/v1/objects/{bucket}/big.bin", follow_redirects=True, timeout=60)
    assert got.status_code == 404, got.text
