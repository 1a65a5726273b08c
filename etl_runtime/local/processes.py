"""Transformer processes: the local cluster's equivalent of transformer pods.

The local ETL controller decides *what* should run (``etl_runtime.cluster.reconcile``);
this module is the actuator underneath it. A ``TransformerProcess`` is one
``python -m etl_runtime.webserver`` child on ``127.0.0.1:<free port>``:

* it runs in its own session/process group: a Ctrl-C in the terminal goes to
  ``sluice up``, a kill of the group takes its worker processes too;
* stdout and stderr go to ``logs/<transformer name>.log`` (appended; the offset
  at start is kept: the termination message, its last line, is from this run);
* a ``run/<transformer name>.json`` pid file lets a restarted controller adopt
  transformers that outlived a crashed gateway.

Transformers are asyncio subprocesses started through ``launch``, so they get
a SIGTERM if the controller's process dies without stopping them -- unless
``sluice up`` supervises the gateway: then they are adopted by ``sluice up``
and live on until the restarted gateway adopts them (``launch --adoptable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from etl_runtime.cluster.reconcile import EXIT_CONFIG_ERROR, ObservedTransformer
from etl_runtime.cluster.records import TargetInfo, TransformerStatus
from etl_runtime.core import procs as launch
from etl_runtime.core import tls
from etl_runtime.local.pidfiles import write_pid_file
from etl_runtime.local.runas import TransformerUser
from etl_runtime.local.zygote import Zygote, ZygoteChild

LOG_TAIL_BYTES = 16 * 1024
LOG_ROTATE_BYTES = 10 * 1024 * 1024
# Inherited variables that must not leak into user code (secrets) or confuse
# the transformer (another server's flags).
_STRIPPED_ENV_PREFIX = "SLUICE_"


MAX_BACKOFF_SECONDS = 30.0


def restart_backoff(restarts: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 2.0 ** min(restarts, 5))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (Linux ``/proc``), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]  # state, ..., starttime


def pid_alive(pid: int, start_time: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if Path("/proc").is_dir():
        now = process_start_time(pid)
        if now is None or (start_time is not None and now != start_time):
            return False  # a zombie, or the pid now belongs to someone else
    return True


def last_line(path: Path, offset: int) -> str | None:
    """The last line printed since ``offset``; a ``sluice: ...`` line wins."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("sluice: "):
            return line[:1000]
    return lines[-1][:1000] if lines else None


def describe_exit(code: int | None, line: str | None) -> str:
    if code is None:
        why = "exited (exit code unknown: adopted from an earlier controller)"
    elif code < 0:
        try:
            why = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            why = f"killed by signal {-code}"
    else:
        why = f"exited with code {code}"
    if code == EXIT_CONFIG_ERROR and line:
        return line
    return f"{why}: {line}" if line else why


@dataclass
class TransformerProcess:
    """One transformer process beside one target (spawned or adopted)."""

    etl: str
    target: str
    name: str
    spec_hash: str
    port: int
    pid: int
    log_path: Path
    log_offset: int = 0
    start_time: str | None = None
    restarts: int = 0
    # What reaps it and keeps its exit code: the asyncio subprocess, or the zygote.
    popen: asyncio.subprocess.Process | ZygoteChild | None = field(default=None, repr=False)
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    ready_at: float | None = None  # time.monotonic() when it first answered /health
    probe_failures: int = 0
    terminated: bool = False
    exit_code: int | None = None
    exited_at: float | None = None
    message: str | None = "starting"
    kill_reason: str | None = None  # why we killed it, shown instead of the exit
    last_exit: str | None = None  # how the run before this one (same target) ended

    def exited_at_or(self, default: float) -> float:
        return self.exited_at if self.exited_at is not None else default

    @property
    def endpoint(self) -> str:
        return f"{tls.scheme()}://127.0.0.1:{self.port}"  # SLUICE_TLS_*: the transformers'

    def poll(self) -> bool:
        """Refresh ``terminated``/``exit_code``/``message``; True once it has exited."""
        if self.terminated:
            return True
        # kept current by asyncio's child watcher, or by the zygote's exit notices
        code = None if self.popen is None else self.popen.returncode
        if code is None:
            if self.popen is not None and not getattr(self.popen, "orphaned", False):
                return False
            if pid_alive(self.pid, self.start_time):
                return False
        self.terminated, self.exit_code, self.ready = True, code, False
        self.exited_at = time.monotonic()
        self.message = self.kill_reason or describe_exit(
            code, last_line(self.log_path, self.log_offset)
        )
        return True

    def observed(self) -> ObservedTransformer:
        return ObservedTransformer(
            name=self.name,
            target=self.target,
            spec_hash=self.spec_hash,
            endpoint=self.endpoint,
            ready=self.ready,
            terminated=self.terminated,
            exit_code=self.exit_code,
            restarts=self.restarts,
            message=None if self.ready else self._why_not_ready(),
            healthy_for=(
                self.exited_at - self.ready_at
                if self.exited_at is not None and self.ready_at is not None
                else None
            ),
            ready_for=(
                time.monotonic() - self.ready_at
                if self.ready and self.ready_at is not None
                else None
            ),
        )

    def _why_not_ready(self) -> str | None:
        if self.message == "starting" and self.last_exit:
            return f"starting again; its last run {self.last_exit}"
        return self.message

    async def probe(self, client: httpx.AsyncClient, failures_to_unready: int) -> None:
        """``GET /health``: ready, or why not (unready after that many failures in a row)."""
        try:
            r = await client.get(f"{self.endpoint}/health")
            ok, why = r.status_code == 200, f"not ready: /health answered {r.status_code}"
            if ok and not answered_by(self, r):
                # The port was taken by another server before our child bound it
                # (free_port() -> bind race); the child will die on EADDRINUSE.
                ok, why = False, f"not ready: port {self.port} is answered by another process"
        except httpx.HTTPError as e:
            ok, why = False, f"not ready: {type(e).__name__}"
        if self.terminated:  # it exited while the probe was out: poll() said why, keep that
            return
        if ok:
            self.ready, self.probe_failures, self.message = True, 0, None
            if self.ready_at is None:
                self.ready_at = time.monotonic()
            return
        self.probe_failures += 1
        if not self.ready:
            self.message = "starting" if why.endswith("ConnectError") else why
        elif self.probe_failures >= failures_to_unready:
            self.ready, self.message = False, f"health check failing ({why})"

    # -- pid files ------------------------------------------------------------

    def pid_record(self) -> dict[str, Any]:
        return {
            "etl": self.etl,
            "target": self.target,
            "name": self.name,
            "specHash": self.spec_hash,
            "port": self.port,
            "pid": self.pid,
            "startTime": self.start_time,
            "restarts": self.restarts,
            "log": str(self.log_path),
        }

    @classmethod
    def adopt(cls, d: dict[str, Any]) -> TransformerProcess | None:
        """The process a pid file describes, if it is still that very process."""
        try:
            p = cls(
                etl=d["etl"],
                target=d["target"],
                name=d["name"],
                spec_hash=d["specHash"],
                port=int(d["port"]),
                pid=int(d["pid"]),
                log_path=Path(d["log"]),
                start_time=d.get("startTime"),
                restarts=int(d.get("restarts", 0)),
            )
        except (KeyError, TypeError, ValueError):
            return None
        if not pid_alive(p.pid, p.start_time):
            return None
        with contextlib.suppress(OSError):
            p.log_offset = p.log_path.stat().st_size
        return p

    async def exited(self) -> None:
        """Return as soon as the process has exited (not at the next poll).

        A child: asyncio's own child watcher. An adopted process is no child of
        ours: a pidfd (Linux 5.3+) becomes readable when it exits; elsewhere poll.
        """
        if self.popen is not None:
            await self.popen.wait()
            return
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            while not self.poll():
                await asyncio.sleep(0.5)
            return
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        loop.add_reader(fd, _settle, gone)
        try:
            await gone
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    # -- stopping ---------------------------------------------------------------

    def _signal(self, sig: int, group: bool) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.pid, sig)  # session leader: pgid == pid
            elif not self.poll():
                os.kill(self.pid, sig)

    async def terminate(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL to the whole group after ``grace`` seconds."""
        if not self.poll():
            self._signal(signal.SIGTERM, group=False)
            deadline = time.monotonic() + grace
            while not self.poll() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        # Also sweeps worker processes left behind by a leader that died hard.
        self._signal(signal.SIGKILL, group=True)
        deadline = time.monotonic() + 5
        while not self.poll() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def transformer_env(
    base: dict[str, str], spec_env: tuple[tuple[str, str], ...], ours: dict[str, str]
) -> dict[str, str]:
    """The environment of a transformer: no inherited SLUICE_*, then spec.env, then ours."""
    env = {k: v for k, v in base.items() if not k.startswith(_STRIPPED_ENV_PREFIX)}
    env.update(dict(spec_env))
    env.update(ours)
    return env


async def spawn(
    *,
    etl: str,
    target: str,
    name: str,
    spec_hash: str,
    env: dict[str, str],
    state_dir: Path,
    restarts: int = 0,
    command: Sequence[str] = (sys.executable, "-m", "etl_runtime.webserver"),
    zygote: Zygote | None = None,
    user: TransformerUser | None = None,
    container: Callable[[int], list[str]] | None = None,
) -> TransformerProcess:
    """Start ``command --host 127.0.0.1 --port P`` for one target (``container(P)``
    instead: the argv of a container serving there, ``local/containers.py``).

    Forked by ``zygote`` when one is given (``python -m etl_runtime.webserver``
    with everything already imported; the child drops to ``user``), else an
    asyncio subprocess, forked by the event loop's thread, through the launcher
    that ties the transformer's life to this process (run by the command's own
    interpreter). ``user``: run it as that user (``local/runas.py``; the zygote
    runs as this process).
    """
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with contextlib.suppress(FileNotFoundError):
        if log_path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(log_path, log_path.with_suffix(".log.1"))
    port = free_port()
    # Under `sluice up` (a subreaper) a transformer outlives a gateway killed with -9:
    # the gateway comes back and adopts it from its pid file (issue 20 #6).
    adoptable = launch.SUPERVISOR_ENV in env
    where = ["--host", "127.0.0.1", "--port", str(port)]
    run, python = ([*command, *where], command[0]) if container is None else (container(port), None)
    argv = launch.command(os.getpid(), run, adoptable, python)
    dropped = None
    if user is not None:
        argv = user.command(argv)
        dropped = {"uid": user.uid, "gid": user.gid, "groups": list(user.groups)}
    with open(log_path, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        forked = zygote is not None
        how = f" (forked by the zygote, pid {zygote.pid})" if forked and zygote else ""
        log.write(f"--- {stamp} sluice: starting {name} on port {port}{how} ---\n".encode())
        log.flush()
        offset = log.tell()
        child: asyncio.subprocess.Process | ZygoteChild | None
        child = None
        if zygote is not None:
            try:
                child = await zygote.spawn(where, env, state_dir, log_path, adoptable, dropped)
            except (OSError, TimeoutError) as e:
                log.write(f"--- the zygote could not fork ({e}): starting afresh ---\n".encode())
                log.flush()
        if child is None:
            child = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=state_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    proc = TransformerProcess(
        etl=etl,
        target=target,
        name=name,
        spec_hash=spec_hash,
        port=port,
        pid=child.pid,
        log_path=log_path,
        log_offset=offset,
        start_time=process_start_time(child.pid),
        restarts=restarts,
        popen=child,
    )
    write_pid_file(state_dir, proc)
    return proc


def answered_by(p: TransformerProcess, r: httpx.Response) -> bool:
    """Whether a 200 ``/health`` came from ``p`` itself (its ETL name and pid).

    Fields a transformer does not report (an older runtime, a stand-in) are
    not held against it; a different ETL or pid is.
    """
    try:
        body = r.json()
    except ValueError:
        return True
    if not isinstance(body, dict):
        return True
    etl, pid = body.get("etl"), body.get("pid")
    return (etl is None or etl == p.etl) and (pid is None or pid == p.pid)


def status_of(target: TargetInfo, procs: list[TransformerProcess], want: str) -> TransformerStatus:
    """What the record says of ``target``'s transformer: its best process's state."""
    mine = [p for p in procs if p.target == target.id]

    def rank(p: TransformerProcess) -> tuple[bool, bool, bool]:
        return (not p.ready, p.spec_hash != want, p.terminated)

    if not mine:
        return TransformerStatus(target=target.id, endpoint=None, ready=False, message="pending")
    best = min(mine, key=rank)
    return TransformerStatus(
        target=target.id,
        endpoint=best.endpoint,
        ready=best.ready,
        pod=best.name,
        node=target.node,
        message=None if best.ready else best.message,
    )


def supervisor_env() -> dict[str, str]:
    """``sluice up``'s pid, when it supervises us: transformers then outlive a
    gateway killed with -9 and are adopted by its successor (``core.procs``)."""
    pid = os.environ.get(launch.SUPERVISOR_ENV)
    return {launch.SUPERVISOR_ENV: pid} if pid else {}
