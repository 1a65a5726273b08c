"""Plain GETs sent zero-copy (``etl_runtime.wire.http.zerocopy``), on asyncio and on uvloop.

The shared target fixture serves with the zero-copy protocol, as
``run_server`` does, each test once per loop: whole objects and ranges
byte-exact, ``sluice_sendfile_bytes_total`` showing the bytes really went by
sendfile, pipelined keep-alive requests (with 304, 404, 412 and If-Range
answers between them) in order, a client that hangs up mid-body, a graceful
shutdown mid-body, bytes still queued in the transport sent first, a file
system that refuses sendfile and a disk error mid-body (``os.sendfile``
replaced: faults a test cannot cause), and the target process itself and
``SLUICE_SENDFILE``.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl

from etl_runtime.core.eventloop import loop_factory
from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import zerocopy
from etl_runtime.wire.http.serving import run_server
from tests.servers import free_port, serve_in_thread, serve_process
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry

BIG = os.urandom(6 << 20) + b"end"  # more than a socket buffer: a slow reader makes sendfile wait
SMALL = b"a small object"


@pytest.fixture
def zc_target(target_on_loop: RunningTarget, monkeypatch: pytest.MonkeyPatch) -> RunningTarget:
    """The shared target (zero-copy protocol, on ``loop_name``) holding ``big`` and ``small``,
    its reads unchecked: a checked read passes the bytes through the hash, never sendfile
    (storage/integrity.py; tests/storage/ covers checked reads)."""
    monkeypatch.setenv("SLUICE_VERIFY_READS", "0")
    c = target_on_loop.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
    c.put("/v1/objects/bkt/big", content=BIG).raise_for_status()
    c.put("/v1/objects/bkt/small", content=SMALL).raise_for_status()
    return target_on_loop


def _metric(client: httpx.Client, name: str, labels: str = "") -> float:
    """``name`` with exactly ``labels``; without them, whatever labels it has (one series)."""
    text = client.get("/metrics").text
    pattern = re.escape(name + labels) if labels else re.escape(name) + r"(?:\{[^}]*\})?"
    m = re.search(rf"^{pattern} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def test_whole_objects_and_ranges_go_by_sendfile(zc_target: RunningTarget) -> None:
    c = zc_target.client
    before = _metric(c, "sluice_sendfile_bytes_total")
    r = c.get("/v1/objects/bkt/big")
    assert r.status_code == 200 and r.headers["content-length"] == str(len(BIG))
    assert hashlib.md5(r.content).hexdigest() == r.headers["etag"].strip('"')
    assert r.content == BIG
    assert c.get("/v1/objects/bkt/small").content == SMALL
    r = c.get("/v1/objects/bkt/big", headers={"Range": "bytes=1000-2999999"})
    assert r.status_code == 206 and r.content == BIG[1000:3_000_000]
    assert r.headers["content-range"] == f"bytes 1000-2999999/{len(BIG)}"
    r = c.get("/v1/objects/bkt/big", headers={"Range": "bytes=-3"})
    assert r.status_code == 206 and r.content == b"end"
    sent = len(BIG) + len(SMALL) + 2_999_000 + 3
    assert _metric(c, "sluice_sendfile_bytes_total") - before == sent
    # what the request metrics count as sent includes them
    get = '{op="get",role="target",route="/v1/objects/{bucket}/{name:path}"}'
    assert _metric(c, "sluice_http_sent_bytes_total", get) >= sent
    # preconditions and HEAD answer without a body
    etag = r.headers["etag"]
    r = c.get("/v1/objects/bkt/big", headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b""
    r = c.head("/v1/objects/bkt/big")
    assert r.status_code == 200 and r.headers["content-length"] == str(len(BIG))
    assert _metric(c, "sluice_sendfile_bytes_total") - before == sent


def _requests(host: str, targets: list[tuple[str, dict[str, str]]]) -> bytes:
    out = bytearray()
    for path, headers in targets:
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        out += ("\r\n".join(lines) + "\r\n\r\n").encode()
    return bytes(out)


def _read_responses(sock: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """``n`` pipelined answers, parsed by h11 as a client would."""
    conn = h11.Connection(h11.CLIENT)
    got: list[tuple[int, bytes]] = []
    status, body = 0, bytearray()
    ask = h11.Request(method="GET", target="/", headers=[("Host", "x")])
    conn.send(ask)
    conn.send(h11.EndOfMessage())
    while len(got) < n:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(1 << 20)
            assert data, f"connection closed after {len(got)} of {n} answers"
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status, body = event.status_code, bytearray()
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            got.append((status, bytes(body)))
            conn.start_next_cycle()
            conn.send(ask)
            conn.send(h11.EndOfMessage())
    return got


def test_pipelined_keep_alive_gets_answer_in_order(zc_target: RunningTarget) -> None:
    host = zc_target.url.removeprefix("http://")
    etag = zc_target.client.head("/v1/objects/bkt/big").headers["etag"]
    asks: list[tuple[str, dict[str, str]]] = []
    want: list[tuple[int, bytes]] = []  # a JSON error's body: a word it must name
    for i in range(6):
        asks += [
            ("/v1/objects/bkt/big", {}),
            ("/v1/objects/bkt/small", {}),
            ("/v1/objects/bkt/big", {"Range": f"bytes={i}-{i + 99_999}"}),
            ("/v1/objects/bkt/big", {"If-None-Match": etag}),
            ("/v1/objects/bkt/nothing", {}),
            ("/v1/objects/bkt/big", {"If-Match": '"another-version"'}),
            ("/v1/objects/bkt/small", {"Range": "bytes=2-", "If-Range": '"another-version"'}),
        ]
        want += [
            (200, BIG),
            (200, SMALL),
            (206, BIG[i : i + 100_000]),
            (304, b""),
            (404, b"nothing"),
            (412, b"another-version"),
            (200, SMALL),  # If-Range does not match: the whole object
        ]
    h, p = host.split(":")
    with socket.create_connection((h, int(p)), timeout=30) as sock:
        sock.sendall(_requests(host, asks))  # all at once, on one connection
        got = _read_responses(sock, len(asks))
    assert [s for s, _ in got] == [s for s, _ in want]
    for (status, body), (_, expected) in zip(got, want, strict=True):
        if status < 400:
            assert body == expected
        else:
            assert expected in body


def _open_fds_on(path: Path) -> list[str]:
    hits = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                hits.append(fd)
        except OSError:
            continue
    return hits


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see open files")
@pytest.mark.parametrize("checked", ["0", "1"])  # "1": a checked read (no sendfile), the same
def test_client_gone_mid_body(
    zc_target: RunningTarget,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    checked: str,
) -> None:
    monkeypatch.setenv("SLUICE_VERIFY_READS", checked)
    host, port = zc_target.url.removeprefix("http://").split(":")
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
        sock.sendall(_requests(f"{host}:{port}", [("/v1/objects/bkt/big", {})]))
        assert sock.recv(16_384).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)  # the server is blocked on a full socket, mid-body
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        sock.close()  # reset, not a clean close
    # the object file the aborted answers held is closed again
    path = zc_target.data_dir / "buckets" / "bkt" / "big"
    deadline = time.monotonic() + 10
    while _open_fds_on(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _open_fds_on(path)
    # and the server still answers, in full
    assert zc_target.client.get("/v1/objects/bkt/big").content == BIG
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


# Faults a test cannot cause for real: a file system that refuses sendfile,
# a disk that fails mid-object. os.sendfile is replaced for those two.


def test_file_system_without_sendfile_is_copied(
    zc_target: RunningTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "sendfile", refuse)
    before = _metric(zc_target.client, "sluice_sendfile_bytes_total")
    assert zc_target.client.get("/v1/objects/bkt/big").content == BIG
    r = zc_target.client.get("/v1/objects/bkt/big", headers={"Range": "bytes=5-"})
    assert r.status_code == 206 and r.content == BIG[5:]
    assert _metric(zc_target.client, "sluice_sendfile_bytes_total") == before


def test_disk_error_mid_body_is_a_short_answer_and_logged(
    zc_target: RunningTarget, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = os.sendfile

    def fail_after_first(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        if offset:
            raise OSError(errno.EIO, "Input/output error")
        return real(out_fd, in_fd, offset, min(count, 1 << 16))

    monkeypatch.setattr(os, "sendfile", fail_after_first)
    with pytest.raises(httpx.RemoteProtocolError):  # never a complete-looking body
        zc_target.client.get("/v1/objects/bkt/big")
    monkeypatch.undo()
    assert zc_target.client.get("/v1/objects/bkt/big").content == BIG
    assert any(
        "/v1/objects/bkt/big failed after its headers" in r.getMessage()
        and "Input/output" in r.getMessage()
        for r in caplog.records
    )


def test_shutdown_finishes_the_answer_in_flight(tmp_path: Path, loop_name: str) -> None:
    app = create_target_app("t0", tmp_path / "data", DictRegistry(), cluster_key=CLUSTER_KEY)
    port = free_port()
    config = uvicorn.Config(
        app, port=port, loop=loop_name, http=zerocopy.http_protocol({}), log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    try:
        url = f"http://127.0.0.1:{port}"
        httpx.post(f"{url}/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
        httpx.put(f"{url}/v1/objects/bkt/big", content=BIG).raise_for_status()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
            sock.sendall(_requests(f"127.0.0.1:{port}", [("/v1/objects/bkt/big", {})]))
            got = bytearray(sock.recv(16_384))
            server.should_exit = True  # as on SIGTERM, mid-body
            time.sleep(0.3)
            while data := sock.recv(1 << 20):
                got += data
        head, _, body = bytes(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == BIG  # then the server closed
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class _Sink(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.flow = FlowControl(transport)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()


def test_file_bytes_follow_what_the_transport_still_holds(loop_name: str, tmp_path: Path) -> None:
    """Bytes still queued in the transport (the headers) go out before the file's."""
    path = tmp_path / "f"
    path.write_bytes(BIG)
    queued = b"q" * (4 << 20)  # more than the socket takes at once: it waits in the transport
    got = bytearray()

    def read_all(sock: socket.socket) -> None:
        while len(got) < len(queued) + len(BIG) - 10 and (data := sock.recv(1 << 20)):
            got.extend(data)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        transport, sink = await loop.connect_accepted_socket(_Sink, ours)
        transport.write(queued)
        assert transport.get_write_buffer_size() > 0
        reader = threading.Thread(target=read_all, args=(theirs,))
        reader.start()
        # The loop stands still while the reader empties the socket: the
        # socket has room now, though the transport still holds bytes.
        time.sleep(0.2)
        with path.open("rb") as f:
            sent = await zerocopy._send_range(transport, sink.flow, f, 10, len(BIG) - 10)
        assert sent == len(BIG) - 10
        await asyncio.to_thread(reader.join)
        transport.close()
        theirs.close()

    before = zerocopy.COUNTERS.bytes
    with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
        runner.run(main())
    assert got == queued + BIG[10:]
    assert zerocopy.COUNTERS.bytes - before == len(BIG) - 10


def test_target_process_sends_by_sendfile(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["-m", "etl_runtime.storage_target", "--data-dir", str(tmp_path / "data")]
    env = {"SLUICE_HOST": "127.0.0.1", "SLUICE_PORT": str(port), "SLUICE_VERIFY_READS": "0"}
    with serve_process(args, f"{url}/v1/health", env=env), httpx.Client(base_url=url) as c:
        c.post("/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
        c.put("/v1/objects/bkt/o", content=BIG).raise_for_status()
        assert c.get("/v1/objects/bkt/o").content == BIG
        assert _metric(c, "sluice_sendfile_bytes_total") == len(BIG)


def test_sluice_sendfile_0_reads_and_copies(tmp_path: Path) -> None:
    app = create_target_app("t0", tmp_path / "data", DictRegistry(), cluster_key=CLUSTER_KEY)
    off = zerocopy.http_protocol({"SLUICE_SENDFILE": "0"})
    with serve_in_thread(app, http=off) as url, httpx.Client(base_url=url) as c:
        c.post("/v1/buckets/bkt", json={"action": "create-bck"}).raise_for_status()
        c.put("/v1/objects/bkt/o", content=BIG).raise_for_status()
        before = _metric(c, "sluice_sendfile_bytes_total")
        assert c.get("/v1/objects/bkt/o").content == BIG
        r = c.get("/v1/objects/bkt/o", headers={"Range": "bytes=7-"})
        assert r.status_code == 206 and r.content == BIG[7:]
        assert _metric(c, "sluice_sendfile_bytes_total") == before


def test_a_bad_sluice_sendfile_stops_the_server_with_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLUICE_SENDFILE", "maybe")
    started: list[bool] = []
    with pytest.raises(SystemExit, match="SLUICE_SENDFILE='maybe'"):
        run_server(None, "127.0.0.1", free_port(), on_start=[lambda: started.append(True)])
    assert not started
