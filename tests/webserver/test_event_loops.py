"""The transformer on asyncio's loop and on uvloop (``SLUICE_LOOP``), end to end.

uvicorn runs on uvloop whenever it is installed, and the transformer's data
path is a hand-written protocol layer (``streambuf``) under uvicorn's own: each
test here runs once per loop, over real sockets, with real worker processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import NamedTuple

import httpx
import pytest

from tests.servers import SessionServers, free_port
from tests.webserver.conftest import last_line, loop_transformer, tar_members, text_shard


class Transformers(NamedTuple):
    objects: str
    samples: str


@pytest.fixture(scope="module")
def urls(session_servers: SessionServers, loop_name: str) -> Transformers:
    return Transformers(
        loop_transformer(session_servers, "object", loop_name),
        loop_transformer(session_servers, "wds", loop_name),
    )


def test_object_mode_known_and_unknown_length(urls: Transformers) -> None:
    body = bytes(range(256)) * 12_000  # 3 MiB: several IPC frames, received in place
    whole = httpx.put(f"{urls.objects}/b/o.bin", content=body, timeout=30)
    assert whole.status_code == 200 and whole.content == body.upper()
    assert whole.headers["content-length"] == str(len(body))
    pieces = httpx.put(
        f"{urls.objects}/b/o.bin", content=body, params={"etl_args": "pieces"}, timeout=30
    )
    assert pieces.status_code == 200 and pieces.content == body.upper()
    assert pieces.headers["transfer-encoding"] == "chunked"


def test_object_failure_after_first_byte_aborts(urls: Transformers) -> None:
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "PUT", f"{urls.objects}/b/mid", params={"etl_args": "failmid"}, timeout=30
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                received += chunk
    assert 0 < len(received) <= 200_000


def test_wds_shard_streams_back_in_order(urls: Transformers) -> None:
    keys = [f"s{i:04d}" for i in range(200)]  # 4 MiB in, streamed out while it reads
    r = httpx.put(f"{urls.samples}/b/shard.tar", content=text_shard(keys), timeout=60)
    assert r.status_code == 200, r.text
    assert tar_members(r.content) == [
        (f"{k}.txt", k.upper().encode().ljust(20_000, b".")) for k in keys
    ]


def test_wds_failure_after_streaming_began_aborts(urls: Transformers) -> None:
    keys = [f"s{i:04d}" for i in range(100)] + ["poison"]
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "PUT", f"{urls.samples}/b/late.tar", content=text_shard(keys), timeout=60
        ) as r:
            assert r.status_code == 200
            r.read()


def test_unknown_loop_is_a_config_error() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "etl_runtime.webserver", "--port", str(free_port())],
        env={**os.environ, "SLUICE_ETL_NAME": "typo", "SLUICE_LOOP": "tokio"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert last_line(r.stderr) == (
        "sluice: ETL 'typo': SLUICE_LOOP='tokio' is not an event loop: "
        "use one of auto, asyncio, uvloop"
    )
