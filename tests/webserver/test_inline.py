"""``--inline`` on one server process, on each event loop: what a user of the
hpush route sees when the code runs in the server's threads (answers, JSON
errors before the first byte, the 422 of a call past its deadline, the
bearer token) and that ``/stats`` and ``/metrics`` count every request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from etl_runtime.core.errors import BadRequest
from etl_runtime.webserver import bulk as bulk_route
from etl_runtime.webserver.fqn import FqnAccess
from etl_runtime.wire.formats import bulk
from tests.prom import scrape
from tests.webserver.conftest import AUTH, TOKEN, source_code, transformer

CODE = """
import time

def transform(data, args):
    if args == "sleep" or data == b"stuck":
        time.sleep(3)
    if args == "raise" or data == b"boom":
        raise ValueError("no thanks")
    if args == "pieces" or data.startswith(b"piece"):
        return (data[i : i + 3] for i in range(0, len(data), 3))
    return data.upper()
"""
HPUSH = {"role": "transformer", "route": "/{bucket}/{object:path}", "op": "put"}


@pytest.fixture(scope="module")
def url(loop_name: str) -> Iterator[str]:
    spec = {"mode": "object", "code": source_code(CODE), "timeouts": {"requestSeconds": 1}}
    env = {"SLUICE_ETL_TOKEN": TOKEN, "SLUICE_INLINE": "1", "SLUICE_LOOP": loop_name}
    env["SLUICE_SERVERS"] = "1"  # one server: its /metrics are all the requests
    with transformer(f"inline-{loop_name}", spec, workers=2, **env) as base:
        yield base


def put(url: str, path: str, body: bytes, **params: str) -> httpx.Response:
    return httpx.put(f"{url}/{path}", content=body, params=params, headers=AUTH, timeout=30)


def test_answers_errors_deadline_and_counts(url: str) -> None:
    before_stats = httpx.get(f"{url}/stats", headers=AUTH).json()
    before = scrape(url)

    r = put(url, "b/dir/o1", b"hello")
    assert r.status_code == 200 and r.content == b"HELLO"
    assert r.headers["content-length"] == "5"
    r = put(url, "b/o2", b"abcdefgh", etl_args="pieces")  # an iterable: chunked
    assert r.status_code == 200 and r.content == b"abcdefgh"
    assert "content-length" not in r.headers

    r = put(url, "b/bad", b"x", etl_args="raise")
    assert r.status_code == 422, r.text
    assert r.json()["kind"] == "TransformError" and r.json()["object"] == "b/bad"
    assert "no thanks" in r.json()["error"]

    r = httpx.put(f"{url}/b/o4", content=b"x", timeout=30)  # no token
    assert r.status_code == 401 and "bearer token" in r.json()["error"]

    # Before the deadline below: the HTTP metrics are the answering server's,
    # and the server whose call outlives it is replaced (the counters of the
    # /stats board stay; see test_default_shape).
    after = scrape(url)
    for status, count in (("200", 2), ("422", 1), ("401", 1)):
        rose = after.value("sluice_http_requests_total", status=status, **HPUSH)
        assert rose - before.value("sluice_http_requests_total", status=status, **HPUSH) == count

    r = put(url, "b/slow", b"x", etl_args="sleep")
    assert r.status_code == 422, r.text
    assert r.json()["kind"] == "TransformTimeout" and r.json()["object"] == "b/slow"
    # Another thread answers at once while the slow call runs on.
    assert put(url, "b/o3", b"after").content == b"AFTER"

    stats = httpx.get(f"{url}/stats", headers=AUTH).json()
    assert stats["objects"] - before_stats["objects"] == 3
    assert stats["errors"] - before_stats["errors"] == 2
    # The bodies of all five calls were received, also of those that failed.
    assert stats["bytes_in"] - before_stats["bytes_in"] == len(
        b"hello" + b"abcdefgh" + b"x" * 2 + b"after"
    )
    sent = after.value("sluice_http_sent_bytes_total", **HPUSH)
    assert sent - before.value("sluice_http_sent_bytes_total", **HPUSH) >= len(b"HELLOabcdefgh")


def test_a_batch_goes_on_past_an_object_stuck_past_its_deadline(url: str, tmp_path: Path) -> None:
    """In ``POST /_sluice/batch`` each object keeps its own ``requestSeconds``: the stuck
    one is 422 (TransformTimeout), and the others are transformed while its thread sleeps on."""
    items = []
    for i in range(20):
        f = tmp_path / f"o{i}"
        f.write_bytes(b"stuck" if i == 5 else f"item-{i}".encode())
        items.append([f"b/o{i}", str(f)])
    t0 = time.monotonic()
    r = httpx.post(
        f"{url}{bulk.PATH}", json={"etl_args": None, "items": items}, headers=AUTH, timeout=30
    )
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    raw, frames = r.content, []
    while raw:
        status, length = bulk.HEAD.unpack(raw[: bulk.HEAD.size])
        frames.append((status, raw[bulk.HEAD.size : bulk.HEAD.size + length]))
        raw = raw[bulk.HEAD.size + length :]
    assert len(frames) == 20
    for i, (status, body) in enumerate(frames):
        if i == 5:
            assert status == 422, body
            err = json.loads(body)
            assert err["kind"] == "TransformTimeout" and err["object"] == "b/o5"
        else:
            assert (status, body) == (200, f"ITEM-{i}".encode())
    assert took < 2.9  # the stuck object's thread was not waited for (it sleeps 3 s)


def _frames(raw: bytes) -> list[tuple[int, bytes]]:
    """Each object's (status, output): its pieces joined, or its error body."""
    out: list[tuple[int, bytes]] = []
    piece = b""
    while raw:
        status, length = bulk.HEAD.unpack(raw[: bulk.HEAD.size])
        body = raw[bulk.HEAD.size : bulk.HEAD.size + length]
        raw = raw[bulk.HEAD.size + length :]
        if status == bulk.MORE:
            piece += body
            continue
        out.append((status, piece + body if status == bulk.LAST else body))
        piece = b""
    return out


def test_a_batchs_objects_keep_their_own_outcomes_in_order(url: str, tmp_path: Path) -> None:
    """``POST /_sluice/batch`` with objects in work side by side on the two threads:
    each gets its own output, error and count, in request order."""
    items, want = [], []
    for i in range(45):
        f = tmp_path / f"r{i}"
        if i % 7 == 3:
            f.write_bytes(b"boom")
            want.append((422, "TransformError"))
        elif i % 5 == 1:
            f.write_bytes(f"pieces-{i}".encode())
            want.append((200, f"pieces-{i}".encode()))  # its pieces, as they are
        else:
            f.write_bytes(f"obj-{i}".encode())
            want.append((200, f"OBJ-{i}".encode()))
        items.append([f"b/r{i}", str(f)])
    items[20], want[20] = ["b/rel", "relative/path"], (400, "BadRequest")
    items[30], want[30] = ["b/gone", str(tmp_path / "gone")], (404, "ObjectNotFound")
    before = httpx.get(f"{url}/stats", headers=AUTH).json()
    r = httpx.post(
        f"{url}{bulk.PATH}", json={"etl_args": None, "items": items}, headers=AUTH, timeout=30
    )
    assert r.status_code == 200, r.text
    got = _frames(r.content)
    assert len(got) == len(items)
    for i, ((status, body), (status_wanted, what)) in enumerate(zip(got, want, strict=True)):
        assert status == status_wanted, (i, body)
        if status == 200:
            assert body == what, i
        else:
            err = json.loads(body)
            assert err["kind"] == what and err["object"] == items[i][0], (i, err)
    after = httpx.get(f"{url}/stats", headers=AUTH).json()
    failed = sum(1 for s, _ in want if s != 200)
    assert after["objects"] - before["objects"] == len(items) - failed
    assert after["errors"] - before["errors"] == failed - 1  # a path refused is not a call


def test_runs_are_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    """What an inline thread is handed at once: the batch spread over the threads,
    at most ``RUN_MAX`` objects and ``RUN_BYTES`` of files; a bigger file goes
    alone, so a batch of big objects holds no more in work than before runs."""
    items = []
    for i, size in enumerate([10 << 10] * 20 + [2 << 20] * 3 + [10 << 10] * 2):
        (tmp_path / f"f{i}").write_bytes(b"x" * size)
        items.append((f"b/f{i}", str(tmp_path / f"f{i}")))
    items[3] = ("b/rel", "relative/path")
    access = FqnAccess((str(tmp_path),), None)  # by path, confined to the root
    paths = asyncio.run(access.many([(obj, fqn, None) for obj, fqn in items], []))
    plan = bulk_route._runs(paths, threads=2)
    assert plan == [13, 7, 1, 1, 1, 2]  # 25 objects over 2 threads: at most 13 a run
    assert sum(plan) == len(items) == len(paths)
    assert isinstance(paths[3], BadRequest) and paths[0] == str(tmp_path / "f0")
    many = bulk_route._runs(paths[:2] * 40, threads=1)
    assert many == [bulk_route.RUN_MAX] * 5
