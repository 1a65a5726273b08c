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
* **Tools last while they build.** ``make test`` runs pytest beside the tools lane
  (``scripts/test.sh``): while it has not finished, the groups with a test that
  needs a tool (``needs_tools``) come after all the others, and such a test waits
  for the lane's exit code (``wait_for_tools``) and fails if the lane failed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import time
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


# What `make tools` (scripts/tools.sh) puts in place, as test code names it: its cache,
# the Go builds (Kubernetes, etcd, helm, CoreDNS, MinIO, fake-gcs-server), the
# images (podman, buildah...), the browser, Azurite. A module needs the tools when
# it, a conftest.py above it or a tests.* module they import names one: one named
# needlessly only waits, one missed would fail on a cold machine.
TOOL_WORDS = re.compile(
    r"cache/sluice|SLUICE_CACHE|podman|buildah|skopeo|mmdebstrap|chromium|playwright|minio"
    r"|fake.gcs|azurite|kube-apiserver|kubelet|etcd|helm|coredns|k8s-tools|scripts/tools",
    re.IGNORECASE,
)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.\w+)+)", re.MULTILINE)
TESTS = Path(__file__).resolve().parent
TOOLS_STATUS_ENV = "SLUICE_TOOLS_STATUS"  # the tools lane's exit code, once it is done
TOOLS_LOG_ENV = "SLUICE_TOOLS_LOG"


@functools.cache
def _names_a_tool(path: Path) -> bool:
    """``path`` or a ``tests.*`` module it imports, at any depth, names a tool."""
    seen, todo = {path}, [path]
    while todo:
        with contextlib.suppress(OSError):
            text = todo.pop().read_text()
            if TOOL_WORDS.search(text):
                return True
            for found in filter(None, map(_module_file, _IMPORT.findall(text))):
                if found not in seen:
                    seen.add(found)
                    todo.append(found)
    return False


def _module_file(name: str) -> Path | None:
    """The file of ``tests.a.b`` (or of ``tests.a`` when ``b`` is a name in it)."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        base = TESTS.parent.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def needs_tools(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    if any(fixture in names for fixture, _ in SESSION_GROUPS):
        return True
    path = Path(str(item.path)).resolve()
    chain = [path, *(d / "conftest.py" for d in path.parents if d.is_relative_to(TESTS))]
    return any(_names_a_tool(p) for p in chain)


def tools_pending() -> bool:
    """True while ``make test``'s tools lane is still running (no exit code yet)."""
    status = os.environ.get(TOOLS_STATUS_ENV, "")
    return bool(status) and not Path(status).exists()


def wait_for_tools() -> None:
    """Block until the tools lane is done; fail the test if it failed."""
    status = os.environ.get(TOOLS_STATUS_ENV)
    if not status:
        return
    path = Path(status)
    while not path.exists():  # written once, atomically, by scripts/test.sh
        time.sleep(1.0)
    code = path.read_text().strip()
    if code != "0":
        log = os.environ.get(TOOLS_LOG_ENV, "its log")
        pytest.fail(f"make tools failed (exit {code}): see {log}", pytrace=False)


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
    items: list[pytest.Item],
    groups: dict[str, str],
    weights: dict[str, float],
    tools_last: bool = False,
) -> None:
    """Reorder ``items`` in place: whole groups, heaviest first (stable inside a group);
    with ``tools_last``, the groups that need the tools after all the others."""
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    tools: set[str] = set()
    for i, item in enumerate(items):
        group = groups[item.nodeid]
        count[group] = count.get(group, 0) + 1
        first.setdefault(group, i)
        if tools_last and group not in tools and needs_tools(item):
            tools.add(group)

    def key(group: str) -> tuple[bool, float, int]:
        return (group in tools, -weights.get(group, float(count[group])), first[group])

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
