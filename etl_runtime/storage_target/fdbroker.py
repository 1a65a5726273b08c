"""The file broker: a target hands its transformers the object files it sent them.

Under ``sluice up`` as root, ETL code cannot open a target's objects by path
(``local/sandbox.py`` closes ``buckets`` to the ETL uids); a transformer gets
each file it was sent (``etl_fqn`` and its grant, ``etl/grants.py``) as an open
descriptor from this broker, over a Unix socket at ``$SLUICE_FD_BROKER``
(``sluice up`` sets it, in the target's data dir: only root and the ETLs'
data group may traverse to it). The broker answers a file only

* to a peer whose uid (``SO_PEERCRED``) is an ETL's (``$SLUICE_ETL_UIDS``,
  ``BASE:PATH`` of ``DIR/etl/etl-uids.json``: uid ``BASE + n`` runs the ETL
  listed with ``n``), for a grant of this target's key that names that ETL,
  that path and an expiry not past;
* for a regular file under this target's ``buckets`` (a normal path, not
  a symlink), opened read-only.

Everything else is refused file by file, with a reason that names no path.
Unset, nothing listens and the target signs no grants (Kubernetes, a
``sluice up`` not run as root): transformers read files by path as before.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
from typing import Any

from etl_runtime.etl import grants
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.handoff import PATH_MAX
from etl_runtime.wire.unixsock import SeqpacketServer, readable

log = logging.getLogger(__name__)

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class EtlUids:
    """uid -> ETL name, from ``local/runas.py``'s table (re-read when it changes)."""

    def __init__(self, spec: str) -> None:
        base, _, self.path = spec.partition(":")
        self.base = int(base) if base.isdigit() else -1
        self._seen: tuple[int, int] | None = None
        self._names: dict[int, str] = {}

    def etl_of(self, uid: int) -> str | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if (st.st_mtime_ns, st.st_size) != self._seen:
            try:
                with open(self.path) as f:
                    table = json.load(f)["etls"]
                self._names = {self.base + int(n): str(name) for name, n in table.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return None
            self._seen = (st.st_mtime_ns, st.st_size)
        return self._names.get(uid) if self.base >= 0 else None


class FdBroker(SeqpacketServer):
    """Listens on ``$SLUICE_FD_BROKER`` while the target runs (module docstring)."""

    def __init__(self, target: Target, cluster_key: str | None) -> None:
        super().__init__()
        self.target = target
        self.cluster_key = cluster_key or ""
        self.key: str | None = None
        self._uids = EtlUids(os.environ.get(grants.UIDS_ENV, ""))
        self._buckets: tuple[str, ...] = ()  # as real and as given: paths start so
        self.handed = self.refused = 0

    async def start(self) -> None:
        path = os.environ.get(grants.ENV)
        if not path or not self.cluster_key or not hasattr(socket, "send_fds"):
            return
        if len(path.encode()) > PATH_MAX:
            log.warning("%s: socket path too long (%d bytes); no broker", grants.ENV, len(path))
            return
        buckets = self.target.store.buckets_dir
        self._buckets = (os.path.realpath(buckets) + os.sep, os.path.abspath(buckets) + os.sep)
        self.key = grants.grant_key(self.cluster_key, self.target.id)
        # Any uid that reaches it may connect (the directory above decides who does);
        # the broker itself checks who asks.
        self.listen(path, 0o666, 128)
        self.target.forwarder.grant_key = self.key  # its etl_fqn now come with grants

    async def _serve(self, conn: socket.socket) -> None:
        with conn:
            _pid, uid, _gid = _CRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
            )
            while True:
                await readable(conn)
                try:
                    message = conn.recv(grants.MESSAGE_MAX)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not message:
                    return  # the transformer closed it
                try:
                    files = [(str(p), g) for p, g in json.loads(message)["files"]]
                except (ValueError, KeyError, TypeError):
                    return  # not a transformer of this version: drop it
                if len(files) > grants.FDS_MAX:
                    return
                etl = self._uids.etl_of(uid)  # per ask: an ETL registered since connects
                answers: list[str | None] = []
                fds: list[int] = []
                try:
                    for path, grant in files:
                        fd, why = self._open(uid, etl, path, grant)
                        answers.append(why)
                        if fd is not None:
                            fds.append(fd)
                    self.handed += len(fds)
                    self.refused += len(answers) - len(fds)
                    reply = json.dumps({"files": answers}).encode()
                    socket.send_fds(conn, [reply], fds)
                except OSError:  # the transformer went away, or it is not reading
                    return
                finally:
                    grants.close_all(fds)

    def _open(
        self, uid: int, etl: str | None, path: str, grant: Any
    ) -> tuple[int | None, str | None]:
        """The file's descriptor, or why not."""
        assert self.key is not None
        if etl is None:
            return None, f"uid {uid} runs no ETL of this cluster"
        if why := grants.refusal(self.key, etl, path, grant):
            return None, why
        # The grant says the target named this path; under buckets (no ".."), only root
        # makes entries, so the last component is the one a symlink could be.
        if "\x00" in path or os.path.normpath(path) != path or not path.startswith(self._buckets):
            return None, "not an object of this target"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None, "the object's file is gone"
        except OSError as e:
            return None, f"cannot open the object's file: {e.strerror or type(e).__name__}"
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, "not an object's file"
        return fd, None
