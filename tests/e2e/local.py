"""Start a real ``LocalCluster`` for a test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from etl_runtime.local.up import LocalCluster


@contextlib.contextmanager
def running_cluster(data_dir: Path, targets: int = 3, token: str | None = None) -> Iterator[str]:
    """Yield the gateway URL of a fresh local cluster in ``data_dir``."""
    with LocalCluster(data_dir, targets=targets, port=0, token=token) as cluster:
        yield str(cluster.endpoint).rstrip("/")
