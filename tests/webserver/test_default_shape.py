"""What a user gets with no flags (issue 23): object code inline in supervised
servers, one per CPU; WebDataset with worker processes.

The safety the worker processes gave must hold: a transform that hangs is
answered 422 and the transformer keeps answering (its server is replaced, so
the stuck thread dies with it); a transform that kills the interpreter fails
only the requests on that server, never with data, and the next requests are
answered; a client that leaves frees its thread at once; the logs of every
server are in ``/logs``; and code that keeps killing its servers ends the
transformer with a line that says so. On both event loops.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver import sizing
from tests.servers import free_port
from tests.webserver.conftest import (
    AUTH,
    TOKEN,
    pickled_code,
    source_code,
    text_shard,
    transformer,
    transformer_env,
)


def misbehaves(data: bytes, args: str | None) -> bytes:
    import os
    import time

    if args == "pid":
        return str(os.getpid()).encode()
    if args == "kind":  # what the function was given, as a user's code would see it
        import hashlib

        return f"{type(data).__name__} {len(data)} {hashlib.md5(data).hexdigest()}".encode()
    if args == "hang":
        while True:  # holds its thread (and the GIL, in turns) for good
            time.sleep(0.01)
    if args == "exit":
        os._exit(7)
    print(f"transformed {data!r} in {os.getpid()}")
    return data.upper()


SPEC = {"mode": "object", "code": pickled_code(misbehaves), "timeouts": {"requestSeconds": 2}}


def put(c: httpx.Client, url: str, body: bytes = b"", **params: str) -> httpx.Response:
    return c.put(f"{url}/b/o", content=body, params=params, headers=AUTH)


def supervisor_tree(url: str) -> tuple[int, set[int]]:
    pid = httpx.get(f"{url}/health").json()["pid"]
    return pid, {p.pid for p in psutil.Process(pid).children()}


def test_the_default_shape_follows_mode_and_cpus() -> None:
    cpus = sizing.usable_cpus()
    obj = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    wds = EtlSpec.from_dict(
        {"mode": "wds", "code": {"source": "def transform(s):\n    return s\n"}}
    )
    assert sizing.shape(obj, None, None, None) == sizing.Shape(cpus, True, cpus)
    assert sizing.shape(wds, None, None, None) == sizing.Shape(1, False, cpus)
    assert sizing.shape(obj, 1, None, None).servers == 1  # never more servers than asked for
    assert sizing.shape(obj, None, None, False) == sizing.Shape(1, False, cpus)
    assert sizing.shape(obj, 4, 3, None).per_server == 2
    with pytest.raises(ValueError, match="SLUICE_INLINE"):
        sizing.parse_inline("sometimes")


def test_defaults_inline_and_safe(loop_name: str) -> None:
    """No --servers, no --inline: one inline server per CPU (2 workers asked here)."""
    env = {"SLUICE_ETL_TOKEN": TOKEN, "SLUICE_LOOP": loop_name}
    with transformer("shape", SPEC, workers=2, **env) as url, httpx.Client(timeout=30) as c:
        health = httpx.get(f"{url}/health").json()
        assert health["servers"] == min(2, sizing.usable_cpus()) and health["status"] == "ok"
        supervisor, servers = supervisor_tree(url)
        # the code runs in the servers themselves: no worker process below them
        assert all(not psutil.Process(p).children() for p in servers)
        assert put(c, url, b"abc").content == b"ABC"
        answering = {int(httpx.put(f"{url}/b/o", params={"etl_args": "pid"}, headers=AUTH).content)
                     for _ in range(10)}  # fmt: skip
        assert answering and answering <= servers

        # A large body reaches the function whole, as bytes, byte for byte (received
        # into one buffer: wire/wholebody), announced or chunked.
        big = os.urandom(3 << 20)
        want = f"bytes {len(big)} {hashlib.md5(big).hexdigest()}".encode()
        assert put(c, url, big, etl_args="kind").content == want
        chunked = c.put(f"{url}/b/o", content=iter([big[:100_000], big[100_000:]]),
                        params={"etl_args": "kind"}, headers=AUTH)  # fmt: skip
        assert chunked.content == want
        assert put(c, url, big[:70_000]).content == big[:70_000].upper()

        # A hang: 422 naming the limit; the transformer answers on, and the stuck
        # server is replaced (the supervisor stays).
        started = time.monotonic()
        r = put(c, url, etl_args="hang")
        assert r.status_code == 422 and r.json()["kind"] == "TransformTimeout", r.text
        assert time.monotonic() - started < 10
        for i in range(10):
            r = put(c, url, f"after-hang-{i}".encode())
            assert r.status_code == 200 and r.content == f"AFTER-HANG-{i}".encode()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now, now_servers = supervisor_tree(url)
            if len(now_servers) == len(servers) and now_servers != servers:
                break
            time.sleep(0.2)
        assert now == supervisor and now_servers != servers, "the stuck server was not replaced"
        assert httpx.get(f"{url}/health").json()["status"] == "ok"

        # A crash: that request gets no answer (an error, never data); the next do.
        with pytest.raises(httpx.TransportError):  # cut (no answer, or a reset): never data
            put(c, url, etl_args="exit")
        for i in range(10):
            r = put(c, url, f"after-exit-{i}".encode())
            assert r.status_code == 200 and r.content == f"AFTER-EXIT-{i}".encode()

        # Every server's lines, whichever answers, and the supervisor's.
        logs = c.get(f"{url}/logs", params={"tail": 500}, headers=AUTH).text
        printed = {
            int(line.rsplit(" ", 1)[1]) for line in logs.splitlines() if "transformed b'" in line
        }
        assert len(printed) >= 2, logs  # the first servers' and their replacements'
        assert "this server stops taking connections and will be replaced" in logs
        assert "ended with exit code 7; starting a new one" in logs
        stats = c.get(f"{url}/stats", headers=AUTH).json()
        assert stats["objects"] >= 21 and stats["errors"] >= 1
        assert any("took longer than 2s" in e["error"] for e in stats["last_errors"])


def health_once_settled(url: str) -> dict:
    """``/health`` just after the fixture saw it answer. On asyncio, about one start in
    ten resets this first connection (ECONNRESET, seen under load and on a quiet
    machine alike); the reset is not what this module is about, so it is retried."""
    for attempt in range(3):
        try:
            return httpx.get(f"{url}/health").json()
        except httpx.ReadError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def test_a_client_that_leaves_frees_its_thread(loop_name: str) -> None:
    # requestSeconds 60: a thread held until the timeout would make the next request wait
    # about a minute; freed when the client leaves, it waits for a replacement server only
    # (well under a second quiet, a few seconds on a loaded CI machine).
    spec = {**SPEC, "timeouts": {"requestSeconds": 60}}
    with (
        transformer(
            "leaves", spec, workers=1, SLUICE_ETL_TOKEN=TOKEN, SLUICE_LOOP=loop_name
        ) as url,
        httpx.Client(timeout=90) as c,
    ):
        assert health_once_settled(url)["servers"] == 1
        with pytest.raises(httpx.ReadTimeout):  # gives up long before requestSeconds
            c.put(f"{url}/b/o", params={"etl_args": "hang"}, headers=AUTH, timeout=1.0)
        started = time.monotonic()
        r = put(c, url, b"next")  # the only thread was stuck: another took its place
        assert r.status_code == 200 and r.content == b"NEXT", r.text
        assert time.monotonic() - started < 20, "the abandoned call held the thread"
        logs = c.get(f"{url}/logs", params={"tail": 100}, headers=AUTH).text
        assert "client left before the inline transform answered" in logs


def test_code_that_keeps_killing_its_servers_ends_the_transformer() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = transformer_env("killer", SPEC, SLUICE_ETL_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "1"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                httpx.put(f"{url}/b/o", params={"etl_args": "exit"}, headers=AUTH, timeout=5)
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert proc.wait(timeout=30) == 1  # not 2: not a configuration error
        last = [ln for ln in proc.stderr.read().splitlines() if ln.strip()][-1]  # type: ignore[union-attr]
        assert last.startswith("sluice: ETL 'killer': 10 server processes ended within 60s")
        assert "exit code 7" in last
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_wds_keeps_its_workers() -> None:
    spec = {"mode": "wds", "code": source_code("def transform(s):\n    return s\n")}
    with transformer("wds-shape", spec, workers=2, SLUICE_ETL_TOKEN=TOKEN) as url:
        health = httpx.get(f"{url}/health").json()
        assert health["servers"] == 1 and health["workers"] == 2
        r = httpx.put(f"{url}/b/s.tar", content=text_shard(["a", "b"]), headers=AUTH, timeout=30)
        assert r.status_code == 200
