"""Shared pytest fixtures; server helpers live in ``tests/servers.py``."""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
from collections.abc import Iterator
from typing import Any

import httpx._transports.default as _httpx_transports
import pytest

from tests import schedule
from tests.servers import EVENT_LOOPS, SessionServers

_create_ssl_context = _httpx_transports.create_ssl_context


@functools.lru_cache(maxsize=4)
def _default_ssl_context(trust_env: bool) -> ssl.SSLContext:
    return _create_ssl_context(verify=True, cert=None, trust_env=trust_env)


def _shared_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    """Every ``httpx.get(...)`` and ``httpx.Client()`` loads certifi's CA bundle into a new
    SSL context: 33 ms of CPU each on the 2-core machine, thousands of times a run (the
    suite's clients speak plain HTTP on loopback and never use it). One context per
    process, as a long-lived client would hold; any other ``verify``/``cert`` as before."""
    if verify is True and cert is None:
        return _default_ssl_context(trust_env)
    return _create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)


_httpx_transports.create_ssl_context = _shared_ssl_context  # the name httpx's transports call

# Every gateway the suite starts (sluice up, tests/servers.py) would warm the
# transformer runtime at once (SLUICE_ZYGOTE=eager, the default): the full zygote
# imports torch and torchvision, about 18 CPU-s per cluster on the 2-core machine,
# in the many clusters that never run an ETL. Lazy warms it on the first
# transformer; tests/local/test_zygote*.py unset it to test the default.
os.environ.setdefault("SLUICE_ZYGOTE", "lazy")


@pytest.fixture(scope="module", params=EVENT_LOOPS)
def loop_name(request: pytest.FixtureRequest) -> str:
    """``asyncio`` then ``uvloop``: uvicorn runs on uvloop when it is installed, so both."""
    return str(request.param)


@pytest.fixture(scope="session")
def session_servers() -> Iterator[SessionServers]:
    """Slow-starting servers shared by every test that needs them (see ``SessionServers``)."""
    with contextlib.ExitStack() as stack:
        yield SessionServers(stack)


# How `make test` spreads the suite over its pytest-xdist workers (`-n 2 --dist
# loadgroup`): tests sharing a slow resource on one worker, the longest group first
# (tests/schedule.py).
_recorder = schedule.Recorder()
_WEIGHTS = pytest.StashKey[dict[str, float]]()
_TOOLS_LAST = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", default="no") == "loadgroup":
        # the groups in collection order, which heaviest_first sets (xdist's own
        # order, by number of tests, would leave a single slow test for the end)
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):
        config.stash[_WEIGHTS] = schedule.weights()
        config.stash[_TOOLS_LAST] = schedule.tools_pending()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist, on the controller: one order for all
    node.workerinput["sluice_group_weights"] = node.config.stash[_WEIGHTS]
    node.workerinput["sluice_tools_last"] = node.config.stash[_TOOLS_LAST]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under ``make test`` a test that needs the tools waits for their lane (tests/schedule.py)."""
    if os.environ.get(schedule.TOOLS_STATUS_ENV) and schedule.needs_tools(item):
        schedule.wait_for_tools()


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.xdist_group(schedule.group_of(item)))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist's scheduler groups by an ``@group`` suffix of the node id, which its worker
    sets as ``item._nodeid``; pytest 9 keeps the id in ``item._id`` instead, so on
    pytest 9 (xdist 3.8) the suffix never appears and the groups are ignored. Set it."""
    if not config.getoption("loadgroup", default=False):
        return
    groups: dict[str, str] = {}
    for item in items:
        marks = [m.args[0] for m in item.iter_markers("xdist_group") if m.args]
        if not marks or "@" in item.nodeid:
            continue
        group = "_".join(sorted(set(marks)))
        grouped = f"{item.nodeid}@{group}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped
        groups[item.nodeid] = group
    if len(groups) == len(items):
        workerinput = getattr(config, "workerinput", {})
        weights = workerinput.get("sluice_group_weights") or schedule.weights()
        tools_last = workerinput.get("sluice_tools_last", schedule.tools_pending())
        schedule.heaviest_first(items, groups, weights, tools_last)


# A skip hides a test as well as a failure does: under CI (``CI=true``) a run fails on
# any skip whose reason is not one the machine can explain. The reasons allowed are
# the machine's own limits, never "the project's module is missing".
EXPECTED_SKIPS = (
    "needs /proc to see open files",
    "no `mount` command here",
    "mounting a tmpfs is not permitted here",
    "needs root and a system Python",
    "glibc's mallopt: Linux servers",
)
_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _recorder.add(report)
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if not any(expected in reason for expected in EXPECTED_SKIPS):
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if whole_suite and not hasattr(config, "workerinput"):
        _recorder.save()  # the groups' seconds, for the next run's order
    if not _unexpected_skips or os.environ.get("CI", "").lower() not in ("1", "true"):
        return
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller decides
        return
    print("\nunexpected skips (CI fails on a skip it does not expect; tests/conftest.py):")
    for line in _unexpected_skips:
        print(f"  {line}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
