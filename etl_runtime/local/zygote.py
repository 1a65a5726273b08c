"""The local ETL controller's handle on the pre-started transformer runtime (the zygote).

``python -m etl_runtime.webserver --zygote-fd N`` (``webserver/zygote.py``) imports the
transformer's modules and the heavy libraries once; the controller then asks
it to fork each new transformer instead of starting ``python -m
etl_runtime.webserver`` afresh. ``Zygote`` starts it (through the launcher, so
it dies with the gateway), speaks its JSON-lines protocol over a socketpair,
and keeps each forked transformer's exit code (``ZygoteChild.returncode``,
what ``TransformerProcess.poll`` reads, as it reads an asyncio subprocess's).

There are two (``Zygotes``): a *lite* one that preloads only the server's
modules (``SLUICE_ZYGOTE_STAGE=lite``: ready in about a second, log
``zygote-lite.log``) and the full one (torch, torchvision ...: ten seconds of
CPU, longer on a busy machine; ``zygote.log``). A new transformer is forked
by the full one once it is ready, else by the lite one; it waits only for the
lite one's warm-up (short, and a fresh start would import the same modules),
never for the full one's, which starts once the lite one is ready. A child
of the lite zygote that needs torch imports it itself, as a fresh start
would; later ETLs get the full zygote.

``SLUICE_ZYGOTE`` (read by the gateway) says when they start: ``eager`` (the
default: with the controller, so the first ETL finds it warm), ``lazy`` (on
the first transformer: a cluster that never runs an ETL pays nothing) or
``off``. A transformer whose spec installs ``dependencies`` (they could shadow
a preloaded module) or sets a variable that libraries read at import time
(``spec.env``: ``OMP_*``, ``MKL_*``, ``CUDA_*`` ...) is started afresh. So is
one asked for while the zygote is down; it is restarted after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from etl_runtime.core import procs as launch
from etl_runtime.core.spec import EtlSpec

log = logging.getLogger(__name__)

ENV = "SLUICE_ZYGOTE"
LITE_STAGE_ENV = "SLUICE_ZYGOTE_STAGE"  # webserver/zygote.py's STAGE_ENV
MODES = ("eager", "lazy", "off")
WAIT_FOR_WARMUP = 30.0  # a new transformer waits this long for a warming zygote
RESTART_BACKOFF = 30.0
# spec.env variables read when a library is imported (the zygote imported it already).
IMPORT_TIME_ENV = (
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "GOTO",
    "BLIS_",
    "NUMEXPR_",
    "NUMBA_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "TF_",
    "LD_",
    "PYTHON",
    "MALLOC_",
)


def mode_from_env(environ: Mapping[str, str] | None = None) -> str:
    raw = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or "eager"
    if raw in ("0", "false", "no"):
        return "off"
    if raw not in MODES:
        raise ValueError(f"{ENV}={raw!r}: use one of {', '.join(MODES)}")
    return raw


def fits(spec: EtlSpec) -> bool:
    """Whether a transformer of ``spec`` may be forked from the zygote."""
    if spec.dependencies or spec.foreign:
        return False
    return not any(k.upper().startswith(IMPORT_TIME_ENV) for k, _ in spec.env)


class ZygoteChild:
    """A transformer the zygote forked; ``returncode`` once the zygote reaped it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.orphaned = False  # the zygote died first: no exit code will come
        self._ended = asyncio.Event()

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    async def wait(self) -> int | None:
        """Until the zygote reports the exit (orphaned: until the pid is gone), as
        ``asyncio.subprocess.Process.wait`` (``TransformerProcess.exited`` awaits it)."""
        while not self._ended.is_set():
            try:
                await asyncio.wait_for(self._ended.wait(), ORPHAN_POLL_SECONDS)
            except TimeoutError:
                if self.orphaned and not _pid_exists(self.pid):
                    break
        return self.returncode


ORPHAN_POLL_SECONDS = 0.5


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Zygote:
    """Start, use and stop the zygote; see the module docstring."""

    def __init__(
        self,
        state_dir: Path,
        env: dict[str, str],
        on_ready: Callable[[], None] = lambda: None,
        log_name: str = "zygote.log",
        python: str = sys.executable,
    ) -> None:
        self.python = python  # an ETL uid's own interpreter (local/runas.py), if any
        self.state_dir = state_dir
        self.env = env
        self.on_ready = on_ready
        self.log_name = log_name
        self.pid = 0
        self.ready = False
        self.preloaded: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._children: dict[int, ZygoteChild] = {}
        self._early: dict[int, int] = {}
        self._next = 0
        self._failed_at: float | None = None
        self._stopping = False
        self._started_at = 0.0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def warming(self) -> bool:
        """Still importing, and not for longer than ``WAIT_FOR_WARMUP``: worth waiting for."""
        return (
            self.running
            and not self.ready
            and not self._ready.is_set()
            and time.monotonic() - self._started_at < WAIT_FOR_WARMUP
        )

    async def ensure(self) -> None:
        """Start it unless it runs, or failed less than ``RESTART_BACKOFF`` s ago."""
        if self.running:
            return
        if self._failed_at is not None and time.monotonic() - self._failed_at < RESTART_BACKOFF:
            return
        await self.stop()
        self._stopping = False
        await self._start()

    async def _start(self) -> None:
        ours, theirs = socket.socketpair()
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        fd = str(theirs.fileno())
        argv = [self.python, "-m", "etl_runtime.webserver", "--zygote-fd", fd]
        self._ready = asyncio.Event()
        self.ready = False
        self._started_at = time.monotonic()
        try:
            with open(logs / self.log_name, "ab") as out:
                self._proc = await asyncio.create_subprocess_exec(
                    *launch.command(os.getpid(), argv, python=self.python),
                    env=self.env,
                    cwd=self.state_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                )  # in the gateway's process group: not a transformer, no session of its own
        except OSError as e:
            log.warning("cannot start the zygote: %s; transformers start afresh", e)
            self._failed_at = time.monotonic()
            ours.close()
            return
        finally:
            theirs.close()
        self.pid = self._proc.pid
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        self._reader_task = asyncio.create_task(self._read(reader), name="sluice-zygote-reader")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                msg = json.loads(line)
                if msg.get("ready"):
                    self.preloaded = list(msg.get("preloaded") or [])
                    self.ready = True
                    self._ready.set()
                    self.on_ready()
                    log.info(
                        "zygote (pid %s) ready in %ss: %s",
                        msg.get("pid"),
                        msg.get("seconds"),
                        ", ".join(self.preloaded),
                    )
                elif "exit" in msg:
                    child = self._children.pop(int(msg["exit"]), None)
                    if child is None:
                        self._early[int(msg["exit"])] = int(msg["code"])
                    else:
                        child.ended(int(msg["code"]))
                elif (fut := self._pending.pop(int(msg.get("id", -1)), None)) is not None:
                    if not fut.done():
                        fut.set_result(msg)
        except (OSError, ValueError) as e:
            log.warning("zygote connection failed: %s", e)
        self._gone()

    def _gone(self) -> None:
        if not self._stopping:
            log.warning("the zygote (pid %d) exited; transformers start afresh", self.pid)
            self._failed_at = time.monotonic()
        self.ready = False
        self._ready.set()  # wake waiters: it will not become ready
        self.on_ready()  # transformers that waited for it start afresh
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(OSError("the zygote exited"))
        self._pending.clear()
        for child in self._children.values():
            child.orphaned = True
        self._children.clear()

    async def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        adoptable: bool,
        user: dict[str, Any] | None = None,
    ) -> ZygoteChild:
        """Fork a transformer running ``python -m etl_runtime.webserver ARGV`` (as
        ``user``: ``{"uid", "gid", "groups"}``, an ETL's own uid)."""
        if not self.ready or self._writer is None:
            raise OSError("the zygote is not ready")
        self._next += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = fut
        request = {
            "id": self._next,
            "argv": argv,
            "env": env,
            "cwd": str(cwd),
            "log": str(log_path),
            "adoptable": adoptable,
        }
        if user is not None:
            request["user"] = user
        self._writer.write(json.dumps(request).encode() + b"\n")
        await self._writer.drain()
        async with asyncio.timeout(30):
            answer = await fut
        if "pid" not in answer:
            raise OSError(str(answer.get("error") or "the zygote did not fork"))
        child = ZygoteChild(int(answer["pid"]))
        if child.pid in self._early:
            child.ended(self._early.pop(child.pid))
        else:
            self._children[child.pid] = child
        return child

    async def stop(self) -> None:
        """Close the connection (the zygote exits) and wait for it.

        One still importing (not ready: the full one's torch takes ten CPU seconds
        and more) reads the connection only once it is done, so it is killed: it has
        forked nothing yet, and waiting would hold up every stop of the gateway."""
        self._stopping = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None and not self.ready:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if proc is not None and proc.returncode is None:
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
            self._reader_task = None
        self.ready = False


class Zygotes:
    """The lite zygote and the full one, as the controller uses them (module docstring)."""

    def __init__(
        self,
        state_dir: Path,
        env: dict[str, str],
        on_ready: Callable[[], None] = lambda: None,
        python: str = sys.executable,
    ) -> None:
        lite_env = {**env, LITE_STAGE_ENV: "lite"}
        self.on_ready = on_ready
        self.lite = Zygote(
            state_dir, lite_env, self._lite_done, log_name="zygote-lite.log", python=python
        )
        self.full = Zygote(state_dir, env, on_ready, python=python)
        self._full_start: asyncio.Task[None] | None = None

    async def ensure(self) -> None:
        """Start the lite one, and the full one once the lite one is ready (or gone):
        on two cores the full one's imports would slow the lite one's by half."""
        await self.lite.ensure()
        if not self.lite.warming:
            await self.full.ensure()

    def _lite_done(self) -> None:
        self.on_ready()
        if not self._stopping and (self._full_start is None or self._full_start.done()):
            self._full_start = asyncio.get_running_loop().create_task(
                self.full.ensure(), name="sluice-zygote-full-start"
            )

    @property
    def warming(self) -> bool:
        """Worth waiting for: the full one is not ready and the lite one is warming."""
        return not self.full.ready and self.lite.warming

    def forker(self) -> Zygote | None:
        """The zygote to fork a new transformer: the full one if ready, else the lite one."""
        for z in (self.full, self.lite):
            if z.ready:
                return z
        return None

    _stopping = False

    async def stop(self) -> None:
        self._stopping = True
        if self._full_start is not None:
            with contextlib.suppress(Exception):
                await self._full_start
        await self.full.stop()
        await self.lite.stop()
        self._stopping = False
