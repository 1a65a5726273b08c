"""Real servers on loopback for tests: uvicorn in a thread, or a child process.

Modelled on httpx's own test server: the data path is always exercised over a
real socket, never a mocked transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import httpx
import uvicorn

from etl_runtime.core.eventloop import loop_factory

EVENT_LOOPS = ("asyncio", "uvloop")  # the ``loop_name`` fixture runs a test on each
T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url`` answers 200 (or raise, with the child's exit if it died)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {url} was up")
        try:
            r = httpx.get(url, timeout=2.0)
            if r.status_code == 200:
                return
            last = r.status_code
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{url} not up after {timeout}s (last: {last!r})")


def run_on(loop_name: str, coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on the named loop (``asyncio``, ``uvloop``)."""
    with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
        return runner.run(coro)


def loop_of(pid: int) -> str:
    """``uvloop`` when the process has uvloop's extension loaded, else ``asyncio``.

    Only for servers started with ``SLUICE_LOOP=asyncio|uvloop``: nothing else
    in Sluice imports uvloop, so its presence tells which loop uvicorn built.
    """
    with open(f"/proc/{pid}/maps") as f:
        return "uvloop" if "/uvloop/loop." in f.read() else "asyncio"


class SessionServers:
    """Servers started on first use and kept until the test session ends.

    For servers whose start is slow (a wds transformer imports webdataset and
    torch) and that tests in several packages need: ``get(key, start)`` enters
    ``start()`` once per key and returns what it yielded.
    """

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._running: dict[Hashable, Any] = {}

    def get(self, key: Hashable, start: Callable[[], AbstractContextManager[T]]) -> T:
        if key not in self._running:
            self._running[key] = self._stack.enter_context(start())
        return self._running[key]  # type: ignore[no-any-return]


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # running in a thread
        pass


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", **config: Any) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a background thread; yield its base URL.

    ``loop="asyncio"|"uvloop"`` pins uvicorn's event loop (default: uvloop if installed).
    """
    port = free_port(host)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def serve_process(
    args: Sequence[str],
    health_url: str,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    preexec_fn: Callable[[], Any] | None = None,
) -> Iterator[subprocess.Popen]:
    """Run ``python args...`` as a child; wait for ``health_url``; stop it after.

    Its output goes to a temp file that is printed if start-up fails, so a
    failing test shows why the server died. ``preexec_fn`` runs in the child
    before it starts Python (e.g. to lower its open-files limit).
    """
    log = tempfile.NamedTemporaryFile("w+b", prefix="sluice-test-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn,
    )
    try:
        try:
            wait_http(health_url, timeout=timeout, proc=proc)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        os.unlink(log.name)
