"""Several server processes on one port (``SLUICE_SERVERS``), with workers or inline.

A user must see one transformer: every answer right, ``/stats`` counting all
requests whichever process answered, ``/health`` naming the process that was
started; errors keep their rules (JSON before the first byte, an aborted
connection after it) also when the code runs inline; and a SIGKILLed
transformer leaves no server or worker behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.servers import free_port, wait_http
from tests.webserver.conftest import AUTH, TOKEN, pickled_code, transformer_env
from tests.webserver.test_objects import dispatch

SPEC = {"mode": "object", "code": pickled_code(dispatch)}


@pytest.fixture(scope="module", params=["workers", "inline"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = transformer_env("multi", SPEC, SLUICE_ETL_TOKEN=TOKEN, SLUICE_SERVERS="2")
    env["SLUICE_INLINE"] = "1" if request.param == "inline" else "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "2"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{url}/health", timeout=90, proc=proc)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def put(url: str, path: str, body: bytes = b"", **params: str) -> httpx.Response:
    return httpx.put(f"{url}/{path}", content=body, params=params, headers=AUTH, timeout=30)


def test_one_transformer_to_its_users(served: tuple[str, subprocess.Popen], tmp_path: Path) -> None:
    url, proc = served
    health = httpx.get(f"{url}/health").json()
    assert health["pid"] == proc.pid and health["servers"] == 2 and health["status"] == "ok"
    before = httpx.get(f"{url}/stats", headers=AUTH).json()["objects"]
    bodies = [os.urandom(1000 + i) for i in range(40)]
    data = tmp_path / "obj"
    data.write_bytes(b"from a file")

    def one(i: int) -> httpx.Response:
        # A new connection each time: the kernel spreads them over both servers.
        return put(url, f"bkt/o{i}", bodies[i], etl_args="upper")

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(len(bodies))))
    assert [r.content for r in answers] == [b.upper() for b in bodies]
    r = put(url, "bkt/f", etl_fqn=str(data), etl_args="upper")
    assert r.status_code == 200 and r.content == b"FROM A FILE"
    stats = httpx.get(f"{url}/stats", headers=AUTH).json()
    assert stats["objects"] - before == len(bodies) + 1


def test_errors_before_and_after_the_first_byte(served: tuple[str, subprocess.Popen]) -> None:
    url, _ = served
    r = put(url, "bkt/bad.bin", b"payload", etl_args="raise")
    assert r.status_code == 422 and r.json()["kind"] == "TransformError"
    assert "cannot handle" in r.json()["error"]
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "PUT", f"{url}/bkt/mid", params={"etl_args": "failmid"}, headers=AUTH, timeout=30
        ) as s:
            assert s.status_code == 200
            for _ in s.iter_raw():
                pass
    errors = [e["object"] for e in httpx.get(f"{url}/stats", headers=AUTH).json()["last_errors"]]
    assert "bkt/bad.bin" in errors and "bkt/mid" in errors


@pytest.mark.parametrize("inline", ["0", "1"])
def test_sigkill_leaves_no_server_or_worker(inline: str) -> None:
    port = free_port()
    env = transformer_env(
        "multi", SPEC, SLUICE_ETL_TOKEN=TOKEN, SLUICE_SERVERS="2", SLUICE_INLINE=inline
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "2"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=90, proc=proc)
        kids = psutil.Process(proc.pid).children(recursive=True)
        # 2 servers, each with a forker helper and a worker; inline, the 2 servers
        assert len(kids) >= (2 if inline == "1" else 6)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs(kids, timeout=15)
        assert not alive, f"orphaned after SIGKILL: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connections_on_the_shared_port_send_small_answers_at_once(loop: str) -> None:
    """Accepted connections of the servers' shared socket have TCP_NODELAY on both
    loops (asyncio sets it only for sockets that say they are TCP): without it a
    small answer written in two parts waited ~40 ms for a delayed ACK."""
    import asyncio
    import socket

    from etl_runtime.core.eventloop import loop_factory
    from etl_runtime.webserver.servers import server_socket

    async def main() -> int:
        sock = server_socket("127.0.0.1", 0)
        sock.listen()
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        assert runner.run(main()) != 0
