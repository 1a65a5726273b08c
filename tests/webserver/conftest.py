"""Helpers for transformer tests: real ``python -m etl_runtime.webserver`` children."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import httpx
import psutil

from etl_runtime.core.spec import runtime_python_version
from tests.servers import SessionServers, free_port, loop_of, serve_process

TOKEN = "test-etl-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def pickled_code(fn: Callable[..., Any], python_version: str | None = None) -> dict[str, Any]:
    return {
        "pickled": base64.b64encode(cloudpickle.dumps(fn)).decode(),
        "pythonVersion": python_version or runtime_python_version(),
    }


def source_code(source: str, entrypoint: str = "transform") -> dict[str, Any]:
    return {"source": source, "entrypoint": entrypoint}


def transformer_env(name: str, spec: dict[str, Any], **extra: str) -> dict[str, str]:
    # etl_fqn files of the tests live under pytest's tmp_path, below the temp dir.
    roots = {"SLUICE_DATA_ROOTS": tempfile.gettempdir()}
    return {"SLUICE_ETL_NAME": name, "SLUICE_ETL_SPEC": json.dumps(spec), **roots, **extra}


@contextlib.contextmanager
def transformer(name: str, spec: dict[str, Any], workers: int = 2, **env: str) -> Iterator[str]:
    """A transformer child process on a free loopback port; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serve_process(
        [
            "-m",
            "etl_runtime.webserver",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        f"{url}/health",
        env=transformer_env(name, spec, **env),
    ):
        yield url


def run_to_exit(
    name: str, spec: dict[str, Any], timeout: float = 90
) -> subprocess.CompletedProcess:
    """Run a transformer expected to refuse to start; return its exit and output."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "etl_runtime.webserver",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--workers",
            "1",
        ],
        env={**__import__("os").environ, **transformer_env(name, spec)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# Transformers for the event-loop tests (tests/*/test_event_loops.py), one of
# each kind per loop, started once per session: a wds transformer's start
# imports webdataset and torch.
LOOP_TEST_CODE = {
    "object": """
def transform(data, args):
    if args == "exit":  # the process running the function dies
        import os
        os._exit(3)
    if args == "failmid":
        def broken():
            yield b"x" * 200_000
            raise RuntimeError("disk on fire")
        return broken()
    if args == "pieces":  # unknown length: a chunked answer
        return (data[i : i + 100_000].upper() for i in range(0, len(data), 100_000))
    return data.upper()
""",
    "wds": """
import os

def transform(sample):
    if sample["__key__"] == "poison":
        raise ValueError("poisoned sample")
    if sample["__key__"] == "exit":  # the worker process dies
        os._exit(3)
    if sample["__key__"] == "badresult":
        return 42
    return {"__key__": sample["__key__"], "txt": sample["txt"].upper()}
""",
}


def loop_transformer(servers: SessionServers, mode: str, loop_name: str) -> str:
    """The ``mode`` (object|wds) test transformer on ``SLUICE_LOOP=loop_name``; its URL."""
    spec = {"mode": mode, "code": source_code(LOOP_TEST_CODE[mode])}

    def start() -> contextlib.AbstractContextManager[str]:
        return transformer(f"{mode}-{loop_name}", spec, workers=1, SLUICE_LOOP=loop_name)

    url = servers.get(("loop-transformer", mode, loop_name), start)
    # the env var is honoured, not just accepted: by the one server (wds), or by
    # the servers under the supervisor whose pid /health names (object, inline)
    pid = httpx.get(f"{url}/health").json()["pid"]
    servers = [p.pid for p in psutil.Process(pid).children()] if mode == "object" else [pid]
    assert servers and all(loop_of(p) == loop_name for p in servers), (pid, servers)
    return url


def text_shard(keys: list[str], size: int = 20_000) -> bytes:
    """A tar shard of one ``.txt`` member per key, each ``size`` bytes (the key, padded)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = size
            tar.addfile(info, io.BytesIO(key.encode().ljust(size, b".")))
    return buf.getvalue()


def tar_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
