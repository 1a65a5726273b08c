"""Fixtures for the local cluster tests: real processes, real sockets."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import pytest

from etl_runtime.cluster.records import TargetInfo

STANDIN = (sys.executable, str(Path(__file__).with_name("standin_transformer.py")))
REAL = (sys.executable, "-m", "etl_runtime.webserver")


@pytest.fixture
def transformer_command() -> tuple[str, ...]:
    """The real transformer runtime (``STANDIN`` is for tests that need a fake one)."""
    return REAL


class FakeTargets:
    """A ``TargetDiscovery`` the test edits by hand."""

    def __init__(self, ids: list[str]) -> None:
        self.live = [TargetInfo(id=i, url=f"http://127.0.0.1:1/{i}") for i in ids]

    def targets(self) -> list[TargetInfo]:
        return list(self.live)


async def wait_until(
    cond: Callable[[], Awaitable[bool] | bool], timeout: float = 60.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok = cond()
        if not isinstance(ok, bool):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        await asyncio.sleep(0.1)


def transformer_pids(etl: str | None = None, leaders_only: bool = True) -> set[int]:
    """Live transformer processes (by their env) anywhere below this test process.

    Leaders are the transformers themselves (session leaders); the rest are
    their worker processes.
    """
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            env = p.environ()
            if p.status() == psutil.STATUS_ZOMBIE or "SLUICE_ETL_NAME" not in env:
                continue
            if leaders_only and os.getsid(p.pid) != p.pid:
                continue
            if etl is None or env["SLUICE_ETL_NAME"] == etl:
                out.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            pass  # it exited while we looked (os.getsid raises ProcessLookupError): gone
    return out


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
