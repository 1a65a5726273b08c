"""Unix sockets that hand open files between the servers' processes.

The S3 gateway's and a transformer's requests for a target's files
(``gateway/s3/handoff.py``, ``etl/grants.py``) and the target's ends of both
(``storage_target/handoff.py``, ``storage_target/fdbroker.py``) read their
sockets with ``recvmsg`` (the descriptors ride as ``SCM_RIGHTS``), which the
event loops' stream APIs do not offer: they wait on a non-blocking socket
with ``readable``.
"""

from __future__ import annotations

import asyncio
import socket


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
