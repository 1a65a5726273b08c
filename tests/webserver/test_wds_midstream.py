"""A wds ETL that fails on sample 60 of 200: every reader must notice, none reads 60.

Samples 0-59 are already on the wire as whole tar members when sample 60
fails (the function raises, its worker process exits, or its result cannot
be encoded), so the stream
stands on a member boundary: aborting the connection alone left a valid,
shorter archive, and ``wds.WebDataset(url)`` (curl pipe, ``tarfile`` in
``r|*``) returned exactly 60 samples and no exception in 83 of 200 reads
(raise) and 63 of 200 (worker exit), on a 2-core machine shared with other
jobs (``PYTHONPATH=. .venv/bin/python bench/wds_midstream.py --reads 200``,
direct GETs to a 2-worker transformer). The transformer now writes an error
marker first (``wire/formats/tarbreak.py``: the header of ``__sluice_error__/<sample>.txt``
declaring more bytes than follow), and the same command counts 0 silent reads
in 200 for each. Here: 20 reads per failure and loop, the raw bytes through
``tarfile`` and GNU tar, by the hpush ``PUT`` and by the direct ``GET``.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import subprocess
import tarfile
import threading
from pathlib import Path

import h11
import httpx
import pytest
import webdataset as wds

from tests.servers import SessionServers
from tests.webserver.conftest import loop_transformer, text_shard

SAMPLES, FAIL_AT, READS = 200, 60, 20
FAILURES = {  # the failing sample's key -> what the error says
    "poison": "poisoned sample",  # the function raises
    "exit": "died while transforming",  # its worker process exits
    "badresult": "transform returned int",  # it returns what cannot be encoded
}


def shard(failing: str) -> bytes:
    keys = [f"s{i:04d}" for i in range(SAMPLES)]
    keys[FAIL_AT] = failing
    return text_shard(keys, size=2_000)


@pytest.fixture(scope="module")
def base(session_servers: SessionServers, loop_name: str) -> str:
    return loop_transformer(session_servers, "wds", loop_name)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for failing in FAILURES:
        path = tmp_path_factory.mktemp("midstream") / f"{failing}.tar"
        path.write_bytes(shard(failing))
        out[failing] = path
    return out


def webdataset_read(url: str) -> tuple[Exception | None, int]:
    """What a user's loop over ``wds.WebDataset(url)`` ends with, and how many samples."""
    n = 0
    try:
        for _ in wds.WebDataset(url, shardshuffle=False):
            n += 1
    except Exception as e:
        return e, n
    return None, n


def received(url: str, fqn: Path) -> bytes:
    """The body bytes of a direct GET that arrive before the connection breaks."""
    got = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("GET", url, params={"etl_fqn": str(fqn)}, timeout=60) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                got += chunk
    return bytes(got)


def pushed(base: str, body: bytes) -> bytes:
    """The answer to an hpush PUT, read while a thread still sends the body.

    A raw socket, read until the reset: the transformer aborts with body bytes
    unread, so its kernel answers the rest of the upload with a reset, and an
    asyncio client whose write fails first drops what it had not read yet (the
    target's ``TarCursor`` marks what it did relay; tests/storage_target).
    """
    host, port = base.removeprefix("http://").split(":")
    conn, got = h11.Connection(h11.CLIENT), bytearray()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = [("host", host), ("content-length", str(len(body)))]
        sock.sendall(conn.send(h11.Request(method="PUT", target="/b/s.tar", headers=head)) or b"")

        def send_body() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(body)

        threading.Thread(target=send_body, daemon=True).start()
        while True:
            try:
                conn.receive_data(sock.recv(1 << 16))
                while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                    if isinstance(event, h11.Response):
                        assert event.status_code == 200
                    elif isinstance(event, h11.Data):
                        got += event.data
                    assert not isinstance(event, h11.EndOfMessage), "a clean end"
            except (ConnectionResetError, h11.RemoteProtocolError):
                return bytes(got)


def tarfile_members(data: bytes) -> tuple[list[str], Exception | None]:
    """Members ``tarfile`` in stream mode (webdataset's way) reads, and how it ends."""
    names: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
            for member in tar:
                names.append(member.name)
                tar.extractfile(member).read()  # type: ignore[union-attr]
    except tarfile.TarError as e:
        return names, e
    return names, None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("failing", list(FAILURES))
def test_webdataset_never_reads_a_short_shard(
    base: str, shards: dict[str, Path], failing: str
) -> None:
    url = f"{base}/b/shard.tar?etl_fqn={shards[failing]}"  # the GET a target's 307 leads to
    outcomes = [webdataset_read(url) for _ in range(READS)]
    silent = [n for error, n in outcomes if error is None]
    assert silent == [], f"{len(silent)} of {READS} reads ended quietly with {silent} samples"
    assert all(n <= FAIL_AT for _, n in outcomes)


@pytest.mark.parametrize("how", ["put", "get"])
@pytest.mark.parametrize("failing", list(FAILURES))
def test_raw_bytes_end_in_an_error_member(
    base: str, shards: dict[str, Path], failing: str, how: str
) -> None:
    if how == "put":  # hpush: a target sends the shard
        data = pushed(base, shard(failing))
    else:  # the direct GET: the transformer reads the file
        data = received(f"{base}/b/s.tar", shards[failing])
    names, error = tarfile_members(data)
    assert isinstance(error, tarfile.ReadError) and "unexpected end of data" in str(error)
    assert names == [f"s{i:04d}.txt" for i in range(FAIL_AT)] + [f"__sluice_error__/{failing}.txt"]
    tail = data[data.rindex(b"__sluice_error__/") + 512 :]  # after its header
    assert b"ETL 'wds-" in tail and b"'b/s.tar'" in tail and FAILURES[failing].encode() in tail
    if shutil.which("tar"):
        r = subprocess.run(["tar", "tf", "-"], input=data, capture_output=True, timeout=30)
        assert r.returncode != 0 and b"Unexpected EOF in archive" in r.stderr
