"""A ``gcp`` resumable upload cut mid-chunk resumes from the byte GCS lacks (issue #40).

fake-gcs-server cannot show it (a status query finishes its session:
docs/remote.md, emulators), so the backend here is a loopback server that
keeps resumable sessions as GCS documents them
(cloud.google.com/storage/docs/performing-resumable-uploads): it persists
what arrives in 256 KiB units, keeps a chunk cut mid-body up to its last
whole unit, answers ``bytes */SIZE`` with ``308`` and ``Range: bytes=0-N``
(no ``Range`` while it holds nothing), ``200`` with the object once complete,
and ``404`` for a session it does not know; plus the XML API's ``HEAD`` that
obstore sends after the upload. A ``FaultProxy`` in front of it resets the
second chunk's connection part-way through its body.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from etl_runtime.providers.gcp import GcsBackend
from etl_runtime.providers.gcp_upload import RESUMABLE_CHUNK
from tests.providers.faultproxy import Fault, FaultProxy

UNIT = 256 << 10  # GCS persists a resumable upload in multiples of this
SIZE = 2 * RESUMABLE_CHUNK + (1 << 20)  # three chunk requests: 8 MiB, 8 MiB, 1 MiB
RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+)$")


class Sessions(ThreadingHTTPServer):
    """One bucket's resumable sessions and finished objects, on loopback."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self.sessions: dict[str, tuple[str, int, bytearray]] = {}  # id: (name, size, kept)
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: Sessions
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_POST(self) -> None:
        name = re.search(r"[?&]name=([^&]+)", self.path)
        if "uploadType=resumable" not in self.path or not name:
            return self._answer(400, b"only resumable uploads here")
        upload_id = uuid.uuid4().hex
        size = int(self.headers["X-Upload-Content-Length"])
        with self.server.lock:
            self.server.sessions[upload_id] = (name.group(1), size, bytearray())
        location = f"http://{self.headers['Host']}{self.path}&upload_id={upload_id}"
        self._answer(200, Location=location)

    def do_PUT(self) -> None:
        found = re.search(r"upload_id=([^&]+)", self.path)
        with self.server.lock:
            session = self.server.sessions.get(found.group(1)) if found else None
        if session is None:
            return self._answer(404, b"No such upload")
        name, size, kept = session
        m = RANGE.match(self.headers.get("Content-Range", ""))
        if not m or int(m.group(3)) != size:
            return self._answer(400, b"bad Content-Range")
        if m.group(1) is not None:  # a chunk: keep what is new of it, in whole units
            start, length = int(m.group(1)), int(self.headers["Content-Length"])
            if start > len(kept):
                return self._answer(400, b"chunk past the persisted offset")
            got = bytearray()
            try:
                while len(got) < length and (piece := self.rfile.read1(length - len(got))):
                    got += piece
            except OSError:
                pass
            end = start + len(got)
            if len(got) < length and end < size:  # cut: persisted only in whole units
                end -= end % UNIT
            with self.server.lock:
                if end > len(kept):
                    kept += got[len(kept) - start : end - start]
            if len(got) < length:
                self.close_connection = True
                return None
        if len(kept) == size:
            data = bytes(kept)
            with self.server.lock:
                self.server.objects[name] = data
            meta = f'{{"name": "{name}", "size": "{size}", "generation": "1"}}'
            return self._answer(200, meta.encode())
        held = {"Range": f"bytes=0-{len(kept) - 1}"} if kept else {}
        return self._answer(308, **held)

    def do_HEAD(self) -> None:
        name = unquote(self.path.split("?")[0].split("/", 2)[-1])
        data = self.server.objects.get(name)
        if data is None:
            return self._answer(404)
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
        self.send_header("Last-Modified", "Thu, 03 Dec 2026 12:00:00 GMT")
        self.end_headers()
        return None


@pytest.fixture
def gcs() -> Iterator[Sessions]:
    server = Sessions()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(gcs: Sessions) -> Iterator[FaultProxy]:
    p = FaultProxy(gcs.endpoint)
    try:
        yield p
    finally:
        p.close()


def test_a_chunk_cut_mid_body_resumes_from_the_byte_gcs_lacks(
    gcs: Sessions, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(SIZE)
    (tmp_path / "big.bin").write_bytes(data)
    cut_at = 3 * UNIT + 1000  # GCS keeps 3 units of the cut chunk
    second = ("content-range", rf"^bytes {RESUMABLE_CHUNK}-")
    proxy.add(Fault("PUT", "upload_id=", reset=cut_at, header=second))
    backend = GcsBackend.for_bucket("b", {"endpoint": proxy.endpoint}, env={})
    meta = asyncio.run(backend.put_file("big.bin", tmp_path / "big.bin"))
    assert meta.size == SIZE and gcs.objects["big.bin"] == data
    puts = [s for s in proxy.seen if s.method == "PUT"]
    ranges = [s.headers["content-range"] for s in puts]
    resume = RESUMABLE_CHUNK + 3 * UNIT
    assert ranges == [
        f"bytes 0-{RESUMABLE_CHUNK - 1}/{SIZE}",
        f"bytes {RESUMABLE_CHUNK}-{2 * RESUMABLE_CHUNK - 1}/{SIZE}",  # cut
        f"bytes */{SIZE}",  # where does it stand? 308, Range: bytes=0-(resume - 1)
        f"bytes {resume}-{resume + RESUMABLE_CHUNK - 1}/{SIZE}",
        f"bytes {resume + RESUMABLE_CHUNK}-{SIZE - 1}/{SIZE}",
    ]
    assert [s.status for s in puts] == [308, None, 308, 308, 200]
    resent = sum(s.sent for s in puts) - SIZE
    assert resent == 1000  # the cut chunk's bytes past its last whole unit, no more
    assert len(gcs.sessions) == 1  # one session throughout


def test_a_status_query_answered_without_range_resends_from_byte_0(
    gcs: Sessions, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(SIZE)
    (tmp_path / "big.bin").write_bytes(data)
    first = ("content-range", r"^bytes 0-")
    proxy.add(Fault("PUT", "upload_id=", reset=UNIT - 1, header=first))  # nothing kept
    backend = GcsBackend.for_bucket("b", {"endpoint": proxy.endpoint}, env={})
    asyncio.run(backend.put_file("big.bin", tmp_path / "big.bin"))
    assert gcs.objects["big.bin"] == data
    ranges = [s.headers["content-range"] for s in proxy.seen if s.method == "PUT"]
    assert ranges[1:3] == [f"bytes */{SIZE}", f"bytes 0-{RESUMABLE_CHUNK - 1}/{SIZE}"]


def test_a_chunk_where_nothing_moves_times_out_and_resumes(
    gcs: Sessions, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from etl_runtime.providers import gcp

    monkeypatch.setattr(gcp, "UPLOAD_TIMEOUT", httpx.Timeout(1.0, connect=3.0))
    data = os.urandom(SIZE)
    (tmp_path / "big.bin").write_bytes(data)
    second = ("content-range", rf"^bytes {RESUMABLE_CHUNK}-")
    stall = proxy.add(Fault("PUT", "upload_id=", reset=2 * UNIT, stall=20.0, header=second))
    backend = GcsBackend.for_bucket("b", {"endpoint": proxy.endpoint}, env={})
    asyncio.run(backend.put_file("big.bin", tmp_path / "big.bin"))
    assert stall.fired == 1 and stall.stalled == 0  # done while that chunk still hung
    assert gcs.objects["big.bin"] == data
    ranges = [s.headers["content-range"] for s in proxy.seen if s.method == "PUT"]
    assert ranges[2] == f"bytes */{SIZE}"  # the timed-out chunk's session was asked
    assert len(gcs.sessions) == 1
