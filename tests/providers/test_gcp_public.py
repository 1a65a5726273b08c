"""A public GCS bucket read with ``secret: anonymous``: unsigned requests (no server cluster).

Real GCS refuses a request whose bearer token is not valid with a 401, on a
public bucket too, so an anonymous bucket must send no ``Authorization`` at
all. The loopback server below answers as GCS does for a public object.
"""

from __future__ import annotations

import asyncio
import email.utils
import http.server
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from etl_runtime.providers.gcp import GcsBackend

DATA = b"public bytes " * 1000


@pytest.fixture()
def public_gcs() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            if urllib.parse.unquote(self.path) != "/bkt/obj.bin":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.headers.get("Authorization"):
                body = b"<Error><Code>AuthenticationRequired</Code></Error>"
                self.send_response(401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(DATA)))
            self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
            self.send_header("Last-Modified", email.utils.formatdate(time.time(), usegmt=True))
            self.end_headers()
            self.wfile.write(DATA)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()


def test_an_anonymous_gcp_bucket_reads_a_public_object_unsigned(
    public_gcs: tuple[str, list[str | None]],
) -> None:
    url, seen = public_gcs
    backend = GcsBackend.for_bucket("bkt", {"endpoint": url, "secret": "anonymous"}, env={})

    async def read() -> bytes:
        meta, chunks = await backend.open("obj.bin")
        assert meta.size == len(DATA) and meta.etag == "0123456789abcdef0123456789abcdef"
        return b"".join([bytes(c) async for c in chunks])

    assert asyncio.run(read()) == DATA
    assert seen and all(auth is None for auth in seen)
