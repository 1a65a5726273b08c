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


# Tests that share one heavy session resource run on one pytest-xdist worker
# (`make test` runs `-n 2 --dist loadgroup`): a second control plane or real-node
# cluster per worker would cost minutes and contend for the same node slots.
_GROUPS = (
    ("real_cluster", "realnode"),  # control plane + real kubelets (tests/k8s/realfixtures.py)
    ("control_plane", "plane"),  # control plane + process kubelet (tests/k8s/fixtures.py)
    ("kubelet", "plane"),
    ("built_images", "images"),  # podman containers of the built images
)


def pytest_itemcollected(item: pytest.Item) -> None:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in _GROUPS:
        if fixture in names:
            item.add_marker(pytest.mark.xdist_group(group))
            break


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist's scheduler groups by an ``@group`` suffix of the node id, which its worker
    sets as ``item._nodeid``; pytest 9 keeps the id in ``item._id`` instead, so on
    pytest 9 (xdist 3.8) the suffix never appears and the groups are ignored. Set it."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        marks = [m.args[0] for m in item.iter_markers("xdist_group") if m.args]
        if not marks or "@" in item.nodeid:
            continue
        grouped = f"{item.nodeid}@{'_'.join(sorted(set(marks)))}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped
