"""Several transformer server processes on one port: the supervisor.

One server process relays every byte between its clients and its workers; at
about 0.5 GB/s that relay, not the transform, is the limit of a byte-heavy
ETL. With ``N > 1`` servers (the default for object mode, see ``sizing``) the
process started by the command line becomes a small supervisor: it makes one
listening socket and forks N servers (before any thread or event loop exists)
that all accept from it, as ``uvicorn --workers`` does. A shared socket, not
one ``SO_REUSEPORT`` socket per server: the kernel hashed connections over
those with no regard for which server was busy, so two requests could queue
on one server while the other idled; with one socket, the server whose event
loop is free takes the next connection.

What must look like one transformer does, through a shared ``Board``:
``/health`` is ready only when every serving server is, ``/stats`` and
``/metrics`` add up all servers' counters (and merge their last errors),
``/logs`` shows every server's lines, and ``/health`` reports the
supervisor's pid (the process ``sluice up`` started).

A server that ends on its own is **replaced** in its slot: one that crashed
(the user's code killed the interpreter: its in-flight requests were cut,
which their callers see as an error, never as data), or one that retired
because an inline transform outlived its deadline (its thread could not be
stopped; its process can: ``inprocess``). The replacement loads the code before
it takes connections, so no request meets it unready. More than
``RESTART_BUDGET`` replacements within ``RESTART_WINDOW`` seconds stop the
transformer (its manager restarts it and shows why): a transform that kills
every server it runs in is not retried forever.

The supervisor forwards SIGTERM/SIGINT to the servers and waits for them. If
one stopped for a permanent start-up error, it stops the others, prints that
reason last and exits with code 2 like a single server would. Servers die
with the supervisor (``PR_SET_PDEATHSIG``), and their workers with them, so a
SIGKILL leaves no orphans.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from etl_runtime.core import heap
from etl_runtime.core.errors import EXIT_CONFIG_ERROR
from etl_runtime.core.procs import die_with_parent, set_process_name
from etl_runtime.webserver.stats import Board, LogBuffer

if TYPE_CHECKING:
    from etl_runtime.wire.http.serving import Server

log = logging.getLogger("sluice.transformer")

BACKLOG = 2048
RESTART_BUDGET = 10  # replacements of servers ...
RESTART_WINDOW = 60.0  # ... within this many seconds, then the transformer stops


def server_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening), shared by the servers.

    No ``SO_REUSEPORT``: another process that picked the same port (a port
    race of ``free_port()``) must fail to bind it, not split our connections."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only
    # when the socket says it is TCP. Without it, a small answer written as headers
    # then body waited for a delayed ACK: 40 ms per 16 KiB ETL GET, 0.2x the rate
    # of uvloop (which always sets it). The listener's TCP_NODELAY is inherited too.
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    return sock


# (slot, board, restarted) -> a uvicorn server (wire/http/serving.py) whose app's
# Transformer uses that slot; a restarted one loads the code before it serves.
ServerFactory = Callable[[int, Board, bool], tuple["Server", Any]]


def _server_main(
    slot: int,
    board: Board,
    sock: socket.socket,
    make_server: ServerFactory,
    parent: int,
    restarted: bool,
) -> None:
    die_with_parent(parent)
    set_process_name("sluice-server")  # ps, top, psutil's name()
    for handler in list(log.handlers):  # the server's app adds its own
        if isinstance(handler, LogBuffer):
            log.removeHandler(handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the supervisor's handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor sends SIGTERM
    heap.tune()  # core/heap.py: buffers of outputs reused, not faulted in afresh
    server, transformer = make_server(slot, board, restarted)
    server.run(sockets=[sock])
    sys.exit(EXIT_CONFIG_ERROR if transformer.fatal else 0)


def serve_many(
    servers: int, host: str, port: int, make_server: ServerFactory, board: Board
) -> str | None:
    """Run ``servers`` server processes on ``host:port`` until stopped.

    Returns the fatal start-up reason if a server had one (exit code 2), else
    None; raises ``ServersFailing`` when servers kept ending.
    """
    sock = server_socket(host, port)
    sock.listen(BACKLOG)
    log.addHandler(LogBuffer(board=board, ring=servers))  # its own lines in /logs, too
    ctx = multiprocessing.get_context("fork")  # no threads or loop exist yet
    me = os.getpid()
    procs: dict[int, Any] = {}  # slot -> its current server process
    restarts: deque[float] = deque()
    stopping = False
    failing: str | None = None

    def start(slot: int, restarted: bool) -> None:
        p = ctx.Process(
            target=_server_main,
            args=(slot, board, sock, make_server, me, restarted),
            name=f"sluice-server-{slot}",
        )
        p.start()
        procs[slot] = p

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs.values():
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in range(servers):
        start(slot, restarted=False)
    try:
        while True:
            running = {p.sentinel: slot for slot, p in procs.items() if p.exitcode is None}
            if not running:
                break
            for sentinel in wait(list(running)):
                slot = running[sentinel]
                ended = procs[slot]
                ended.join()
                if stopping:
                    board.set_ready(slot, False)
                    continue
                if board.fatal() or not _may_restart(restarts):
                    board.set_ready(slot, False)
                    if not board.fatal():
                        failing = (
                            f"{len(restarts)} server processes ended within "
                            f"{RESTART_WINDOW:.0f}s (the last with {_exit_text(ended.exitcode)}): "
                            "the ETL's code keeps killing them; see its logs"
                        )
                    stop(signal.SIGTERM, None)
                    continue
                log.warning(
                    "server %d (pid %s) ended with %s; starting a new one",
                    slot,
                    ended.pid,
                    _exit_text(ended.exitcode),
                )
                board.set_restarting(slot)
                start(slot, restarted=True)
    finally:
        sock.close()
    if failing is not None:
        raise ServersFailing(failing)
    return board.fatal()


class ServersFailing(Exception):
    """The servers kept ending (the restart budget ran out): not a configuration
    error, so the transformer exits 1 and its manager starts it again."""


def _may_restart(restarts: deque[float]) -> bool:
    now = time.monotonic()
    while restarts and now - restarts[0] > RESTART_WINDOW:
        restarts.popleft()
    if len(restarts) >= RESTART_BUDGET:
        return False
    restarts.append(now)
    return True


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
