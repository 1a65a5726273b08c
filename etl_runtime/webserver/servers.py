"""``--servers N``: several transformer server processes on one port.

One server process relays every byte between its clients and its workers; at
about 0.5 GB/s that relay, not the transform, is the limit of a byte-heavy
ETL. With ``N > 1`` the process started by the command line becomes a small
supervisor: it forks N servers (before any thread or event loop exists), each
binds the same host and port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them) and owns ``ceil(workers / N)`` of the worker processes.
Nothing else changes per request: user code still runs only in workers, errors
before the first byte are JSON, a break after it aborts the connection.

What must look like one transformer does, through a shared ``Board``:
``/health`` is ready only when every server is, ``/stats`` and ``/metrics``
add up all servers' counters (and merge their last errors), and ``/health``
reports the supervisor's pid (the process ``sluice up`` started). ``/logs``
shows the answering server's lines and the output of its workers.

The supervisor forwards SIGTERM/SIGINT to the servers and waits for them. If a
server ends, it stops the others; if one stopped for a permanent start-up
error, the supervisor prints that reason last and exits with code 2 like a
single server would. Servers die with the supervisor (``PR_SET_PDEATHSIG``),
and their workers with them, so a SIGKILL leaves no orphans.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import uvicorn

from etl_runtime.core.errors import EXIT_CONFIG_ERROR
from etl_runtime.core.procs import die_with_parent
from etl_runtime.webserver.stats import Board

BACKLOG = 2048


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (not listening)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only
    # when the socket says it is TCP. Without it, a small answer written as headers
    # then body waited for a delayed ACK: 40 ms per 16 KiB ETL GET, 0.2x the rate
    # of uvloop (which always sets it). The listener's TCP_NODELAY is inherited too.
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


def workers_per_server(total: int, servers: int) -> int:
    return max(1, math.ceil(total / servers))


# (slot, board) -> uvicorn.Server whose app's Transformer uses that slot.
ServerFactory = Callable[[int, Board], tuple[uvicorn.Server, Any]]


def _server_main(
    slot: int, board: Board, host: str, port: int, make_server: ServerFactory, parent: int
) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the supervisor's handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor sends SIGTERM
    sock = reuseport_socket(host, port)
    sock.listen(BACKLOG)
    server, transformer = make_server(slot, board)
    server.run(sockets=[sock])
    sys.exit(EXIT_CONFIG_ERROR if transformer.fatal else 0)


def serve_many(
    servers: int, host: str, port: int, make_server: ServerFactory, board: Board
) -> str | None:
    """Run ``servers`` server processes on ``host:port`` until stopped.

    Returns the fatal start-up reason if a server had one (exit code 2), else None.
    """
    # Holding a bound (not listening) socket keeps the port ours between the
    # servers' restarts and tells a port of 0 apart; it takes no connections.
    reserved = reuseport_socket(host, port)
    port = reserved.getsockname()[1]
    ctx = multiprocessing.get_context("fork")  # no threads or loop exist yet
    procs = [
        ctx.Process(
            target=_server_main,
            args=(slot, board, host, port, make_server, os.getpid()),
            name=f"sluice-server-{slot}",
        )
        for slot in range(servers)
    ]
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.start()
    try:
        running = list(procs)
        while running:
            ended = wait([p.sentinel for p in running])
            running = [p for p in running if p.sentinel not in ended]
            if not stopping:  # one server ended on its own: the transformer stops
                stop(signal.SIGTERM, None)
        for p in procs:
            p.join()
    finally:
        reserved.close()
    return board.fatal()
