"""``wire.wholebody``: an announced body received whole, into the bytes the app gets.

A real uvicorn on loopback with the protocol, on both event loops, and an app
that records every ``receive()`` message. What an app (the inline transformer)
would notice: the body, byte for byte; that it is ``bytes``; that it came in
one message; and that a body the client did not finish is never handed over
short. Requests the protocol leaves alone (small, chunked, not wanted) are
still read as uvicorn reads them.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import httpx
import pytest

from etl_runtime.wire.http import wholebody
from etl_runtime.wire.http.connections import Limits, http_protocol
from tests.servers import serve_in_thread

BIG = os.urandom(1 << 20)


class Recorder:
    """An ASGI app: reads the body, answers its length, type and message count."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/early":  # answers without reading the body
            await self._answer(send, b"early")
            return
        parts: list[Any] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.seen.append({"path": scope["path"], "disconnect": True, "parts": parts})
                return
            parts.append(message["body"])
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        self.seen.append({"path": scope["path"], "parts": parts, "body": body})
        kinds = ",".join(sorted({type(p).__name__ for p in parts}))
        await self._answer(send, f"{len(body)} {len(parts)} {kinds}".encode(), body)

    @staticmethod
    async def _answer(send: Any, head: bytes, body: bytes = b"") -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": head + b"\n" + body})


def serve(app: Recorder, loop_name: str) -> Any:
    http = wholebody.protocol(lambda scope: scope["method"] == "PUT")
    return serve_in_thread(app, loop=loop_name, http=http_protocol(http, Limits()))


def answer(r: httpx.Response) -> tuple[str, bytes]:
    head, _, body = r.content.partition(b"\n")
    return head.decode(), body


def test_an_announced_body_comes_whole_as_bytes(loop_name: str) -> None:
    app = Recorder()
    with serve(app, loop_name) as url, httpx.Client(base_url=url) as c:
        head, body = answer(c.put("/o", content=BIG))
        assert head == f"{len(BIG)} 1 bytes" and body == BIG

        # sent slowly, in pieces the parser sees one by one: still one message
        def pieces() -> Any:
            for i in range(0, len(BIG), 200_000):
                yield BIG[i : i + 200_000]
                time.sleep(0.02)

        r = c.put("/o", content=pieces(), headers={"content-length": str(len(BIG))})
        head, body = answer(r)
        assert head == f"{len(BIG)} 1 bytes" and body == BIG

        # Left as uvicorn reads them: not wanted (POST), chunked, small. Same bytes.
        for r in (
            c.post("/o", content=BIG),
            c.put("/o", content=pieces()),  # no length: chunked
            c.put("/o", content=BIG[:1000]),
        ):
            size, _, _ = answer(r)[0].partition(" ")
            assert r.status_code == 200 and answer(r)[1] == (BIG[:1000] if size == "1000" else BIG)
        assert len(app.seen[2]["parts"]) > 1  # the POST: many messages, as before


def test_an_unfinished_body_is_a_disconnect_never_a_short_body(loop_name: str) -> None:
    app = Recorder()
    with serve(app, loop_name) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                f"PUT /cut HTTP/1.1\r\nhost: x\r\ncontent-length: {len(BIG)}\r\n\r\n".encode()
            )
            s.sendall(BIG[: len(BIG) // 2])
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while not app.seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.seen == [{"path": "/cut", "disconnect": True, "parts": []}]


def test_pipelined_and_early_answered_requests_keep_their_bodies(loop_name: str) -> None:
    app = Recorder()
    with serve(app, loop_name) as url:
        host, port = url.removeprefix("http://").split(":")
        other = BIG[::-1]
        with socket.create_connection((host, int(port))) as s:
            head = "PUT {} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n"
            s.sendall(
                head.format("/early", len(BIG)).encode()  # answered before its body is read
                + BIG
                + head.format("/a", len(BIG)).encode()
                + BIG
                + head.format("/b", len(other)).encode()
                + other
            )
            s.settimeout(10)
            got = b""
            while got.count(b"HTTP/1.1 200") < 3 or not got.endswith(other):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got += chunk
        assert got.count(b"HTTP/1.1 200") == 3
        assert [a["path"] for a in app.seen] == ["/a", "/b"]
        assert app.seen[0]["body"] == BIG and app.seen[1]["body"] == other


def test_a_length_that_is_not_one_number_is_left_to_uvicorn() -> None:
    assert wholebody.announced_length([(b"content-length", b"70000")]) == 70000
    assert (
        wholebody.announced_length([(b"content-length", b"1"), (b"content-length", b"1")]) is None
    )
    assert wholebody.announced_length([(b"content-length", b"-5")]) is None
    assert wholebody.announced_length([(b"transfer-encoding", b"chunked")]) is None
    with pytest.raises(ValueError, match="at least 2 bytes"):
        wholebody.Whole(1)  # the one-byte bytes objects are shared: never written into


def test_a_client_that_expects_100_continue_gets_it_then_sends_the_body(loop_name: str) -> None:
    """curl sends ``Expect: 100-continue`` before a body over 1 MB, and waits."""
    app = Recorder()
    with serve(app, loop_name) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.settimeout(10)
            head = f"PUT /e HTTP/1.1\r\nhost: x\r\ncontent-length: {len(BIG)}\r\n"
            s.sendall((head + "expect: 100-continue\r\n\r\n").encode())
            assert s.recv(1024).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            s.sendall(BIG)
            got = b""
            while not got.endswith(b"\r\n0\r\n\r\n"):  # the chunked answer's end
                chunk = s.recv(1 << 20)
                assert chunk, got[:200]
                got += chunk
        assert got.startswith(b"HTTP/1.1 200") and f"{len(BIG)} 1 bytes\n".encode() in got[:300]
        assert app.seen[0]["body"] == BIG
