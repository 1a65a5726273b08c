"""The order `make test` hands groups to its workers (tests/schedule.py): heaviest first."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import schedule


def items_of(*nodeids: str) -> tuple[list[Any], dict[str, str]]:
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    return items, {n: n.rsplit("@", 1)[1] for n in nodeids}


def test_a_single_slow_test_goes_first_and_groups_stay_whole() -> None:
    items, groups = items_of(
        "tests/a.py::t1@tests/a.py",
        "tests/slow.py::t@tests/slow.py",
        "tests/a.py::t2@tests/a.py",
        "tests/b.py::t1@tests/b.py",
        "tests/a.py::t3@tests/a.py",
    )
    schedule.heaviest_first(items, groups, {"tests/slow.py": 300.0})
    assert [i.nodeid.split("@")[0] for i in items] == [
        "tests/slow.py::t",  # 300 s, one test: xdist's own order would run it last
        "tests/a.py::t1",  # no figure: one second a test, in their own order
        "tests/a.py::t2",
        "tests/a.py::t3",
        "tests/b.py::t1",
    ]


def test_a_whole_suite_runs_seconds_order_the_next_run(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/gone.py": 5.0, "tests/a.py": 1.0}))
    recorder = schedule.Recorder()
    for nodeid, seconds in (("tests/a.py::t1@tests/a.py", 2.5), ("tests/a.py::t2@tests/a.py", 4.0)):
        recorder.add(SimpleNamespace(nodeid=nodeid, duration=seconds))  # type: ignore[arg-type]
    recorder.save(path)
    assert json.loads(path.read_text()) == {"tests/a.py": 6.5, "tests/gone.py": 5.0}
    assert schedule.weights(path)["tests/a.py"] == 6.5
    assert schedule.weights(tmp_path / "none.json") == schedule.SEED


def test_this_module_is_its_own_group(request: pytest.FixtureRequest) -> None:
    assert schedule.group_of(request.node) == "tests/test_schedule.py"


def test_while_the_tools_build_the_groups_that_need_them_come_last() -> None:
    tools_test = SimpleNamespace(nodeid="tests/helm/test_chart.py::t@realnode")
    tools_test.fixturenames = ["real_cluster"]  # the cluster of make tools' Go binaries
    tools_test.path = schedule.TESTS / "helm" / "test_chart.py"
    plain = SimpleNamespace(nodeid="tests/core/test_heap.py::t@light", fixturenames=[])
    plain.path = schedule.TESTS / "core" / "test_heap.py"
    items: list[Any] = [tools_test, plain]
    groups = {tools_test.nodeid: "realnode", plain.nodeid: "light"}
    assert schedule.needs_tools(tools_test) and not schedule.needs_tools(plain)
    weights = {"realnode": 400.0, "light": 1.0}
    schedule.heaviest_first(items, groups, weights, tools_last=True)
    assert items == [plain, tools_test]
    schedule.heaviest_first(items, groups, weights)  # the tools are there: heaviest first
    assert items == [tools_test, plain]


def test_a_test_that_needs_the_tools_fails_when_their_build_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = tmp_path / "tools.status"
    monkeypatch.setenv(schedule.TOOLS_STATUS_ENV, str(status))
    monkeypatch.setenv(schedule.TOOLS_LOG_ENV, "/cache/tools.log")
    assert schedule.tools_pending()
    status.write_text("2\n")
    assert not schedule.tools_pending()
    with pytest.raises(pytest.fail.Exception, match=r"exit 2\): see /cache/tools.log"):
        schedule.wait_for_tools()
    status.write_text("0\n")
    schedule.wait_for_tools()
