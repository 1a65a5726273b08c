"""Child processes of ``sluice up``: start them, watch them, leave no orphans.

The servers of a local cluster run as children in their own sessions, so a
Ctrl-C in the terminal reaches only ``sluice up``, which then stops them in
order (gateway first: it stops its transformers; then targets). Three things
make sure nothing outlives the cluster, even when something dies hard:

* on Linux, ``sluice up`` becomes a *child subreaper*: transformers orphaned
  by a gateway that was SIGKILLed are re-parented to it, not to init, and are
  swept at shutdown;
* each child starts through ``launch`` (``PR_SET_PDEATHSIG=SIGTERM``): if
  ``sluice up`` itself is SIGKILLed, its servers still get a SIGTERM;
* ``run/up.json`` lists the children of the running ``sluice up``; a later
  ``sluice up`` on the same data dir stops any that are still alive.

A child that exits on its own is restarted the way a kubelet restarts a
container: same command (so a target keeps its id, port and data dir, the
gateway its port), after a back-off that doubles with every crash in a row
(``RestartPolicy``). A child that has stayed up long enough starts afresh.
One that crashes ``max_crashes`` times in a row is *down*: the gateway is
given up on (nothing can be served without it), a target is left out and
retried every ``down_delay`` seconds while the rest of the cluster serves
(``write_down_file`` tells the gateway why, for ``sluice cluster``, ``/ui``
and its metrics).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etl_runtime.core import procs as launch
from etl_runtime.local.processes import last_line, pid_alive, process_start_time

PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # Loaded in the parent: find_library may run helper programs, which must
    # not happen between fork and exec.
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _prctl(option: int, value: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    try:
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except AttributeError:
        return False


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where unsupported."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


@dataclass
class RestartPolicy:
    """Back-off for restarting one child: 0.5 s, 1 s, 2 s, ... up to ``max_delay``.

    ``crashes`` counts crashes in a row; a child that stayed up at least
    ``reset_after`` seconds before crashing starts a new row (and the shortest
    delay again), like a kubelet's ``CrashLoopBackOff``.
    """

    max_crashes: int = 5
    first_delay: float = 0.5
    max_delay: float = 10.0
    reset_after: float = 30.0
    crashes: int = 0
    # None: give up after max_crashes in a row; else keep retrying this often (down).
    down_delay: float | None = None

    @property
    def down(self) -> bool:
        """Crashed ``max_crashes`` times in a row (and not up long enough since)."""
        return self.crashes >= self.max_crashes

    def crashed(self, uptime: float) -> float | None:
        """Count a crash after ``uptime`` seconds up: the delay before restarting, or None
        when this was crash ``max_crashes`` in a row and the child should stay down."""
        if uptime >= self.reset_after:
            self.crashes = 0
        self.crashes += 1
        if self.down:
            return self.down_delay
        return min(self.max_delay, self.first_delay * 2.0 ** (self.crashes - 1))

    def settled(self, uptime: float) -> bool:
        """Start a new row once the child has stayed up ``reset_after`` seconds;
        True if it was down until now."""
        if self.crashes and uptime >= self.reset_after:
            was_down, self.crashes = self.down, 0
            return was_down
        return False


@dataclass
class Child:
    """One server process of the local cluster (a target or the gateway)."""

    name: str
    argv: list[str]
    log_path: Path
    health_url: str
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_offset: int = 0
    env: dict[str, str] = field(default_factory=dict, repr=False)
    started_at: float = 0.0  # time.monotonic() of the last start
    restart_at: float | None = None  # set while waiting out a back-off
    policy: RestartPolicy = field(default_factory=RestartPolicy)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, env: dict[str, str]) -> None:
        """Start the process (again, with the same ``argv``, when restarting)."""
        self.env, self.restart_at = env, None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {stamp} sluice up: starting {self.name} ---\n".encode())
            log.flush()
            self.log_offset = log.tell()
            self.popen = subprocess.Popen(
                launch.command(os.getpid(), self.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def schedule_restart(self) -> float | None:
        """After an exit: the back-off before the restart (now counted), or None to give up."""
        delay = self.policy.crashed(self.uptime())
        if delay is not None:
            self.restart_at = time.monotonic() + delay
        return delay

    def restart_due(self) -> bool:
        return self.restart_at is not None and time.monotonic() >= self.restart_at

    def exit_reason(self) -> str:
        """``exited with code 1`` / ``was killed by SIGKILL``, plus its last log line."""
        code = self.exit_code()
        how = f"exited with code {code}" if code is not None and code >= 0 else "was killed"
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-code).name}"
        line = last_line(self.log_path, self.log_offset)
        return f"{how}: {line}" if line else how

    def describe_exit(self) -> str:
        return f"{self.name} {self.exit_reason()} (log: {self.log_path})"

    def signal(self, sig: int, group: bool = False) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.popen.pid, sig)
            elif self.popen.poll() is None:
                self.popen.send_signal(sig)

    def stop(self, grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM, wait up to ``grace`` (less if ``hurry()``), then SIGKILL the group."""
        if self.popen is None:
            return
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.popen.poll() is None and time.monotonic() < deadline and not hurry():
            time.sleep(0.05)
        self.signal(signal.SIGKILL, group=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


def write_children_file(path: Path, children: Sequence[Child]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "startTime": process_start_time(os.getpid())}
    kids = [
        {"name": c.name, "pid": c.pid, "startTime": process_start_time(c.pid)}
        for c in children
        if c.popen is not None and c.exit_code() is None
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"supervisor": me, "children": kids}))
    os.replace(tmp, path)


def write_down_file(path: Path, down: dict[str, dict[str, Any]]) -> None:
    """``run/down.json``: the targets ``sluice up`` has marked down, and why.

    ``{"t2": {"reason": ..., "crashes": N, "since": epoch, "retry_at": epoch}}``;
    the gateway of the local cluster reads it (``StaticTargets``) to say why a
    target is away. Written atomically; removed when no target is down.
    """
    if not down:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(down, sort_keys=True))
    os.replace(tmp, path)


def stop_stale_children(path: Path) -> list[str]:
    """Stop servers a previous, hard-killed ``sluice up`` left behind; their names."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    stopped = []
    for kid in data.get("children", []):
        pid, start = int(kid["pid"]), kid.get("startTime")
        if start is None or not pid_alive(pid, start):
            continue  # without a start time we cannot tell a reused pid apart
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
            stopped.append(str(kid.get("name")))
    deadline = time.monotonic() + 15
    for kid in data.get("children", []):
        pid, start = int(kid["pid"]), kid.get("startTime")
        while start and pid_alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.1)
        if start and pid_alive(pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return stopped


def sweep_descendants(known: set[int]) -> list[int]:
    """SIGKILL every remaining child of this process (and its group); reap them.

    With the subreaper bit these include transformers orphaned by a gateway
    that died; ``known`` children are reaped by their ``Popen`` instead.
    """
    killed = []
    for _ in range(3):
        kids = [p for p in children_of(os.getpid()) if p not in known]
        if not kids:
            break
        for pid in kids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.1)
        reap_orphans(known)
    return killed


def reap_orphans(known: set[int]) -> None:
    """Collect exit statuses of adopted orphans (not of our own ``Popen`` children)."""
    for pid in children_of(os.getpid()):
        if pid in known:
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
