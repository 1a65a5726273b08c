"""A real target server (uvicorn in a thread) over a temp data dir."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from etl_runtime.storage_target import create_target_app
from etl_runtime.wire.http import zerocopy
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry


@dataclass
class RunningTarget:
    url: str
    data_dir: Path
    registry: DictRegistry
    client: httpx.Client
    app: Any = None  # the target's FastAPI app (``app.state.target``)


def _run(tmp_path: Path, token: str | None, loop: str = "auto") -> Iterator[RunningTarget]:
    registry = DictRegistry()
    app = create_target_app("t0", tmp_path / "data", registry, token=token, cluster_key=CLUSTER_KEY)
    with (
        serve_in_thread(app, loop=loop, http=zerocopy.http_protocol({})) as url,  # as run_server
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield RunningTarget(url, tmp_path / "data", registry, client, app)


@pytest.fixture
def target(tmp_path: Path) -> Iterator[RunningTarget]:
    yield from _run(tmp_path, token=None)


@pytest.fixture
def target_on_loop(tmp_path: Path, loop_name: str) -> Iterator[RunningTarget]:
    """The target on ``loop_name`` (``asyncio``, ``uvloop``; see ``tests/conftest.py``)."""
    yield from _run(tmp_path, token=None, loop=loop_name)


@pytest.fixture
def secured_target(tmp_path: Path) -> Iterator[RunningTarget]:
    yield from _run(tmp_path, token="s3cret")
