"""S3 GetObject from the owner's open file, where gateway and owner share a host.

The owner's side, and when it hands a file, is ``storage_target/handoff.py``:
asked over its Unix socket (``$SLUICE_LOCAL_FILES/<target id>.sock``, set by
``sluice up``) it answers with the object's GET headers and its open file
descriptor (``SCM_RIGHTS``), or refuses. The gateway then answers the client
from that file: one write of head and body up to ``spliced.SPLICE_MIN``,
``sendfile`` above. The bytes cross the host's network stack once, as a
native GET's after its 307 do, instead of owner → gateway → client.

Only a plain GET (no ``Range`` or ``If-*``), verified first like any other, on
a server that sends files zero-copy or under TLS (the gateway reads the file
and encrypts it once, where a relay is encrypted by the owner, decrypted and
encrypted again by the gateway). A refusal, a socket that
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
import time
from dataclasses import dataclass
from typing import Any

from etl_runtime.wire.unixsock import readable

ENV = "SLUICE_LOCAL_FILES"  # storage_target/handoff.py's
MESSAGE_MAX = 64 << 10
IDLE_MAX = 16  # idle connections kept per owner
ASK_TIMEOUT = 10.0  # an owner that has not answered by then is asked over HTTP
HELD_MAX = 256  # handed files kept open for the next GETs of the same objects
Key = tuple[str, str, str, float]  # owner, bucket, key, the bucket's creation time


def _path(directory: str, target_id: str) -> str:
    return os.path.join(directory, f"{target_id}.sock")


@dataclass
class _Held:
    fd: int
    headers: dict[str, str]
    stamp: tuple[int, ...]
    until: float  # time.monotonic() the owner's check of it stops standing


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # integrity's


class LocalFiles:
    """The gateway's side: asks owners on this host for their objects' open files.

    A handed file is kept open (at most ``HELD_MAX``) for as long as the owner's check
    of it stands (its ``fresh_for``): a GET of the same object in that time is
    answered from it without asking, while the file is unchanged (same stamp) and still
    has a name (a rewrite renames another file over it, a delete unlinks it, a changed
    byte or xattr moves its ctime), the owner is the same and the bucket is the one
    that was (its creation time). That is the owner's own rule for a remembered file."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._idle: dict[str, list[socket.socket]] = {}
        self._held: dict[Key, _Held] = {}

    def held(self, key: Key) -> tuple[int, dict[str, str]] | None:
        """A new descriptor of the file kept for ``key`` and its headers, if it may answer."""
        entry = self._held.get(key)
        if entry is None:
            return None
        if time.monotonic() < entry.until:
            try:
                st = os.fstat(entry.fd)
            except OSError:
                st = None
            if st is not None and st.st_nlink > 0 and _stamp(st) == entry.stamp:
                return os.dup(entry.fd), entry.headers
        self._drop(key)
        return None

    def _drop(self, key: Key) -> None:
        entry = self._held.pop(key, None)
        if entry is not None:
            os.close(entry.fd)

    def _keep(self, key: Key, fd: int, headers: dict[str, str], reply: dict[str, Any]) -> None:
        stamp, fresh_for = reply.get("stamp"), reply.get("fresh_for")
        if not isinstance(stamp, list) or len(stamp) != 5:
            return
        if not isinstance(fresh_for, (int, float)):
            return
        if fresh_for <= 0 or _stamp(os.fstat(fd)) != tuple(stamp):  # changed since checked
            return
        self._drop(key)
        while len(self._held) >= HELD_MAX:
            self._drop(next(iter(self._held)))
        self._held[key] = _Held(os.dup(fd), headers, tuple(stamp), time.monotonic() + fresh_for)

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
        self, target_id: str, bucket: str, key: str, created: float | None = None
    ) -> tuple[int, dict[str, str]] | None:
        """The owner's open descriptor of ``bucket/key`` and its GET headers, or None (ask
        over HTTP). The caller closes the descriptor. ``created``: the bucket's creation
        time, where the cluster map has one: the file may then be kept (``held``)."""
        held_key = (target_id, bucket, key, created) if created is not None else None
        if held_key is not None and (held := self.held(held_key)) is not None:
            return held
        sock = await self._connect(target_id)
        if sock is None:
            return None
        fds: list[int] = []
        reply: Any = None
        try:
            sock.send(json.dumps({"bucket": bucket, "key": key}).encode())
            async with asyncio.timeout(ASK_TIMEOUT):
                while True:
                    await readable(sock)
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
        headers = {str(k): str(v) for k, v in headers.items()}
        if held_key is not None:
            self._keep(held_key, fds[0], headers, reply)
        return fds[0], headers

    def close(self) -> None:
        for idle in self._idle.values():
            for sock in idle:
                with contextlib.suppress(OSError):
                    sock.close()
        self._idle.clear()
        for key in list(self._held):
            self._drop(key)


FILES = LocalFiles.from_env()  # None unless sluice up (or the operator) set the directory
