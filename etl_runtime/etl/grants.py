"""File grants: a target's word that its transformer may have one object's file.

Under ``sluice up`` as root each ETL runs as a uid of its own
(``local/runas.py``), and those uids cannot enter a target's ``buckets``
directory (``local/sandbox.py``): ETL code cannot open objects by path. A
transformer told of its target's file broker (``$SLUICE_FD_BROKER``, the
broker's Unix socket) gets the files it was sent instead, as open descriptors:
with each ``etl_fqn`` the target sends a grant (``etl_grant``), an HMAC over
the ETL, the file's path and an expiry with a key derived from the cluster
key and the target's id (``grant_key``). ETL code cannot mint one: it never
sees the cluster key, and its own token (``SLUICE_ETL_TOKEN``, in its
environment) is no part of the key. The broker (``storage_target/fdbroker.py``)
hands the file only to a peer whose uid (``SO_PEERCRED``) is the ETL's the
grant names.

The exchange, one request per message (``SOCK_SEQPACKET``): JSON
``{"files": [[path, grant], ...]}`` (at most ``FDS_MAX`` files and
``MESSAGE_MAX`` bytes); the answer JSON ``{"files": [null | why, ...]}`` in
the same order, with one descriptor (``SCM_RIGHTS``) for each ``null``, in
order. ``why`` names no path: the transformer passes it on to a client.

``BrokerClient`` is the transformer's side (asyncio and uvloop alike:
non-blocking sockets woken by ``add_reader``, pooled per process).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import socket
import time
from collections.abc import Sequence

from etl_runtime.core.auth import REDIRECT_TTL_SECONDS
from etl_runtime.wire.unixsock import readable

ENV = "SLUICE_FD_BROKER"  # the broker's socket: the target's, and its transformers'
UIDS_ENV = "SLUICE_ETL_UIDS"  # the target's: BASE:PATH of local/runas.py's uid table
PARAM = "etl_grant"  # beside etl_fqn, in an hpush PUT, a direct GET, a batch item
TTL_SECONDS = REDIRECT_TTL_SECONDS  # a direct 307 is followed later, with its grant
FDS_MAX = 250  # descriptors in one message (Linux takes up to 253)
MESSAGE_MAX = 64 << 10  # a request's JSON; an answer's is smaller
ASK_TIMEOUT = 30.0  # a broker that has not answered by then is taken as gone
IDLE_MAX = 16  # idle connections kept per process


def grant_key(cluster_key: str, target_id: str) -> str:
    """The key target ``target_id`` signs and checks its grants with."""
    return hmac.new(cluster_key.encode(), f"fd-grant\n{target_id}".encode(), "sha256").hexdigest()


def _mac(key: str, etl: str, path: str, exp: str) -> str:
    message = f"{etl}\n{path}\n{exp}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:40]


def sign(key: str, etl: str, path: str, now: float | None = None) -> str:
    """A grant of the file ``path`` to ETL ``etl``, valid for ``TTL_SECONDS``."""
    exp = str(int((now or time.time()) + TTL_SECONDS))
    return f"{exp}.{_mac(key, etl, path, exp)}"


def refusal(key: str, etl: str, path: str, grant: object, now: float | None = None) -> str | None:
    """None if ``grant`` gives ``path`` to ``etl``; else why not (no path in it)."""
    if not isinstance(grant, str) or "." not in grant:
        return "no grant from the target"
    exp, _, mac = grant.partition(".")
    if not exp.isdigit() or not hmac.compare_digest(mac, _mac(key, etl, path, exp)):
        return f"the grant is not the target's for this object and ETL {etl!r}"
    if int(exp) < (now or time.time()):
        return "the grant expired; ask the gateway again"
    return None


def fd_path(fd: int) -> str:
    """A path to the open file ``fd`` of this process, for code that wants a path:
    opening it checks the file's own mode, not the directories above it. The
    pid rather than ``self``: a worker process of the same uid opens it too."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class BrokerClient:
    """A transformer's side: asks its target's broker for files (module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[socket.socket] = []
        self._pid = os.getpid()

    @classmethod
    def from_env(cls) -> BrokerClient | None:
        path = os.environ.get(ENV, "")
        return cls(path) if path and hasattr(socket, "recv_fds") else None

    async def open(self, files: Sequence[tuple[str, str | None]]) -> list[int | str]:
        """For each ``(path, grant)``: its open descriptor (the caller closes it) or why
        the broker refused it. ``OSError`` when the broker cannot be asked."""
        out: list[int | str] = []
        start = 0
        try:
            while start < len(files):
                end, size = start, 16
                while end < len(files) and end - start < FDS_MAX:
                    size += len(files[end][0]) + len(files[end][1] or "") + 16
                    if size > MESSAGE_MAX and end > start:
                        break
                    end += 1
                out += await self._ask(files[start:end])
                start = end
        except BaseException:
            close_all([fd for fd in out if isinstance(fd, int)])
            raise
        return out

    async def _ask(self, files: Sequence[tuple[str, str | None]]) -> list[int | str]:
        if self._pid != os.getpid():  # a forked child: never share the parent's sockets
            self._idle, self._pid = [], os.getpid()
        if self._idle:
            try:
                return await self._exchange(self._idle.pop(), files)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the broker restarted since (a target that restarted): a new one
        return await self._exchange(await self._connect(), files)

    async def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _exchange(
        self, sock: socket.socket, files: Sequence[tuple[str, str | None]]
    ) -> list[int | str]:
        fds: list[int] = []
        try:
            sock.send(json.dumps({"files": [[p, g] for p, g in files]}).encode())
            async with asyncio.timeout(ASK_TIMEOUT):
                while True:
                    await readable(sock)
                    try:
                        message, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_MAX, FDS_MAX)
                        break
                    except BlockingIOError:
                        continue
            if not message:
                raise ConnectionResetError("the file broker closed the connection")
            try:
                answers = json.loads(message)["files"]
            except (ValueError, KeyError, TypeError):
                answers = None
            if not isinstance(answers, list) or len(answers) != len(files):
                raise OSError("the file broker answered out of turn")
            if sum(a is None for a in answers) != len(fds):
                raise OSError("the file broker sent another number of files than it said")
        except BaseException:
            sock.close()
            close_all(fds)
            raise
        if len(self._idle) < IDLE_MAX:
            self._idle.append(sock)
        else:
            sock.close()
        handed = iter(fds)
        return [next(handed) if a is None else str(a)[:300] for a in answers]
