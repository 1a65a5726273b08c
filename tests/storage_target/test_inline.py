"""Small plain GETs answered inside the HTTP protocol (``storage_target/inprotocol.py``).

A real target app served as ``run_server`` serves it (the guarded zero-copy
protocol with the target's answerer), on asyncio and on uvloop, next to the
same app served without the answerer: the inline answer must be the route's
answer, byte for byte and header for header; every request the answerer
declines (ranges, preconditions, queries, big or missing objects, a read
without the token, HEAD) must get the route's answer; keep-alive, pipelining,
``Connection: close`` and the header timeout must work around an inline answer;
and the request metrics must count it as the route's.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import connections, zerocopy
from etl_runtime.wire.http.connections import Limits
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry

SMALL = bytes(range(256)) * 64  # 16 KiB
BIG = b"x" * (512 << 10)  # more than IN_PROTOCOL_MAX: the route's sendfile
MID = bytes(range(256)) * 480  # 120 KiB: answered inline


class Served:
    def __init__(self, inline_url: str, route_url: str, answers: list[bool]) -> None:
        self.inline = httpx.Client(base_url=inline_url, timeout=30)
        self.route = httpx.Client(base_url=route_url, timeout=30)
        self.inline_url = inline_url
        self.answers = answers  # one per request the answerer saw: True if it answered

    def close(self) -> None:
        self.inline.close()
        self.route.close()


def _serve(
    tmp_path: Path, loop: str, token: str | None, header_timeout: float, read_token: str = ""
) -> Iterator[Served]:
    app = create_target_app(
        "t0",
        tmp_path / "data",
        DictRegistry(),
        token=token,
        cluster_key=CLUSTER_KEY,
        read_token=read_token,
    )
    answerer = app.state.answerer
    answers: list[bool] = []

    def counted(scope: dict[str, Any]) -> Any:
        answer = answerer(scope)
        if not callable(answer):
            answers.append(answer is not None)
            return answer

        def with_body(body: bytes) -> Any:  # a share: answered once its body is in
            outcome = answer(body)
            answers.append(outcome is not None)
            return outcome

        return with_body

    limits = Limits(header_timeout=header_timeout)
    with_inline = connections.http_protocol(zerocopy.http_protocol({}), limits, counted)
    without = connections.http_protocol(zerocopy.http_protocol({}), Limits())
    with (
        serve_in_thread(app, loop=loop, http=with_inline) as inline_url,
        serve_in_thread(app, loop=loop, http=without) as route_url,
    ):
        served = Served(inline_url, route_url, answers)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        c = served.route
        c.post("/v1/buckets/bkt", json={"action": "create-bck"}, headers=headers).raise_for_status()
        c.put("/v1/objects/bkt/small", content=SMALL, headers=headers).raise_for_status()
        meta = {**headers, "Content-Type": "image/png", "X-Sluice-Meta-Label": "cat"}
        c.put("/v1/objects/bkt/dir/typed", content=b"png", headers=meta).raise_for_status()
        c.put("/v1/objects/bkt/big", content=BIG, headers=headers).raise_for_status()
        c.put("/v1/objects/bkt/mid", content=MID, headers=headers).raise_for_status()
        answers.clear()
        try:
            yield served
        finally:
            served.close()


@pytest.fixture
def served(tmp_path: Path, loop_name: str) -> Iterator[Served]:
    yield from _serve(tmp_path, loop_name, None, header_timeout=0.5)


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code
    assert a.content == b.content
    assert [(k, v) for k, v in a.headers.items() if k != "date"] == [
        (k, v) for k, v in b.headers.items() if k != "date"
    ]


def test_an_inline_answer_is_the_routes_answer(served: Served) -> None:
    for path in ("/v1/objects/bkt/small", "/v1/objects/bkt/dir/typed"):
        inline, route = served.inline.get(path), served.route.get(path)
        _same(inline, route)
    assert served.answers == [True, True]
    r = served.inline.get("/v1/objects/bkt/dir/typed")
    assert r.headers["content-type"] == "image/png" and r.headers["x-sluice-meta-label"] == "cat"


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/objects/bkt/small", {"Range": "bytes=10-19"}, 206),
        ("/v1/objects/bkt/small", {"If-None-Match": "*"}, 304),
        ("/v1/objects/bkt/small", {"If-Match": '"nope"'}, 412),
        ("/v1/objects/bkt/small?etl_name=nope", {}, 404),
        ("/v1/objects/bkt/small?bogus=1", {}, 400),
        ("/v1/objects/bkt/big", {}, 200),
        ("/v1/objects/bkt/missing", {}, 404),
        ("/v1/objects/nobucket/small", {}, 404),
        ("/v1/objects/bkt/..%2Fsmall", {}, 400),
    ],
)
def test_what_it_declines_the_route_answers(
    served: Served, path: str, headers: dict[str, str], status: int
) -> None:
    inline, route = (
        served.inline.get(path, headers=headers),
        served.route.get(path, headers=headers),
    )
    assert inline.status_code == status
    _same(inline, route)
    assert not any(served.answers)


def test_head_and_a_get_with_a_body_go_the_route(served: Served) -> None:
    _same(served.inline.head("/v1/objects/bkt/small"), served.route.head("/v1/objects/bkt/small"))
    r = served.inline.request("GET", "/v1/objects/bkt/small", content=b"body")
    assert r.status_code == 200 and r.content == SMALL
    assert served.answers == [False, False]  # it declines HEAD, and a GET with a body


def test_a_read_token_is_checked_before_answering(tmp_path: Path, loop_name: str) -> None:
    for served in _serve(tmp_path, loop_name, "s3cret", 0.5, read_token="r3ad"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = served.inline.get("/v1/objects/bkt/small", headers=headers)
            assert r.status_code == 401 and "SLUICE_READ_TOKEN" in r.text
            _same(r, served.route.get("/v1/objects/bkt/small", headers=headers))
        for token in ("r3ad", "s3cret"):
            r = served.inline.get(
                "/v1/objects/bkt/small", headers={"Authorization": f"Bearer {token}"}
            )
            assert r.status_code == 200 and r.content == SMALL
        assert served.answers == [False, False, True, True]


def _read_answer(f: Any) -> tuple[int, dict[str, str], bytes]:
    status = int(f.readline().split()[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, f.read(int(headers.get("content-length", 0)))


def test_pipelined_keep_alive_and_close(served: Served) -> None:
    host = re.sub(r"^http://", "", served.inline_url)
    addr = host.split(":")
    with socket.create_connection((addr[0], int(addr[1]))) as sock:
        f = sock.makefile("rb")
        ask = lambda p, extra="": f"GET {p} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n"  # noqa: E731
        sock.sendall(
            (
                ask("/v1/objects/bkt/small")
                + ask("/v1/objects/bkt/missing")
                + ask("/v1/objects/bkt/small")
            ).encode()
        )
        got = [_read_answer(f) for _ in range(3)]
        assert [(s, b == SMALL) for s, _, b in got] == [(200, True), (404, False), (200, True)]
        assert "missing" in got[1][2].decode()
        # past the header timeout (0.5 s) the kept-alive connection still serves
        time.sleep(1.0)
        sock.sendall(ask("/v1/objects/bkt/small", "Connection: close\r\n").encode())
        status, headers, body = _read_answer(f)
        assert (status, body == SMALL, headers["connection"]) == (200, True, "close")
        assert f.read() == b""  # the server closed it
    assert served.answers == [True, False, True, True]


def _metric(c: httpx.Client, name: str, **labels: str) -> float:
    """The sum of ``name``'s series that carry all of ``labels``."""
    total = 0.0
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_inline_answers_are_counted_as_the_routes(served: Served) -> None:
    route = {"route": "/v1/objects/{bucket}/{name:path}", "op": "get", "role": "target"}
    sent0 = _metric(served.route, "sluice_http_sent_bytes_total", **route)
    ok0 = _metric(served.route, "sluice_http_requests_total", **route, status="200")
    for _ in range(3):
        assert served.inline.get("/v1/objects/bkt/small").content == SMALL
    assert served.answers == [True] * 3
    assert _metric(served.route, "sluice_http_sent_bytes_total", **route) - sent0 == 3 * len(SMALL)
    assert _metric(served.route, "sluice_http_requests_total", **route, status="200") - ok0 == 3


def test_a_client_that_does_not_read_gets_no_pile_of_inline_answers(served: Served) -> None:
    """300 pipelined GETs of 120 KiB (36 MB of answers), nothing read for a while: once
    the connection's writing is paused the rest go the ASGI way, which stops reading the
    client's requests; every answer then arrives, complete and in order."""
    host = re.sub(r"^http://", "", served.inline_url)
    addr = host.split(":")
    n = 300
    with socket.create_connection((addr[0], int(addr[1]))) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        one = f"GET /v1/objects/bkt/mid HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        sock.sendall(one * n)
        time.sleep(1.0)
        answered_unread = sum(served.answers)
        f = sock.makefile("rb")
        got = [_read_answer(f) for _ in range(n)]
    assert all(status == 200 and body == MID for status, _, body in got)
    assert answered_unread < n // 2, f"{answered_unread} of {n} answered before any was read"
