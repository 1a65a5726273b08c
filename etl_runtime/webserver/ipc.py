"""The framed protocol between the server and its worker processes.

Each worker owns one end of a Unix socket pair. Everything on it is a frame:
a 9-byte header (kind, payload length) followed by the payload. Data payloads
(object bytes, result chunks, encoded samples) travel raw, never pickled;
control payloads are small pickles. The socket buffer gives backpressure for
free: a worker producing chunks faster than the client reads blocks in
``send`` until the server has forwarded what it already has.

Server → worker::

    OBJECT  pickle((etl_args, fqn, obj)) obj = "bucket/object"; when fqn is None:
    DATA*   raw object bytes          streamed as the request body arrives
    DATA_END
    SAMPLE  pickle(sample dict)       one WebDataset sample

Worker → server::

    READY   pickle(pid) / LOAD_ERROR pickle(message)    once, after loading code
    SIZE    8-byte length             object mode, before the CHUNKs of a bytes result
    CHUNK*  raw bytes, then END       object mode result, streamed
    RESULT  raw tar bytes of a sample (empty: dropped)
    ERROR   pickle(error dict)         ends the current task
    LOG     utf-8 text                 anything the user code printed
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

from etl_runtime.wire.clients.streambuf import ReceiveStream

HEADER = struct.Struct("!BQ")

OBJECT, DATA, DATA_END, SAMPLE = 1, 2, 3, 4
READY, LOAD_ERROR, CHUNK, END, RESULT, ERROR, LOG, SIZE = 10, 11, 12, 13, 14, 15, 16, 17
LENGTH = struct.Struct("!Q")  # SIZE payload

# Results are cut into frames of at most this size, so neither side ever
# buffers a whole large object just to move it across the socket.
MAX_CHUNK = 1 << 20
# A payload up to this size is joined with its neighbouring frames into one
# write (a copy is cheaper than a syscall); a larger one is written as it is.
SMALL = 16 << 10

Payload = bytes | bytearray | memoryview


class FrameSocket:
    """Blocking, thread-safe frame I/O on the worker's end of the socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._rfile = sock.makefile("rb", buffering=1 << 16)
        self._send_lock = threading.Lock()

    def send(self, kind: int, payload: Payload = b"") -> None:
        self.send_frames((kind, payload))

    def send_frames(self, *frames: tuple[int, Payload]) -> None:
        """Send ``frames`` with one ``sendmsg`` (headers and payloads gathered, no copy)."""
        parts: list[Payload] = []
        for kind, payload in frames:
            parts.append(HEADER.pack(kind, len(payload)))
            if payload:
                parts.append(payload)
        with self._send_lock:
            sent = self.sock.sendmsg(parts)
            for part in parts:  # what a signal or a timeout cut short, if anything
                view = memoryview(part).cast("B")
                if sent >= len(view):
                    sent -= len(view)
                    continue
                self.sock.sendall(view[sent:])
                sent = 0

    def recv(self) -> tuple[int, bytes]:
        """Next frame; ``EOFError`` when the server closed its end."""
        header = self._rfile.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("server closed the worker socket")
        kind, size = HEADER.unpack(header)
        payload = self._rfile.read(size) if size else b""
        if len(payload) < size:
            raise EOFError("server closed the worker socket mid-frame")
        return kind, payload


async def read_frame(
    reader: asyncio.StreamReader | ReceiveStream,
) -> tuple[int, bytes | bytearray]:
    """Next frame from a worker; ``asyncio.IncompleteReadError`` on EOF."""
    kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
    payload = await reader.readexactly(size) if size else b""
    return kind, payload


def write_frames(writer: asyncio.StreamWriter, *frames: tuple[int, Payload]) -> None:
    """Write ``frames`` in as few writes (syscalls) as the payloads allow.

    Small payloads are joined with the headers around them into one write; a
    large one is written on its own as a memoryview: the part the socket does
    not take at once is buffered with one copy (the transport would slice a
    bytes payload first)."""
    parts: list[Payload] = []
    for kind, payload in frames:
        parts.append(HEADER.pack(kind, len(payload)))
        if len(payload) <= SMALL:
            if payload:
                parts.append(payload)
            continue
        writer.write(b"".join(parts))
        parts = []
        writer.write(memoryview(payload))
    if parts:
        writer.write(b"".join(parts))
