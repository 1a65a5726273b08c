"""``Transformer``: the state of one running transformer, and how it starts.

Start-up runs in the background so ``GET /health`` can answer 503 meanwhile:
check the code can be loaded by this Python, pip-install ``spec.dependencies``,
start the worker pool (every worker loads the code and checks ``spec.decode``).
A ``StartupError`` on the way is permanent: ``fatal`` holds the reason and
``on_fatal`` is called (the command line stops the server and exits with code 2).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from collections.abc import Callable

from etl_runtime.core.errors import StartupError
from etl_runtime.core.spec import EtlSpec
from etl_runtime.webserver.code import check_code, install_dependencies
from etl_runtime.webserver.inprocess import InProcessRunner
from etl_runtime.webserver.pool import WorkerPool
from etl_runtime.webserver.shards import load_tariterators
from etl_runtime.webserver.stats import Board, LogBuffer, SharedStats, Stats

log = logging.getLogger("sluice.transformer")

RETIRE_GRACE_SECONDS = 30  # a retiring server's in-flight requests get this long


class Transformer:
    """One ETL's transformer: spec, worker pool, counters, logs, readiness."""

    def __init__(
        self,
        name: str,
        spec: EtlSpec,
        workers: int | None = None,
        token: str | None = None,
        deps_dir: str | None = None,
        board: Board | None = None,
        slot: int = 0,
        inline: bool = False,
    ) -> None:
        """``board``/``slot``: this is server ``slot`` of several (see ``servers``);
        ``inline``: object-mode code runs in this process's threads (see ``inprocess``)."""
        self.name = name
        self.spec = spec
        self.token = token or None
        self.deps_dir = deps_dir
        self.board = board
        self.slot = slot
        self.stats: Stats = Stats() if board is None else SharedStats(board, slot)
        self.logs = LogBuffer(board=board, ring=slot)
        self.pool = WorkerPool(
            spec,
            WorkerPool.default_size(spec, workers),
            on_log=self.logs.worker_output,
            on_fatal=self.fail,
        )
        self.inline: InProcessRunner | None = None
        if inline and spec.mode == "object":
            self.inline = InProcessRunner(spec, self.pool.size, deps_dir, self.logs)
            self.inline.on_stuck = self._stuck
        else:
            # Now, in create_app: before uvicorn starts the loop and any thread.
            self.pool.start_forker()
        self.ready = False
        self.fatal: str | None = None
        self.on_fatal: Callable[[str], None] = lambda reason: None
        # Set by a supervised server (``servers``): stop serving, to be replaced.
        self.on_retire: Callable[[str], None] | None = None
        self.retiring = False

    @property
    def workers(self) -> int:
        return self.pool.size

    async def start(self) -> None:
        try:
            check_code(self.spec)
            if self.spec.mode == "wds":
                await asyncio.to_thread(load_tariterators)
            if self.spec.dependencies:
                self.deps_dir = self.deps_dir or tempfile.mkdtemp(prefix="sluice-deps-")
                deps = list(self.spec.dependencies)
                log.info("installing dependencies %s into %s", deps, self.deps_dir)
                await asyncio.to_thread(install_dependencies, self.spec, self.deps_dir)
            self.pool.deps_dir = self.deps_dir
            if self.inline is not None:
                log.info("loading the code inline, %d threads", self.inline.threads)
                self.inline.deps_dir = self.deps_dir
                await asyncio.to_thread(self.inline.load)
            else:
                log.info("starting %d workers (mode %s)", self.pool.size, self.spec.mode)
                await self.pool.start()
        except StartupError as e:
            self.fail(str(e))
            return
        self.ready = True
        if self.board is not None:
            self.board.set_ready(self.slot, True)
        log.info("ETL %r ready: workers %s", self.name, self.pool.pids or "inline")

    @property
    def all_ready(self) -> bool:
        """Ready, and so is every other server process of this transformer."""
        return self.ready and (self.board is None or self.board.all_ready())

    def _stuck(self, reason: str) -> None:
        """An inline transform outlived its deadline: its thread runs on (a new one
        took its place). A supervised server retires, so the supervisor replaces
        the process and the stuck thread dies with it; a lone server keeps going."""
        if self.on_retire is None or self.retiring:
            log.warning("%s; this server process cannot be replaced, it keeps serving", reason)
            return
        self.retiring = True
        log.warning("%s; this server stops taking connections and will be replaced", reason)
        # If the stuck thread holds the interpreter so the server cannot finish,
        # the kernel ends the process: SIGALRM's default action needs no Python.
        signal.alarm(RETIRE_GRACE_SECONDS)
        self.on_retire(reason)

    def fail(self, reason: str) -> None:
        self.ready = False
        self.fatal = reason
        if self.board is not None:
            self.board.set_ready(self.slot, False)
            self.board.set_fatal(reason)
        log.error("ETL %r cannot start: %s", self.name, reason)
        self.on_fatal(reason)

    async def stop(self) -> None:
        self.ready = False
        if self.board is not None:
            self.board.set_ready(self.slot, False)
        if self.inline is not None:
            self.inline.close()
        await self.pool.close()
