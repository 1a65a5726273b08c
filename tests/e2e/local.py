"""Start a real ``LocalCluster`` for a test module (skips until the local cluster exists)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def running_cluster(data_dir: Path, targets: int = 3, token: str | None = None) -> Iterator[str]:
    """Yield the gateway URL of a fresh local cluster in ``data_dir``."""
    module = pytest.importorskip("etl_runtime.local.up", reason="local cluster not built yet")
    with module.LocalCluster(data_dir, targets=targets, port=0, token=token) as cluster:
        yield str(cluster.endpoint).rstrip("/")
