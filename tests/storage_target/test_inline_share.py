"""A small GetBatch share (``POST /v1/_moss``) answered inside the HTTP protocol.

The target's answerer (``storage_target/inprotocol.py``, ``share_answerer``) takes
a share of plain items whose bytes are all read with the manifest and answers
it once its body is in (``wire/http/inprotocol.py``: ``on_message_complete``). Served
as in ``test_inline.py`` (the same app with and without the answerer, on
asyncio and uvloop): the inline answer must be the route's, byte for byte and
header for header; a share with a file to send by ``sendfile``, a chunked
body, an ETL share and a read without the token get the route's answer; a
body that comes after its head, and shares pipelined with a GET, are answered
in order.
"""

from __future__ import annotations

import json
import socket
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from etl_runtime.getbatch.exchange import MANIFEST_LEN, OK, SHARE_ETL_PATH, SHARE_PATH, padding
from tests.storage_target.test_inline import SMALL, Served, _metric, _serve

ROWS = [
    ["bkt", "small", 0, 0, "bkt/small"],
    ["bkt", "dir/typed", 0, 0, "x/typed"],
    ["bkt", "small", 5, 100, "bkt/small-range"],
    ["bkt", "gone", 0, 0, "bkt/gone"],
    ["nobucket", "o", 0, 0, "nobucket/o"],
]


@pytest.fixture
def served(tmp_path: Path, loop_name: str) -> Iterator[Served]:
    yield from _serve(tmp_path, loop_name, None, header_timeout=0.5)


def parsed(raw: bytes) -> tuple[list[object], list[tuple[str, bytes]]]:
    """A share's answer: its manifest, and each entry's name and bytes (the TAR headers'
    mtime is the second the share was opened: two answers may differ there)."""
    (n,) = MANIFEST_LEN.unpack_from(raw)
    pos = MANIFEST_LEN.size + n
    manifest = json.loads(raw[MANIFEST_LEN.size : pos])
    entries = []
    for entry in manifest:
        if entry[0] == OK:
            info = tarfile.TarInfo.frombuf(raw[pos : pos + 512], "utf-8", "surrogateescape")
            pos += entry[2]
            entries.append((info.name, raw[pos : pos + entry[1]]))
            pos += entry[1] + padding(entry[1])
    assert pos == len(raw)
    return manifest, entries


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code
    assert [(k, v) for k, v in a.headers.items() if k != "date"] == [
        (k, v) for k, v in b.headers.items() if k != "date"
    ]
    if a.status_code == 200:
        assert parsed(a.content) == parsed(b.content)
    else:
        assert a.content == b.content


def post(c: httpx.Client, rows: list[list[object]], path: str = SHARE_PATH) -> httpx.Response:
    return c.post(path, json={"in": rows})


def test_a_share_answered_inline_is_the_routes_answer(served: Served) -> None:
    inline, route = post(served.inline, ROWS), post(served.route, ROWS)
    assert inline.status_code == 200 and SMALL in inline.content
    _same(inline, route)
    assert served.answers == [True]


def test_shares_the_answerer_declines_get_the_routes_answer(served: Served) -> None:
    big = [["bkt", "big", 0, 0, "bkt/big"], *ROWS]  # 512 KiB: a file for sendfile
    _same(post(served.inline, big), post(served.route, big))
    etl = post(served.inline, ROWS, SHARE_ETL_PATH)  # not a share through an ETL: 400
    _same(etl, post(served.route, ROWS, SHARE_ETL_PATH))
    assert etl.status_code == 400
    bad = served.inline.post(SHARE_PATH, content=b"[1, 2")
    _same(bad, served.route.post(SHARE_PATH, content=b"[1, 2"))
    assert bad.status_code == 400

    def chunked() -> Iterator[bytes]:  # no Content-Length: never answered inline
        yield json.dumps({"in": ROWS}).encode()

    _same(
        served.inline.post(SHARE_PATH, content=chunked()),
        served.route.post(SHARE_PATH, content=chunked()),
    )
    assert served.answers == [False, False, False]  # big share, ETL path, bad body: declined


def test_a_body_after_its_head_and_pipelined_requests(served: Served) -> None:
    host, port = served.inline_url.split("//")[1].split(":")
    body = json.dumps({"in": ROWS}).encode()
    head = f"POST {SHARE_PATH} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    want = parsed(post(served.route, ROWS).content)
    get = b"GET /v1/objects/bkt/small HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head.encode())
        time.sleep(0.3)  # the body comes later than the head, in another segment
        s.sendall(body)
        s.sendall(head.encode() + body + get + head.encode() + body)  # pipelined
        answers = _read_answers(s, 4)
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    assert answers[2][1] == SMALL
    assert [parsed(answers[k][1]) for k in (0, 1, 3)] == [want, want, want]
    assert served.answers == [True, True, True, True]


def test_a_share_without_the_token_is_the_routes_401(tmp_path: Path, loop_name: str) -> None:
    for served in _serve(tmp_path, loop_name, "tok", header_timeout=0.5, read_token="rt"):
        r = post(served.inline, ROWS)
        assert r.status_code == 401
        _same(r, post(served.route, ROWS))
        ok = served.inline.post(
            SHARE_PATH, json={"in": ROWS}, headers={"Authorization": "Bearer rt"}
        )
        assert ok.status_code == 200 and SMALL in ok.content


def _read_answers(s: socket.socket, n: int) -> list[tuple[int, bytes]]:
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            buf += s.recv(1 << 16)
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
        while len(buf) < length:
            buf += s.recv(1 << 16)
        out.append((int(lines[0].split()[1]), buf[:length]))
        buf = buf[length:]
    return out


def test_an_inline_share_is_counted_as_the_routes(served: Served) -> None:
    route = {"route": SHARE_PATH, "op": "post", "role": "target"}
    names = ("sluice_http_requests_total", "sluice_http_sent_bytes_total")
    names += ("sluice_http_received_bytes_total",)

    def counts() -> list[float]:
        return [_metric(served.route, n, **route) for n in names]

    before = counts()
    post(served.route, ROWS).raise_for_status()
    by_route = [b - a for a, b in zip(before, counts(), strict=True)]
    before = counts()
    post(served.inline, ROWS).raise_for_status()
    inline = [b - a for a, b in zip(before, counts(), strict=True)]
    assert served.answers == [True]
    assert inline == by_route and by_route[0] == 1
