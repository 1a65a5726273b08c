"""S3 GetObject from the owner's open file, where gateway and owner share a host.

The owner's side, and when it hands a file, is ``storage_target/handoff.py``:
asked over its Unix socket (``$SLUICE_LOCAL_FILES/<target id>.sock``, set by
``sluice up``) it answers with the object's GET headers and its open file
descriptor (``SCM_RIGHTS``), or refuses. The gateway then answers the client
from that file: one write of head and body up to ``spliced.SPLICE_MIN``,
``sendfile`` above. The bytes cross the host's network stack once, as a
native GET's after its 307 do, instead of owner → gateway → client.

Only a plain GET (no ``Range`` or ``If-*``), verified first like any other, on
a server that sends files zero-copy (not under TLS). A refusal, a socket that
is not there (another host, an older target), breaks or does not answer
within ``ASK_TIMEOUT``: the relay asks the owner over HTTP as before, so the
answer is always the route's. Connections
are pooled per owner, one request at a time each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Any

ENV = "SLUICE_LOCAL_FILES"  # storage_target/handoff.py's
MESSAGE_MAX = 64 << 10
IDLE_MAX = 16  # idle connections kept per owner
ASK_TIMEOUT = 10.0  # an owner that has not answered by then is asked over HTTP


def _path(directory: str, target_id: str) -> str:
    return os.path.join(directory, f"{target_id}.sock")


async def _readable(sock: socket.socket) -> None:
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


class LocalFiles:
    """The gateway's side: asks owners on this host for their objects' open files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._idle: dict[str, list[socket.socket]] = {}

    @classmethod
    def from_env(cls) -> LocalFiles | None:
        directory = os.environ.get(ENV)
        if not directory or not hasattr(socket, "recv_fds"):
            return None
        return cls(directory)

    async def _connect(self, target_id: str) -> socket.socket | None:
        idle = self._idle.get(target_id)
        if idle:
            return idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, _path(self.directory, target_id))
        except (FileNotFoundError, ConnectionRefusedError, OSError):
            sock.close()
            return None
        return sock

    async def open(
        self, target_id: str, bucket: str, key: str
    ) -> tuple[int, dict[str, str]] | None:
        """The owner's open descriptor of ``bucket/key`` and its GET headers, or None (ask
        over HTTP). The caller closes the descriptor."""
        sock = await self._connect(target_id)
        if sock is None:
            return None
        fds: list[int] = []
        reply: Any = None
        try:
            sock.send(json.dumps({"bucket": bucket, "key": key}).encode())
            async with asyncio.timeout(ASK_TIMEOUT):
                while True:
                    await _readable(sock)
                    try:
                        message, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_MAX, 1)
                        break
                    except BlockingIOError:
                        continue
            reply = json.loads(message) if message else None
        except (OSError, ValueError):  # TimeoutError included: an owner that hangs
            reply = None
        except BaseException:  # cancelled mid-answer: the connection is at an unknown place
            sock.close()
            for fd in fds:
                os.close(fd)
            raise
        if not isinstance(reply, dict):
            sock.close()
            for fd in fds:
                os.close(fd)
            return None
        idle = self._idle.setdefault(target_id, [])
        if len(idle) < IDLE_MAX:
            idle.append(sock)
        else:
            sock.close()
        headers = reply.get("headers")
        if not fds:
            return None
        if not isinstance(headers, dict):
            for fd in fds:
                os.close(fd)
            return None
        return fds[0], {str(k): str(v) for k, v in headers.items()}

    def close(self) -> None:
        for idle in self._idle.values():
            for sock in idle:
                with contextlib.suppress(OSError):
                    sock.close()
        self._idle.clear()


FILES = LocalFiles.from_env()  # None unless sluice up (or the operator) set the directory
