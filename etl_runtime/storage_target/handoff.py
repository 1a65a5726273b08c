"""An owner's open, checked object file handed to a gateway on the same host.

An S3 client cannot follow a 307 (``gateway/s3/objects.py`` says why), so the
gateway relays every GetObject: the owner sends the bytes to the gateway over
loopback TCP and the gateway splices them on to the client, a second trip
through the network stack and two more wake-ups per GET. Under ``sluice up``
gateway and targets share a host, and a file descriptor can cross between
processes instead (``SCM_RIGHTS`` on a Unix socket): the gateway asks the
owner for ``bucket/key``, the owner decides as its GET would, and answers with
the object's headers and its open file, which the gateway sends to the client
itself (``sendfile``, or one write for a small one).

The owner hands a file only where its own GET would send that file's bytes as
they are: a local object with a stored ETag, on a target that owns it and
keeps no copy elsewhere, not in a remote bucket, whose bytes matched their
stored checksum within ``integrity.VERIFIED``'s time and have not changed
since, or, up to ``integrity.WHOLE_MAX``, match now (then remembered). Anything
else (no such object, a mismatch, a bigger object not checked yet, an object
being rebalanced) is a refusal, and the gateway asks the usual way, whose
answer says why or repairs. A rewritten object keeps its old file open to the
reader, as a GET in flight keeps reading it.

The socket is ``$SLUICE_LOCAL_FILES/<target id>.sock`` (``sluice up`` sets the
directory for the gateway and the targets; unset: nothing listens), mode 0600
in a 0700 directory: only the user the servers run as may connect, as only
it may read the files. One request per message (``SOCK_SEQPACKET``): JSON
``{"bucket", "key"}``; the answer JSON ``{"headers": {...}}`` with the file's
descriptor, the file's stamp (``integrity.stamp_of``) and ``fresh_for``, the
seconds its check still stands (``integrity.VERIFIED``), within which the
gateway may answer again from that file while its stamp is unchanged and it
still has a name; or ``{"refused": why}`` without one. The target counts both
(``sluice_handoff_{files,refused}_total{target}``): a handed GET is no HTTP
request to it, so its ``sluice_http_*`` figures do not show it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from etl_runtime.core.errors import SluiceError
from etl_runtime.core.names import validate_names
from etl_runtime.storage import integrity
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.objects import object_headers
from etl_runtime.storage_target.reads import _matches
from etl_runtime.wire.unixsock import SeqpacketServer, readable

log = logging.getLogger(__name__)

ENV = "SLUICE_LOCAL_FILES"
MESSAGE_MAX = 64 << 10  # a request: two names; an answer: headers with <= 2 KiB of metadata
PATH_MAX = 100  # sun_path holds 108 bytes


def socket_path(directory: str, target_id: str) -> str:
    return os.path.join(directory, f"{target_id}.sock")


def available() -> bool:
    return hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


class FileHandoff(SeqpacketServer):
    """The target's side: listens on its socket while the target runs."""

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.handed = self.refused = 0

    async def start(self) -> None:
        directory = os.environ.get(ENV)
        if not directory or not available():
            return
        path = socket_path(directory, self.target.id)
        if len(path.encode()) > PATH_MAX:
            log.warning("%s: socket path too long (%d bytes); files not handed", ENV, len(path))
            return
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # only the servers' user reaches the socket
        self.listen(path, 0o600, 64)

    async def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                await readable(conn)
                try:
                    message = conn.recv(MESSAGE_MAX)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not message:
                    return  # the gateway closed it
                try:
                    ask = json.loads(message)
                    bucket, key = str(ask["bucket"]), str(ask["key"])
                except (ValueError, KeyError, TypeError):
                    return  # not a gateway of this version: drop it
                opened = await self.open_checked(bucket, key)
                try:
                    if opened is None:
                        self.refused += 1
                        conn.send(json.dumps({"refused": "ask over HTTP"}).encode())
                    else:
                        self.handed += 1
                        fd, headers, stamp, fresh_for = opened
                        answer = {"headers": headers, "stamp": stamp, "fresh_for": fresh_for}
                        reply = json.dumps(answer).encode()
                        socket.send_fds(conn, [reply], [fd])
                except OSError:  # the gateway went away, or it is not reading: drop it
                    return
                finally:
                    if opened is not None:
                        os.close(opened[0])

    async def open_checked(
        self, bucket: str, key: str
    ) -> tuple[int, dict[str, str], list[int], float] | None:
        """The object's open descriptor, its GET's headers, the file's stamp and how many
        seconds its check still stands, where the route would send this file's bytes as
        they are (the module says when); else None."""
        target = self.target
        store, placement, remote = target.store, target.placement, target.remote
        try:
            validate_names(bucket, key)
        except SluiceError:
            return None
        if placement is not None and (
            placement.read_owner(bucket, key, False) is not None
            or placement.may_be_elsewhere(bucket)
        ):
            return None
        if remote is not None and remote.props(bucket) is not None:
            return None
        opened = store.open_if_tagged(bucket, key)
        if opened is None:
            return None
        f, info = opened
        with f:
            fresh_for = integrity.VERIFIED.seconds
            if integrity.verify_reads():
                cs = info.checksum
                if cs is None or cs.size != info.size:
                    return None  # the route makes its checksum, or says it is bad
                if not integrity.VERIFIED.fresh(info.stamp, cs):
                    if info.size > integrity.WHOLE_MAX:
                        return None  # the route checks it as it streams
                    if not await _matches(f.fileno(), cs, info.stamp):
                        return None  # the route repairs it or says so
                fresh_for = integrity.VERIFIED.left(info.stamp, cs)
            headers = {k.lower(): v for k, v in object_headers(info).items()}
            return os.dup(f.fileno()), headers, list(info.stamp or ()), fresh_for


class HandoffCollector:
    """``sluice_handoff_{files,refused}_total{target}``: files handed to a gateway on this
    host for S3 GETs, and the asks refused (then served over HTTP)."""

    def __init__(self, target_id: str, handoff: FileHandoff) -> None:
        self.target_id, self.handoff = target_id, handoff

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for name, text, value in (
            ("files", "Open object files handed to a gateway on this host.", self.handoff.handed),
            ("refused", "Asks for a file refused (served over HTTP).", self.handoff.refused),
        ):
            family = CounterMetricFamily(f"sluice_handoff_{name}", text, labels=["target"])
            family.add_metric([self.target_id], value)
            yield family
