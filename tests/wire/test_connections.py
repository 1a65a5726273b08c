"""Idle sockets must not deny service (issue 20): header timeout, connection cap, fd limit.

Real server processes on loopback, each on ``asyncio`` and ``uvloop``: the
target (``python -m etl_runtime.storage_target``, ``run_server``), the gateway,
and the transformer (one server process, and ``--servers 2``). Each starts
with its open-files soft limit lowered to 512 and must raise it to the hard
limit; ``SLUICE_HEADER_TIMEOUT`` / ``SLUICE_MAX_CONNECTIONS`` are set low.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from etl_runtime.local import certs
from etl_runtime.wire.http.connections import (
    HEADER_TIMEOUT,
    Limits,
    default_max_connections,
    limits_from_env,
)
from etl_runtime.wire.http.serving import noop, run_server
from tests.servers import free_port, loop_of, serve_process
from tests.webserver.conftest import source_code, transformer_env

LOW_SOFT = 512
HEAD = b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n"


def lower_fd_limit() -> None:
    """In the child, before Python starts: the soft limit many systems default to, or lower."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW_SOFT, hard), hard))


def fd_limits(pid: int) -> tuple[int, int]:
    """The open-files (soft, hard) limits of a process, from ``/proc/<pid>/limits``."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError(f"no open files limit for {pid}")


def assert_raised(pid: int) -> None:
    soft, hard = fd_limits(pid)
    assert soft == hard, (soft, hard)
    if hard > LOW_SOFT:
        assert soft > LOW_SOFT


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_after(sock: socket.socket, limit: float = 8.0) -> tuple[float, bytes]:
    """Seconds until the server closed ``sock``, and what it sent before."""
    start, got = time.monotonic(), b""
    sock.settimeout(limit)
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            got += chunk
    return time.monotonic() - start, got


def is_closed(sock: socket.socket, wait: float = 0.2) -> bool:
    """Whether the server closed this idle socket (it sent nothing else)."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except ConnectionResetError:
        return True


def request(sock: socket.socket, head: bytes = HEAD) -> bytes:
    """One request on ``sock``; its whole answer (a small JSON one)."""
    sock.sendall(head)
    sock.settimeout(10)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


@contextlib.contextmanager
def target(tmp_path: Path, loop: str, **env: str) -> Iterator[tuple[int, int]]:
    """A target process with its soft fd limit lowered; yields (port, pid)."""
    port = free_port()
    args = ["-m", "etl_runtime.storage_target", "--data-dir", str(tmp_path / f"t{port}")]
    env = {"SLUICE_HOST": "127.0.0.1", "SLUICE_PORT": str(port), "SLUICE_LOOP": loop, **env}
    url = f"http://127.0.0.1:{port}/v1/health"
    with serve_process(args, url, env=env, preexec_fn=lower_fd_limit) as proc:
        assert loop_of(proc.pid) == loop
        yield port, proc.pid


@pytest.fixture(scope="module")
def timed(loop_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """A target whose connections must send a request head within 1 s."""
    with target(tmp_path_factory.mktemp("timed"), loop_name, SLUICE_HEADER_TIMEOUT="1") as t:
        yield t


@pytest.fixture(scope="module")
def capped(loop_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """A target with at most 50 connections (the header timeout out of the way)."""
    with target(
        tmp_path_factory.mktemp("capped"),
        loop_name,
        SLUICE_MAX_CONNECTIONS="50",
        SLUICE_HEADER_TIMEOUT="60",
    ) as t:
        yield t


def test_silent_connection_closed_after_header_timeout(timed: tuple[int, int]) -> None:
    with connect(timed[0]) as sock:
        took, got = closed_after(sock)
    assert got == b""  # nothing was asked: nothing is answered
    assert 0.8 <= took <= 4.0, took


def test_partial_head_closed_with_408_though_it_trickles(timed: tuple[int, int]) -> None:
    """A slow trickle of header bytes does not restart the clock (slowloris)."""
    with connect(timed[0]) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n")
        start, got = time.monotonic(), b""
        sock.settimeout(0.2)
        while time.monotonic() - start < 8:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X")  # one more byte of a header name every 0.2 s
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        took = time.monotonic() - start
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert 0.8 <= took <= 4.0, took


def test_kept_alive_connection_outlives_the_header_timeout(timed: tuple[int, int]) -> None:
    """Between requests a connection keeps the 75 s keep-alive; a later head is timed again."""
    with connect(timed[0]) as sock:
        assert request(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(2.0)  # idle twice the header timeout
        assert request(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /v1/health HTTP/1.1\r\n")  # the next head never ends
        took, got = closed_after(sock)
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert 0.8 <= took <= 4.0, took


def test_fd_soft_limit_raised_to_hard(timed: tuple[int, int]) -> None:
    assert_raised(timed[1])


def test_cap_closes_the_oldest_idle_connections_first(capped: tuple[int, int]) -> None:
    port, pid = capped
    kept_alive = []
    for _ in range(30):  # idle after one request each
        sock = connect(port)
        assert request(sock).startswith(b"HTTP/1.1 200 ")
        kept_alive.append(sock)
    silent = [connect(port) for _ in range(30)]  # never sent anything
    idle = kept_alive + silent
    try:
        # a new client is served: fresh connections, then one pooled connection
        for _ in range(10):
            with connect(port) as sock:
                answer = request(sock, HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
                assert answer.startswith(b"HTTP/1.1 200 "), answer
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert [client.get("/v1/health").status_code for _ in range(10)] == [200] * 10
            time.sleep(0.3)  # the server's closes arrive
            closed = [is_closed(sock, wait=0) for sock in idle]
            # the oldest idle went first: a closed prefix, then the open rest
            k = closed.index(False)
            assert closed == [True] * k + [False] * (len(idle) - k), closed
            assert 10 <= k <= 30, k  # at least the 10 over the cap; every silent one kept
            established = [
                c
                for c in psutil.Process(pid).net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED
            ]
            assert len(established) <= 50, len(established)
    finally:
        for sock in idle:
            sock.close()


def test_cap_with_every_connection_busy_answers_503(capped: tuple[int, int]) -> None:
    """Nothing idle to close: a connection over the cap is answered 503, the busy ones go on."""
    port, _ = capped
    url = f"http://127.0.0.1:{port}"
    assert httpx.post(f"{url}/v1/buckets/bkt", json={"action": "create-bck"}).is_success
    head = b"PUT /v1/objects/bkt/slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n"
    busy = []
    try:
        for _ in range(50):  # uploads in progress: the app waits for their bodies
            sock = connect(port)
            busy.append(sock)
            sock.sendall(head + b"Expect: 100-continue\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 100 ")  # the app reads: busy
        with connect(port) as sock:
            assert request(sock).startswith(b"HTTP/1.1 503 ")
            assert closed_after(sock)[1] == b""  # Connection: close
        sock = busy.pop(0)
        # one upload ends: its connection is idle again
        assert request(sock, b"0123456789").startswith(b"HTTP/1.1 200 ")
        assert httpx.get(f"{url}/v1/health").status_code == 200  # closes it to make room
        assert is_closed(sock)
    finally:
        for sock in busy:
            sock.close()


def test_gateway_raises_its_limit_and_times_heads(loop_name: str, tmp_path: Path) -> None:
    port = free_port()
    args = ["-m", "etl_runtime.gateway", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--state-dir", str(tmp_path / "gw")]
    env = {
        "SLUICE_TARGETS": f"t0=http://127.0.0.1:{free_port()}",
        "SLUICE_LOOP": loop_name,
        "SLUICE_HEADER_TIMEOUT": "1",
    }
    url = f"http://127.0.0.1:{port}/v1/health"
    with serve_process(args, url, env=env, preexec_fn=lower_fd_limit) as proc:
        assert_raised(proc.pid)
        with connect(port) as sock:
            took, _ = closed_after(sock)
        assert 0.8 <= took <= 4.0, took


@pytest.mark.parametrize("servers", [1, 2])
def test_transformer_raises_its_limit_and_times_heads(loop_name: str, servers: int) -> None:
    port = free_port()
    args = ["-m", "etl_runtime.webserver", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--workers", "1", "--servers", str(servers)]
    spec = {"mode": "object", "code": source_code("def transform(data, args):\n    return data\n")}
    env = transformer_env("idle", spec, SLUICE_LOOP=loop_name, SLUICE_HEADER_TIMEOUT="1")
    with serve_process(
        args, f"http://127.0.0.1:{port}/health", env=env, preexec_fn=lower_fd_limit, timeout=90
    ) as proc:
        servers_pids = [proc.pid]
        if servers > 1:  # the supervisor's forked servers, not their workers
            children = psutil.Process(proc.pid).children()
            servers_pids = [c.pid for c in children if "sluice-server" in " ".join(c.cmdline())]
            servers_pids = servers_pids or [c.pid for c in children]
        for pid in servers_pids:
            assert_raised(pid)
        socks = [connect(port) for _ in range(4)]  # to whichever servers accept them
        try:
            for sock in socks:
                took, got = closed_after(sock)
                assert got == b"" and took <= 4.0, (took, got)
        finally:
            for sock in socks:
                sock.close()


def tls_connect(port: int, context: ssl.SSLContext, proc: subprocess.Popen) -> ssl.SSLSocket:
    """A TLS connection to ``port`` once the server listens (or raise if it died)."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            return context.wrap_socket(connect(port), server_hostname="127.0.0.1")
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_tls_server_stops_beside_an_idle_kept_alive_connection(
    loop_name: str, tmp_path: Path
) -> None:
    """SIGTERM while a client's TLS connection sits idle in its pool (a request answered,
    nothing read since): the server drops it and exits. A close waited for the client's
    close_notify, which an idle pooled connection never sends, so each TLS server of
    ``sluice up --tls`` (transformers behind the targets' pools) stayed until its grace
    ran out and it was killed; asyncio's and uvloop's SSL shutdown wait is 30 s."""
    ca = certs.make_ca(tmp_path / "tls")
    leaf = certs.make_cert(tmp_path / "tls", "t0", ca, ["127.0.0.1"])
    port = free_port()
    env = {
        **os.environ,
        "SLUICE_HOST": "127.0.0.1",
        "SLUICE_PORT": str(port),
        "SLUICE_LOOP": loop_name,
        "SLUICE_TLS_CERT": str(leaf.cert),
        "SLUICE_TLS_KEY": str(leaf.key),
    }
    args = [sys.executable, "-m", "etl_runtime.storage_target", "--data-dir", str(tmp_path / "t")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        context = ssl.create_default_context(cafile=str(ca.cert))
        with tls_connect(port, context, proc) as sock:
            assert b" 200 " in request(sock).split(b"\r\n", 1)[0]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0  # inside the 30 s SSL shutdown wait
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_limits_from_env() -> None:
    assert limits_from_env({}, None).header_timeout == HEADER_TIMEOUT
    assert default_max_connections(1024) == 768
    assert default_max_connections(20000) == 15000
    assert default_max_connections(1 << 20) == 65536
    assert limits_from_env({"SLUICE_MAX_CONNECTIONS": "50"}) == Limits(HEADER_TIMEOUT, 50)
    off = limits_from_env({"SLUICE_HEADER_TIMEOUT": "0", "SLUICE_MAX_CONNECTIONS": "0"})
    assert off == Limits(None, 0)
    for env in (
        {"SLUICE_HEADER_TIMEOUT": "soon"},
        {"SLUICE_HEADER_TIMEOUT": "-1"},
        {"SLUICE_HEADER_TIMEOUT": "inf"},
        {"SLUICE_MAX_CONNECTIONS": "many"},
        {"SLUICE_MAX_CONNECTIONS": "-5"},
    ):
        with pytest.raises(ValueError, match=next(iter(env))):
            limits_from_env(env)


def test_run_server_stops_on_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_MAX_CONNECTIONS", "lots")
    with pytest.raises(SystemExit, match="SLUICE_MAX_CONNECTIONS='lots' is not a number"):
        run_server(None, "127.0.0.1", free_port(), on_start=[noop], on_stop=[noop])
