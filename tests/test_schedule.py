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
