"""Shared pytest fixtures; server helpers live in ``tests/servers.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.servers import EVENT_LOOPS, SessionServers


@pytest.fixture(scope="module", params=EVENT_LOOPS)
def loop_name(request: pytest.FixtureRequest) -> str:
    """``asyncio`` then ``uvloop``: uvicorn runs on uvloop when it is installed, so both."""
    return str(request.param)


@pytest.fixture(scope="session")
def session_servers() -> Iterator[SessionServers]:
    """Slow-starting servers shared by every test that needs them (see ``SessionServers``)."""
    with contextlib.ExitStack() as stack:
        yield SessionServers(stack)
