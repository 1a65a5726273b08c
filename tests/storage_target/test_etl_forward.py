"""Transformed reads on a target, against real hpush transformers on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import requests
from fastapi import FastAPI

from tests.servers import free_port, serve_in_thread
from tests.storage_target.conftest import RunningTarget
from tests.storage_target.fakes import record, transformer_app


@pytest.fixture(scope="module")
def transformers() -> Iterator[dict[str, tuple[str, FastAPI]]]:
    apps = {
        "rev": transformer_app("rev"),
        "abort": transformer_app("abort", behavior="abort"),
        "fail": transformer_app("fail", behavior="error"),
        "rev-fqn": transformer_app("rev-fqn"),
    }
    with (
        serve_in_thread(apps["rev"]) as rev,
        serve_in_thread(apps["abort"]) as abort,
        serve_in_thread(apps["fail"]) as fail,
        serve_in_thread(apps["rev-fqn"]) as fqn,
    ):
        yield {
            "rev": (rev, apps["rev"]),
            "abort": (abort, apps["abort"]),
            "fail": (fail, apps["fail"]),
            "rev-fqn": (fqn, apps["rev-fqn"]),
        }


@pytest.fixture
def loaded(target: RunningTarget, transformers: dict[str, tuple[str, FastAPI]]) -> RunningTarget:
    c = target.client
    c.post("/v1/buckets/bkt", json={"action": "create-bck"})
    for name, (url, _app) in transformers.items():
        target.registry.put(record(name, {"t0": url}, arg_type="fqn" if name == "rev-fqn" else ""))
    return target


def test_transformed_get_streams_reversed_bytes(
    loaded: RunningTarget, transformers: dict[str, tuple[str, FastAPI]]
) -> None:
    c = loaded.client
    data = os.urandom(5 << 20)  # above the inline limit: the body is streamed to it
    c.put("/v1/objects/bkt/dir/big.bin", content=data)
    r = c.get("/v1/objects/bkt/dir/big.bin", params={"etl_name": "rev", "etl_args": "q=1"})
    assert r.status_code == 200
    assert r.content == data[::-1]
    assert r.headers.get("transfer-encoding") == "chunked"
    call = transformers["rev"][1].state.calls[-1]
    assert call["bucket"] == "bkt" and call["object"] == "dir/big.bin"
    assert call["args"] == "q=1" and call["body_len"] == len(data)
    # small objects too, and the plain read is untouched
    c.put("/v1/objects/bkt/small", content=b"hello")
    small = c.get("/v1/objects/bkt/small", params={"etl_name": "rev"})
    assert small.content == b"olleh"
    # a small answer with a known length is relayed whole, with Content-Length
    assert small.headers["content-length"] == "5" and "transfer-encoding" not in small.headers
    assert small.headers["x-sluice-etl"] == "rev"
    assert c.get("/v1/objects/bkt/small").content == b"hello"


def test_fqn_mode_sends_path_and_empty_body(
    loaded: RunningTarget, transformers: dict[str, tuple[str, FastAPI]]
) -> None:
    loaded.client.put("/v1/objects/bkt/f/x.txt", content=b"abc")
    path = str((loaded.data_dir / "buckets" / "bkt" / "f" / "x.txt").resolve())
    # by default the client is sent on to the transformer (tests/storage_target/test_direct.py)
    r = loaded.client.get("/v1/objects/bkt/f/x.txt", params={"etl_name": "rev-fqn"})
    assert r.status_code == 307 and f"etl_fqn={quote(path, safe='')}" in r.headers["location"]
    # relayed (SLUICE_ETL_REDIRECT_BYTES=off): the target sends the path and an empty body
    loaded.app.state.target.forwarder.redirect_bytes = None
    r = loaded.client.get("/v1/objects/bkt/f/x.txt", params={"etl_name": "rev-fqn"})
    assert r.content == b"cba"
    call = transformers["rev-fqn"][1].state.calls[-1]
    assert call["body_len"] == 0
    assert call["fqn"] == path


def test_unknown_etl_is_404(loaded: RunningTarget) -> None:
    loaded.client.put("/v1/objects/bkt/o", content=b"x")
    r = loaded.client.get("/v1/objects/bkt/o", params={"etl_name": "nope"})
    assert r.status_code == 404
    assert r.json()["kind"] == "EtlNotFound" and "'nope'" in r.json()["error"]
    r = loaded.client.get("/v1/objects/bkt/missing", params={"etl_name": "rev"})
    assert r.status_code == 404 and r.json()["kind"] == "ObjectNotFound"


def test_stopped_etl_is_409(loaded: RunningTarget, transformers: dict) -> None:
    loaded.client.put("/v1/objects/bkt/o", content=b"x")
    loaded.registry.put(record("rev", {"t0": transformers["rev"][0]}, stopped=True))
    r = loaded.client.get("/v1/objects/bkt/o", params={"etl_name": "rev"})
    assert r.status_code == 409
    assert r.json()["error"].startswith("ETL 'rev' is stopped; start it with")
    loaded.registry.put(record("rev", {"t0": None}, phase="Stopped", ready=False))
    assert loaded.client.get("/v1/objects/bkt/o", params={"etl_name": "rev"}).status_code == 409


def test_not_ready_is_503_with_retry_after(loaded: RunningTarget, transformers: dict) -> None:
    c = loaded.client
    c.put("/v1/objects/bkt/o", content=b"x")
    cases = [
        record("rev", {"t0": transformers["rev"][0]}, ready=False, phase="Initializing"),
        record("rev", {"t1": transformers["rev"][0]}),  # a transformer, but not beside t0
        record("rev", {"t0": f"http://127.0.0.1:{free_port()}"}),  # nothing listens
    ]
    for rec in cases:
        loaded.registry.put(rec)
        r = c.get("/v1/objects/bkt/o", params={"etl_name": "rev"})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"].isdigit()
        assert r.json()["kind"] == "EtlNotReady" and "'rev'" in r.json()["error"]


def test_transformer_error_is_passed_through(loaded: RunningTarget) -> None:
    loaded.client.put("/v1/objects/bkt/img.png", content=b"x")
    r = loaded.client.get("/v1/objects/bkt/img.png", params={"etl_name": "fail"})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "ValueError: bad pixel"
    assert body["etl"] == "fail" and body["bucket"] == "bkt" and body["object"] == "img.png"
    assert "Traceback" in body["detail"]


def test_broken_transformer_stream_aborts_the_client(loaded: RunningTarget) -> None:
    data = os.urandom(1 << 20)
    loaded.client.put("/v1/objects/bkt/o", content=data)
    url = f"{loaded.url}/v1/objects/bkt/o?etl_name=abort"
    got = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("GET", url, timeout=30) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                got += chunk
    assert 0 < len(got) < len(data)  # some bytes arrived, then the connection broke
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        requests.get(url, timeout=30)
    stats = loaded.client.get("/v1/_etl/abort/stats").json()
    assert stats["forward_errors"] == 2
    assert "broke off" in stats["last_errors"][-1]["error"]


def test_stats_and_logs_proxy(loaded: RunningTarget, transformers: dict) -> None:
    c = loaded.client
    c.put("/v1/objects/bkt/o", content=b"x")
    c.get("/v1/objects/bkt/o", params={"etl_name": "rev"})
    s = c.get("/v1/_etl/rev/stats").json()
    assert s["reachable"] is True and s["target"] == "t0"
    assert s["objects"] >= 1 and s["errors"] == 2 and s["bytes_out"] == 20
    assert s["last_errors"][0]["error"] == "boom"
    r = c.get("/v1/_etl/rev/logs", params={"tail": 5})
    assert r.status_code == 200 and r.text == "rev log line (tail=5)\n"
    assert c.get("/v1/_etl/nope/stats").status_code == 404
    loaded.registry.put(record("rev", {"t0": f"http://127.0.0.1:{free_port()}"}))
    s = c.get("/v1/_etl/rev/stats").json()
    assert s["reachable"] is False and "unavailable" in s["message"]
    assert c.get("/v1/_etl/rev/logs").status_code == 503
