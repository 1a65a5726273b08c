"""How `make test` spreads the suite over its two pytest-xdist workers (``--dist loadgroup``).

Two rules, applied by ``tests/conftest.py``:

* **Groups.** The tests that share a slow resource run on one worker, so it starts
  once: a module's tests (its module-scoped cluster), a package's tests when they
  use a package-scoped fixture of its ``conftest.py`` (``tests/pytorch``'s cluster
  and ETLs, ``tests/s3``'s cluster: split over the workers, or interleaved with
  other groups on one, each run of them would start its own), and the modules
  that share one heavy session resource (a control plane, real kubelets).
* **Order: the longest group first.** xdist hands out groups in collection order
  (``--no-loadscope-reorder``; its own default orders them by number of tests,
  which puts a single slow test last, where it is the run's tail). Here a group's
  weight is its seconds in the last loadgroup run on this machine
  (``~/.cache/sluice/test-durations.json``, written by the controller at the end
  of each run), else the seed below (a cold machine's first run), else one
  second per test; the groups are collected heaviest first, the tests inside a
  group in their own order.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(
    os.environ.get("SLUICE_TEST_DURATIONS", "~/.cache/sluice/test-durations.json")
).expanduser()

# Modules that share one heavy session resource: (fixture, group).
SESSION_GROUPS = (
    ("real_cluster", "realnode"),  # control plane + real kubelets (tests/k8s/realfixtures.py)
    ("control_plane", "plane"),  # control plane + process kubelet (tests/k8s/fixtures.py)
    ("kubelet", "plane"),
    ("built_images", "images"),  # podman containers of the built images
)

# Seconds per group (setup + call + teardown) in a full run on the 2-core machine:
# the order of a first run, before this machine has durations of its own.
SEED = {
    "realnode": 420.0,
    "tests/pytorch": 330.0,
    "plane": 200.0,
    "tests/examples": 110.0,
    "tests/local/test_up_restarts.py": 90.0,
    "tests/batch/test_batch_etl.py": 90.0,
    "tests/webserver/test_safe_shards.py": 80.0,
    "tests/compat/test_aistore_image.py": 70.0,
    "tests/local/test_kill9_durability.py": 55.0,
    "tests/cluster/test_membership.py": 45.0,
    "tests/local/test_controller.py": 45.0,
    "tests/ui/test_status_page.py": 40.0,
}


def group_of(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    group = next((g for fixture, g in SESSION_GROUPS if fixture in names), None)
    return group or _package_home(item) or item.nodeid.split("::")[0]


def _package_home(item: pytest.Item) -> str | None:
    """The package whose ``conftest.py`` defines a package-scoped fixture the test uses."""
    info = getattr(item, "_fixtureinfo", None)
    homes = {
        defs[-1].baseid
        for defs in (info.name2fixturedefs.values() if info is not None else ())
        if defs and defs[-1].scope == "package" and "/" in defs[-1].baseid
    }
    return min(homes) if homes else None


def weights(path: Path = DURATIONS) -> dict[str, float]:
    """The groups' weights, read once by the controller and handed to its workers (two
    workers reading the file apart could see two versions: two orders, no run)."""
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(path.read_text())
        if isinstance(saved, dict):
            return {**SEED, **{str(k): float(v) for k, v in saved.items()}}
    return dict(SEED)


def heaviest_first(
    items: list[pytest.Item], groups: dict[str, str], weights: dict[str, float]
) -> None:
    """Reorder ``items`` in place: whole groups, heaviest first (stable inside a group)."""
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        group = groups[item.nodeid]
        count[group] = count.get(group, 0) + 1
        first.setdefault(group, i)

    def key(group: str) -> tuple[float, int]:
        return (-weights.get(group, float(count[group])), first[group])

    rank = {group: n for n, group in enumerate(sorted(count, key=key))}
    items.sort(key=lambda item: rank[groups[item.nodeid]])


class Recorder:
    """On the controller: seconds per group, saved at the end of a loadgroup run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, report: pytest.TestReport) -> None:
        if "@" in report.nodeid:
            group = report.nodeid.rsplit("@", 1)[1]
            self.seconds[group] = self.seconds.get(group, 0.0) + float(report.duration)

    def save(self, path: Path = DURATIONS) -> None:
        if not self.seconds:
            return
        saved: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads(path.read_text())
        saved = saved if isinstance(saved, dict) else {}
        saved.update({g: round(s, 1) for g, s in self.seconds.items()})
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dict(sorted(saved.items())), indent=1) + "\n")
            tmp.replace(path)
