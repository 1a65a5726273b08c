"""Helpers for transformer tests: real ``python -m etl_runtime.webserver`` children."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from etl_runtime.spec import runtime_python_version
from tests.servers import free_port, serve_process

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
    return {"SLUICE_ETL_NAME": name, "SLUICE_ETL_SPEC": json.dumps(spec), **extra}


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
