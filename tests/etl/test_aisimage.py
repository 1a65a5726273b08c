"""A real target speaking AIStore's hpush protocol to a user's ETL server
(``etl/aisimage.py``): the server of ``tests/images/hpush_echo`` run as a plain
process (no podman needed), registered as the transformer of an ETL whose spec
is an image (``commType: hpush://``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core.spec import EtlSpec
from tests.etl.conftest import CacheTarget, running_target
from tests.k8s.waiting import wait_for
from tests.servers import free_port

SERVER = Path(__file__).resolve().parents[1] / "images" / "hpush_echo" / "server.py"
BIG = bytes(range(97, 123)) * (5 * 2**20 // 26 + 1)  # > 4 MiB: streamed, not inline


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port)}
    proc = subprocess.Popen([sys.executable, str(SERVER)], env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def target(
    tmp_path: Path, echo_server: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CacheTarget]:
    monkeypatch.setenv("SLUICE_ETL_FQN", "always")  # as under sluice up: not for images
    for t in running_target(tmp_path / "data", None):  # type: ignore[arg-type]
        t.registry.put(
            EtlRecord(
                name="img",
                uid="uid-1",
                spec=EtlSpec.from_dict({"commType": "hpush://", "image": "me/echo:1"}),
                phase="Running",
                transformers=(TransformerStatus("t0", echo_server, ready=True),),
            )
        )
        for name, body in (("a.txt", b"hello"), ("big.bin", BIG)):
            for bad in ("", "fail-", "busy-", "direct-"):
                r = t.client.put(f"/v1/objects/bkt/{bad}{name}", content=body)
                assert r.status_code == 200, r.text
        yield t


def test_the_object_is_pushed_as_aistore_does_and_the_answer_relayed(
    target: CacheTarget,
) -> None:
    r = target.get("a.txt", "img")
    assert r.status_code == 200 and r.content == b"HELLO"
    assert (
        target.get("a.txt", "img", etl_args="md5").content
        == hashlib.md5(b"hello").hexdigest().encode()
    )
    big = target.get("big.bin", "img")
    assert big.status_code == 200 and big.content == BIG.upper()
    for name, size in (("a.txt", 5), ("big.bin", len(BIG))):
        seen = json.loads(target.get(name, "img", etl_args="request").content)
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        # the bytes with their length (no etl_fqn, no chunks), no Sluice token
        assert seen["length"] == size and headers["content-length"] == str(size)
        assert "transfer-encoding" not in headers and "authorization" not in headers
        assert seen["query"] == {"etl_args": ["request"]}


def test_errors_of_the_users_server_become_sluice_errors_naming_etl_and_object(
    target: CacheTarget,
) -> None:
    for name in ("fail-a.txt", "fail-big.bin"):
        r = target.get(name, "img")
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["kind"] == "TransformerFailed" and body["etl"] == "img"
        assert body["object"] == name and body["transformer_status"] == 500
        assert body["error"] == (
            f"ETL 'img' (image 'me/echo:1') failed to transform 'bkt/{name}': its server "
            f"answered 500: cannot transform /bkt/{name}"
        )
    busy = target.get("busy-a.txt", "img")
    assert busy.status_code == 503 and busy.headers["retry-after"]
    assert (
        "is busy for 'bkt/busy-a.txt' (its server answered 503: too busy)" in busy.json()["error"]
    )
    direct = target.get("direct-a.txt", "img")
    assert direct.status_code == 502 and "answered 204" in direct.json()["error"]
    # and the target still serves the next object
    assert target.get("a.txt", "img").content == b"HELLO"


def test_stats_and_logs_say_what_an_image_does_not_serve(target: CacheTarget) -> None:
    target.get("a.txt", "img")
    stats = target.client.get("/v1/_etl/img/stats").json()
    assert "serves no /stats" in stats["message"]
    logs = target.client.get("/v1/_etl/img/logs")
    assert logs.status_code == 400 and "podman logs" in logs.json()["error"]
