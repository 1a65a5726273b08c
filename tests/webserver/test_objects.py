"""Object mode in worker processes (``SLUICE_INLINE=0``) over real HTTP: results,
streaming, errors, auth, parallel workers. The inline default: test_inline,
test_default_shape."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import pytest

from tests.webserver.conftest import AUTH, TOKEN, pickled_code, source_code, transformer

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def dispatch(data: bytes, args: str | None) -> Any:
    """One user function whose behaviour the test picks with ``etl_args``."""
    import os
    import time

    cmd, _, arg = (args or "").partition(":")

    def wait_for(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 20
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}")
            time.sleep(0.01)

    if cmd == "upper":
        return data.upper()
    if cmd == "text":
        return data.decode() + " ✓"
    if cmd == "empty":
        return b""
    if cmd == "exit":  # the worker process dies mid-call
        os._exit(3)
    if cmd == "raise":
        raise ValueError(f"cannot handle {data[:8]!r}")
    if cmd == "print":
        print(f"user code saw {len(data)} bytes")
        return data
    if cmd == "chunks":  # second chunk only once the client has seen the first

        def chunks() -> Iterator[bytes]:
            yield b"first|"
            wait_for(lambda: os.path.exists(os.path.join(arg, "go")), "the go file")
            yield b"second"

        return chunks()
    if cmd == "failmid":

        def broken() -> Iterator[bytes]:
            yield b"x" * 200_000
            raise RuntimeError("disk on fire")

        return broken()
    if cmd == "barrier":  # returns only while another worker is inside fn too
        open(os.path.join(arg, str(os.getpid())), "w").close()
        wait_for(lambda: len(os.listdir(arg)) >= 2, "a second worker at the barrier")
        return str(os.getpid()).encode()
    return data


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    spec = {"mode": "object", "code": pickled_code(dispatch)}
    with transformer("objects", spec, workers=2, SLUICE_ETL_TOKEN=TOKEN, SLUICE_INLINE="0") as base:
        yield base


def put(url: str, path: str, body: Any = b"", **params: str) -> httpx.Response:
    return httpx.put(f"{url}/{path}", content=body, params=params, headers=AUTH, timeout=30)


def test_bytes_result_with_etl_args(url: str) -> None:
    r = put(url, "bkt/dir/a.txt", b"hello", etl_args="upper")
    assert r.status_code == 200
    assert r.content == b"HELLO"
    # a bytes result has a known length: Content-Length, not chunked encoding
    assert r.headers["content-length"] == "5" and "transfer-encoding" not in r.headers


def test_str_result_is_utf8(url: str) -> None:
    assert put(url, "bkt/a", b"ok", etl_args="text").content == "ok ✓".encode()


def test_chunked_request_body(url: str) -> None:
    def body() -> Iterator[bytes]:
        for i in range(50):
            yield f"{i:03d}".encode() * 1000

    r = put(url, "bkt/big", body(), etl_args="upper")
    assert r.status_code == 200
    assert r.content == b"".join(f"{i:03d}".encode() * 1000 for i in range(50))


def test_iterable_result_streams_chunks_as_produced(url: str, tmp_path: Path) -> None:
    with httpx.stream(
        "PUT",
        f"{url}/bkt/s",
        content=b"",
        params={"etl_args": f"chunks:{tmp_path}"},
        headers=AUTH,
        timeout=10,
    ) as r:
        assert r.status_code == 200
        assert r.headers["transfer-encoding"] == "chunked"  # length unknown
        parts = r.iter_raw()
        assert next(parts) == b"first|"  # sent while the function is still running
        (tmp_path / "go").touch()
        assert b"".join(parts) == b"second"


def test_fqn_reads_the_file(url: str, tmp_path: Path) -> None:
    path = tmp_path / "obj.bin"
    path.write_bytes(b"from disk")
    r = put(url, "bkt/obj.bin", etl_fqn=str(path), etl_args="upper")
    assert r.status_code == 200
    assert r.content == b"FROM DISK"


def test_fqn_outside_the_data_root_is_400_unopened(url: str, tmp_path: Path) -> None:
    link = tmp_path / "escape"
    link.symlink_to("/etc/passwd")
    for fqn in (
        "/etc/passwd",
        "/proc/self/environ",
        str(link),
        f"{tmp_path}/{'../' * 12}etc/hosts",
    ):
        r = put(url, "bkt/x", etl_fqn=fqn)
        assert r.status_code == 400, fqn
        assert "outside" in r.json()["error"] and b"root:" not in r.content


def test_fqn_missing_file_is_404(url: str, tmp_path: Path) -> None:
    r = put(url, "bkt/gone", etl_fqn=str(tmp_path / "gone"))
    assert r.status_code == 404
    assert "no such file" in r.json()["error"]


def test_token_required_except_health(url: str) -> None:
    r = httpx.put(f"{url}/bkt/a", content=b"x")
    assert r.status_code == 401
    assert r.json()["kind"] == "Unauthorized" and r.json()["etl"] == "objects"
    wrong = httpx.put(f"{url}/bkt/a", content=b"x", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/stats").status_code == 401
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200
    body = health.json()
    assert isinstance(body.pop("pid"), int)
    assert body == {"status": "ok", "etl": "objects", "mode": "object", "workers": 2, "servers": 1}


def test_unknown_or_repeated_hpush_parameters_are_400_by_name(url: str) -> None:
    """Only ``etl_args`` and ``etl_fqn``, once each: ``etl_args=upper&etl_args=x``
    transformed with ``x`` alone, and a misspelt ``etl_arg`` was ignored (200)."""
    r = httpx.put(f"{url}/bkt/a?etl_args=upper&etl_args=x", content=b"hi", headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "query parameter 'etl_args' given 2 times; give it once"
    assert r.json()["etl"] == "objects" and r.json()["object"] == "bkt/a"
    r = put(url, "bkt/a", b"hi", etl_arg="upper")
    assert r.status_code == 400 and "unknown query parameter(s) etl_arg" in r.json()["error"]
    assert "'bkt/a'" in r.json()["error"]
    assert put(url, "bkt/a", b"hi", etl_args="upper").content == b"HI"  # one each: fine


def test_user_exception_is_json_before_first_byte(url: str) -> None:
    r = put(url, "bkt/bad.bin", b"payload", etl_args="raise")
    assert r.status_code == 422
    body = r.json()
    assert body["kind"] == "TransformError"
    assert body["etl"] == "objects" and body["object"] == "bkt/bad.bin" and body["sample"] is None
    assert "ValueError: cannot handle b'payload'" in body["error"]
    assert "in dispatch" in body["detail"] and "ValueError" in body["detail"]


def test_failure_after_first_byte_aborts_the_connection(url: str) -> None:
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "PUT",
            f"{url}/bkt/mid",
            content=b"",
            params={"etl_args": "failmid"},
            headers=AUTH,
            timeout=30,
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                received += chunk
    assert 0 < len(received) <= 200_000
    last = httpx.get(f"{url}/stats", headers=AUTH).json()["last_errors"][-1]
    assert last["object"] == "bkt/mid" and "disk on fire" in last["error"]


def test_concurrent_requests_run_in_different_workers_at_once(url: str, tmp_path: Path) -> None:
    results: list[httpx.Response] = []

    def call() -> None:
        results.append(put(url, "bkt/b", etl_args=f"barrier:{tmp_path}"))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    pids = {int(r.content) for r in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert sorted(os.listdir(tmp_path)) == sorted(str(p) for p in pids)


def test_stats_and_logs(url: str) -> None:
    before = httpx.get(f"{url}/stats", headers=AUTH).json()
    assert put(url, "bkt/p", b"12345", etl_args="print").status_code == 200
    after = httpx.get(f"{url}/stats", headers=AUTH).json()
    assert after["objects"] == before["objects"] + 1
    assert after["bytes_in"] == before["bytes_in"] + 5
    assert after["bytes_out"] == before["bytes_out"] + 5
    logs = httpx.get(f"{url}/logs", params={"tail": 50}, headers=AUTH)
    assert logs.status_code == 200 and "user code saw 5 bytes" in logs.text


def test_an_empty_result_is_an_empty_answer_and_counted(url: str) -> None:
    before = httpx.get(f"{url}/stats", headers=AUTH).json()
    r = put(url, "bkt/e", b"abc", etl_args="empty")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-length"] == "0"
    r = put(url, "bkt/e", b"abc", etl_args="upper")  # the worker is free for the next one
    assert r.status_code == 200 and r.content == b"ABC"
    after = httpx.get(f"{url}/stats", headers=AUTH).json()
    assert after["objects"] == before["objects"] + 2
    assert after["bytes_out"] == before["bytes_out"] + 3


def test_a_worker_that_dies_is_a_503_to_retry_naming_the_object(url: str) -> None:
    """Nothing in Sluice failed and the worker is replaced: 503 + Retry-After (never a
    500), the body naming the object; the next call is served."""
    r = put(url, "bkt/dies", b"abc", etl_args="exit")
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    body = r.json()
    assert body["kind"] == "WorkerDied" and body["object"] == "bkt/dies", body
    assert "died" in body["error"], body
    r = put(url, "bkt/next", b"abc", etl_args="upper")
    assert r.status_code == 200 and r.content == b"ABC"


def test_source_code_with_entrypoint_and_one_argument() -> None:
    source = "import zlib\n\ndef shout(data):\n    return zlib.compress(data.upper())\n"
    spec = {"code": source_code(source, entrypoint="shout"), "workers": 1}
    with transformer("src", spec, workers=1) as url:
        r = httpx.put(f"{url}/b/o", content=b"abc", params={"etl_args": "ignored"})
        assert r.status_code == 200
        import zlib

        assert zlib.decompress(r.content) == b"ABC"
