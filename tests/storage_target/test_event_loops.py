"""Target -> transformer on asyncio's loop and on uvloop, end to end.

The target's full-duplex client (``target.duplex`` over ``streambuf``) and the
transformer both run on the loop under test, each test once per loop: a wds
shard larger than the socket buffers streamed through both, big and small
objects, and a transform that fails after its answer began. The target
process itself (``run_server``) builds the loop ``SLUICE_LOOP`` names.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.wire.http.serving import noop, run_server
from tests.servers import SessionServers, free_port
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import record
from tests.webserver.conftest import loop_transformer, tar_members, text_shard


@pytest.fixture
def loaded(
    target_on_loop: RunningTarget, session_servers: SessionServers, loop_name: str
) -> RunningTarget:
    target = target_on_loop
    target.client.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for mode in ("object", "wds"):
        url = loop_transformer(session_servers, mode, loop_name)
        target.registry.put(record(mode, {"t0": url}, mode=mode))
    # which loop the target really serves on: it reads its registry on that loop
    seen: set[str] = set()
    lookup = target.registry.get

    def get(name: str) -> EtlRecord | None:
        seen.add(type(asyncio.get_running_loop()).__module__.partition(".")[0])
        return lookup(name)

    target.registry.get = get  # type: ignore[method-assign]
    yield target
    assert seen == {loop_name}


def test_wds_shard_streams_through_target(loaded: RunningTarget) -> None:
    keys = [f"s{i:04d}" for i in range(400)]  # 16 MiB: more than the socket buffers hold
    assert loaded.client.put("/v1/objects/bkt/big.tar", content=text_shard(keys, 40_000)).is_success
    r = loaded.client.get("/v1/objects/bkt/big.tar", params={"etl_name": "wds"})
    assert r.status_code == 200, r.text
    assert tar_members(r.content) == [
        (f"{k}.txt", k.upper().encode().ljust(40_000, b".")) for k in keys
    ]


def test_objects_inline_and_streamed(loaded: RunningTarget) -> None:
    small, big = b"small object", bytes(range(256)) * 24_000  # 6 MiB: streamed both ways
    loaded.client.put("/v1/objects/bkt/small", content=small)
    loaded.client.put("/v1/objects/bkt/big", content=big)
    r = loaded.client.get("/v1/objects/bkt/small", params={"etl_name": "object"})
    assert r.content == small.upper() and r.headers["content-length"] == str(len(small))
    r = loaded.client.get(
        "/v1/objects/bkt/big", params={"etl_name": "object", "etl_args": "pieces"}
    )
    assert r.content == big.upper() and r.headers["transfer-encoding"] == "chunked"


def test_failure_after_first_byte_aborts_the_client(loaded: RunningTarget) -> None:
    loaded.client.put("/v1/objects/bkt/o", content=b"anything")
    url = f"{loaded.url}/v1/objects/bkt/o?etl_name=object&etl_args=failmid"
    got = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("GET", url, timeout=30) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                got += chunk
    assert 0 < len(got) <= 200_000  # some bytes arrived, then the connection broke


class _Started(Exception):
    """Raised by an ``on_start`` hook to end ``run_server`` before it serves."""


def test_run_server_honours_sluice_loop(loop_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target and gateway processes (``run_server``) build the loop SLUICE_LOOP names."""
    monkeypatch.setenv("SLUICE_LOOP", loop_name)
    seen: list[str] = []

    def on_start() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__.partition(".")[0])
        raise _Started

    with pytest.raises(_Started):
        run_server(FastAPI(), "127.0.0.1", free_port(), on_start=[on_start], on_stop=[noop])
    assert seen == [loop_name]

    monkeypatch.setenv("SLUICE_LOOP", "tokio")
    with pytest.raises(SystemExit) as e:
        run_server(FastAPI(), "127.0.0.1", free_port(), on_start=[on_start], on_stop=[noop])
    assert "SLUICE_LOOP='tokio' is not an event loop: use one of auto, asyncio, uvloop" in str(
        e.value
    )
