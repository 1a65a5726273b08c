"""Unix sockets that hand open files between the servers' processes.

The S3 gateway's and a transformer's requests for a target's files
(``gateway/s3/handoff.py``, ``etl/grants.py``) and the target's ends of both
(``storage_target/handoff.py``, ``storage_target/fdbroker.py``) read their
sockets with ``recvmsg`` (the descriptors ride as ``SCM_RIGHTS``), which the
event loops' stream APIs do not offer: they wait on a non-blocking socket
with ``readable``. ``SeqpacketServer`` is the listening end's life: bind,
one task per connection, stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any


async def readable(sock: socket.socket) -> None:
    """Until ``sock`` has something to read (asyncio and uvloop alike)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


class SeqpacketServer:
    """A ``SOCK_SEQPACKET`` listener on a path; each connection is served by ``_serve``
    in a task of its own, and ``stop`` cancels them all and removes the socket."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def listen(self, path: str, mode: int, backlog: int) -> None:
        """Bind ``path`` (``mode``: who may connect) and start accepting."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale one from a killed process
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(path)  # no umask change: it is the process's, threads make files too
        os.chmod(path, mode)
        sock.listen(backlog)
        sock.setblocking(False)
        self._listener, self.path = sock, path
        self._spawn(self._accept(sock))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError
