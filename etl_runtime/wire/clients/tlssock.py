"""A non-blocking TLS socket for the clients that drive raw sockets on the event loop.

The GetBatch share pool (``getbatch/exchange.py``) reads a target's answer
with ``recv_into`` straight into the buffer it hands on, and waits with the
loop's ``sock_recv_into``/``sock_sendall``. Both loops refuse an
``ssl.SSLSocket`` there, so an ``https://`` target's connection is a
``TlsSocket``: an ``SSLSocket`` in non-blocking mode whose ``recv_into`` and
``send`` raise ``BlockingIOError`` (as a plain socket's do) when OpenSSL wants
the socket, and ``recv_into``/``sendall`` below wait for it with
``add_reader``/``add_writer``. Bytes OpenSSL already decrypted are read first
(a readable socket is not needed for them). ``fileno`` is for waiting only:
moving bytes off it with ``os.splice`` would move ciphertext.
"""

from __future__ import annotations

import asyncio
import socket
import ssl


class TlsSocket:
    """What the share pool uses of a socket, over TLS."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock

    def recv_into(self, view: memoryview | bytearray) -> int:
        try:
            return self._sock.recv_into(view)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError from None
        except ssl.SSLZeroReturnError:
            return 0

    def send(self, data: bytes | memoryview) -> int:
        try:
            return self._sock.send(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError from None

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


Socket = socket.socket | TlsSocket


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    done = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await done
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def wrap(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, host: str, ctx: ssl.SSLContext
) -> TlsSocket:
    """The TLS handshake on the connected non-blocking ``sock``, verified for ``host``."""
    tls = ctx.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    while True:
        try:
            tls.do_handshake()
            return TlsSocket(tls)
        except ssl.SSLWantReadError:
            await _ready(loop, tls.fileno(), write=False)
        except ssl.SSLWantWriteError:
            await _ready(loop, tls.fileno(), write=True)


async def recv_into(
    loop: asyncio.AbstractEventLoop, sock: Socket, view: memoryview | bytearray
) -> int:
    """``loop.sock_recv_into`` for either kind of socket."""
    if isinstance(sock, socket.socket):
        return await loop.sock_recv_into(sock, view)
    while True:
        try:
            return sock.recv_into(view)
        except BlockingIOError:
            await _ready(loop, sock.fileno(), write=False)


async def sendall(loop: asyncio.AbstractEventLoop, sock: Socket, data: bytes) -> None:
    """``loop.sock_sendall`` for either kind of socket."""
    if isinstance(sock, socket.socket):
        await loop.sock_sendall(sock, data)
        return
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            await _ready(loop, sock.fileno(), write=True)
