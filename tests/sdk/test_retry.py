"""The SDK retries 503/429 and dropped connections, honouring ``Retry-After``, boundedly.

A tiny real server (uvicorn in a thread) plays a gateway that answers 503 the
way the real one does while an object's owner target is away: JSON naming the
target, with ``Retry-After``. Its object routes redirect to a "target" on the
same server, so the SDK's redirect dance is part of every retried call.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from etl_runtime import Client, NetworkError, RetryPolicy, Unavailable
from etl_runtime.sdk.retry import parse_retry_after
from tests.servers import serve_in_thread


@dataclass
class Flaky:
    """Answer ``status`` to the first ``failures`` calls (forever if negative)."""

    failures: int = 0
    status: int = 503
    retry_after: str | None = "0"
    calls: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    def refuse(self, what: str) -> Response | None:
        self.calls.append(what)
        if self.failures >= 0 and len(self.calls) > self.failures:
            return None
        headers = {"retry-after": self.retry_after} if self.retry_after is not None else {}
        body = {"error": "target 't1' is away; try again shortly", "kind": "TargetAway"}
        return JSONResponse({**body, "target": "t1"}, self.status, headers=headers)


def flaky_app(flaky: Flaky) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/health")
    def health() -> Response:
        return flaky.refuse("health") or JSONResponse({"status": "ok"})

    @app.api_route("/v1/objects/{bucket}/{obj:path}", methods=["GET", "PUT"])
    def redirect(bucket: str, obj: str, request: Request) -> Response:
        return Response(status_code=307, headers={"location": f"/t0{request.url.path}"})

    @app.api_route("/t0/v1/objects/{bucket}/{obj:path}", methods=["GET", "PUT"])
    async def target(bucket: str, obj: str, request: Request) -> Response:
        data = await request.body()
        refused = flaky.refuse(f"{request.method} {bucket}/{obj}")
        if request.method == "PUT":
            flaky.bodies.append(data)
        if refused:
            return refused
        if request.method == "PUT":
            return JSONResponse({"bucket": bucket, "object": obj, "size": len(data)})
        return Response(flaky.bodies[-1] if flaky.bodies else b"stored")

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Flaky]]:
    flaky = Flaky()
    with serve_in_thread(flaky_app(flaky)) as url:
        yield url, flaky


@pytest.fixture
def flaky(server: tuple[str, Flaky]) -> Flaky:
    state = server[1]
    state.__init__()  # type: ignore[misc]  # fresh behaviour per test, same server
    return state


def test_503_twice_then_200_succeeds_after_three_requests(server, flaky: Flaky) -> None:
    flaky.failures = 2
    with Client(server[0]) as client:
        assert client.health() == {"status": "ok"}
    assert flaky.calls == ["health"] * 3


def test_retries_zero_raises_unavailable_naming_the_status_and_target(server, flaky) -> None:
    flaky.failures = 2
    with Client(server[0], retries=0) as client, pytest.raises(Unavailable) as info:
        client.health()
    assert info.value.status == 503 and info.value.tries == 1
    assert "target 't1' is away" in str(info.value) and "HTTP 503" in str(info.value)
    assert len(flaky.calls) == 1


def test_503_forever_gives_up_after_the_bounded_tries(server, flaky: Flaky) -> None:
    flaky.failures = -1
    with Client(server[0], retries=3) as client, pytest.raises(Unavailable) as info:
        client.bucket("bkt").object("x").get_bytes()
    assert len(flaky.calls) == 4 and info.value.tries == 4
    assert "gave up after 4 tries" in str(info.value)
    assert info.value.bucket == "bkt" and info.value.object == "x"


def test_default_is_five_retries(server, flaky: Flaky) -> None:
    flaky.failures = -1
    with Client(server[0]) as client, pytest.raises(Unavailable):
        client.health()
    assert len(flaky.calls) == 6


def test_put_file_is_sent_whole_again_after_a_503(server, flaky: Flaky, tmp_path) -> None:
    flaky.failures = 2
    path = tmp_path / "blob"
    path.write_bytes(b"0123456789" * 100_000)
    with Client(server[0]) as client:
        info = client.bucket("bkt").object("blob").put_file(path)
    assert info.size == 1_000_000
    assert flaky.bodies == [path.read_bytes()] * 3


def test_429_waits_as_long_as_retry_after_says(server, flaky: Flaky) -> None:
    flaky.failures, flaky.status, flaky.retry_after = 1, 429, "1"
    with Client(server[0]) as client:
        started = time.monotonic()
        assert client.bucket("bkt").object("x").get_bytes() == b"stored"
    assert time.monotonic() - started >= 0.9
    assert len(flaky.calls) == 2


def test_a_streamed_iterator_body_is_not_sent_twice(server, flaky: Flaky) -> None:
    flaky.failures = -1
    with (
        Client(server[0]) as client,
        pytest.raises(Unavailable) as info,
        client.object_request("PUT", "/v1/objects/bkt/once", content=iter([b"abc"])),
    ):
        pass
    assert flaky.bodies == [b"abc"] and info.value.tries == 1


def test_a_dropped_connection_is_retried() -> None:
    """The first connection closes without an answer (a reset), the second answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[int] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                accepted.append(1)
                conn.recv(65536)
                if len(accepted) == 2:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 15\r\nconnection: close\r\n\r\n"
                        b'{"status":"ok"}'
                    )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with Client(f"127.0.0.1:{port}", retries=RetryPolicy(2, backoff=0.01)) as client:
            assert client.health() == {"status": "ok"}
        assert len(accepted) == 2
    finally:
        listener.close()
        thread.join(timeout=5)


def test_an_unreachable_cluster_gives_up_with_a_network_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with (
            Client(f"127.0.0.1:{port}", retries=RetryPolicy(2, backoff=0.01)) as client,
            pytest.raises(NetworkError) as info,
        ):
            client.list_buckets()
    assert info.value.tries == 3 and "gave up after 3 tries" in str(info.value)


def test_retry_after_is_seconds_or_an_http_date_and_is_capped() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("junk") is None
    assert 0 < parse_retry_after(time_in(30)) <= 30  # type: ignore[operator]
    assert RetryPolicy(max_delay=5).delay(1, "3600") == 5
    assert RetryPolicy(backoff=1).delay(3) <= 4


def time_in(seconds: int) -> str:
    from email.utils import formatdate

    return formatdate(time.time() + seconds, usegmt=True)


def test_a_read_whose_transformer_just_died_goes_back_to_the_target() -> None:
    """Issue 20 #4b: a target's 307 can name a transformer that died a moment ago
    (connection refused). The SDK tries again at that target, not at the gateway:
    the target knows by then, and sends it to the replacement (or answers 503)."""
    calls: list[str] = []
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        dead_port = dead.getsockname()[1]
        app = FastAPI()

        @app.get("/v1/objects/{bucket}/{obj:path}")
        def gateway(bucket: str, obj: str, request: Request) -> Response:
            calls.append("gateway")
            return Response(
                status_code=307, headers={"location": f"/t0{request.url.path}?etl_name=up"}
            )

        @app.get("/t0/v1/objects/{bucket}/{obj:path}")
        def target(bucket: str, obj: str, request: Request) -> Response:
            calls.append(f"target {request.url.query}")
            there = f"http://127.0.0.1:{dead_port}" if len(calls) == 2 else ""
            return Response(
                status_code=307, headers={"location": f"{there}/tf/{bucket}/{obj}?sig=1"}
            )

        @app.get("/tf/{bucket}/{obj:path}")
        def transformer(bucket: str, obj: str) -> Response:
            calls.append("transformer")
            return Response(b"HELLO")

        with serve_in_thread(app) as url, Client(url, retries=RetryPolicy(2, backoff=0.01)) as c:
            assert c.bucket("bkt").object("o").get_bytes(etl_name="up") == b"HELLO"
    assert calls == ["gateway", "target etl_name=up", "target etl_name=up", "transformer"]
