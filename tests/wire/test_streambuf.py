"""``streambuf.ReceiveStream`` over a real socket pair, on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from etl_runtime.wire.clients import streambuf
from tests.servers import run_on


def test_reads_framing_and_direct_receive(loop_name: str) -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        reader, writer = await streambuf.open_unix_connection(ours, limit=1 << 16)
        big = os.urandom(3 << 20)
        loop = asyncio.get_running_loop()

        def peer() -> None:
            theirs.sendall(b"HEAD\r\n\r\n" + big[:1000])  # part of the big piece comes early
            theirs.sendall(big[1000:] + b"tail")
            theirs.shutdown(socket.SHUT_WR)

        sending = loop.run_in_executor(None, peer)
        assert await reader.readuntil(b"\r\n\r\n") == b"HEAD\r\n\r\n"
        got = await reader.readexactly(len(big))  # received straight into its buffer
        assert isinstance(got, bytearray) and got == big
        assert await reader.readexactly(2) == b"ta"
        assert await reader.read(100) == b"il"
        await sending
        assert await reader.read(100) == b""
        assert reader.at_eof()
        with pytest.raises(asyncio.IncompleteReadError):
            await reader.readexactly(1 << 20)
        writer.close()
        theirs.close()

    run_on(loop_name, main())


def test_eof_inside_a_direct_read_and_limits(loop_name: str) -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        reader, writer = await streambuf.open_unix_connection(ours, limit=1 << 16)
        theirs.sendall(b"x" * 100_000)
        theirs.close()
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await reader.readexactly(200_000)
        assert len(e.value.partial) == 100_000
        writer.close()

        ours, theirs = socket.socketpair()
        reader, writer = await streambuf.open_unix_connection(ours, limit=1 << 10)
        theirs.sendall(b"y" * 5000)
        with pytest.raises(asyncio.LimitOverrunError):
            await reader.readuntil(b"\r\n")
        writer.close()
        theirs.close()

    run_on(loop_name, main())


def test_slow_reader_pauses_the_socket(loop_name: str) -> None:
    """Unread data stays bounded: reading pauses above 2 * limit."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        reader, writer = await streambuf.open_unix_connection(ours, limit=1 << 16)
        sent = 0
        chunk = b"z" * 65536
        for _ in range(200):  # until the socket buffers are full
            try:
                sent += theirs.send(chunk)
            except BlockingIOError:
                await asyncio.sleep(0.01)
                try:
                    sent += theirs.send(chunk)
                except BlockingIOError:
                    break
        assert sent < 200 * 65536  # the sender was stopped
        assert len(reader._buffer) <= 2 * (1 << 16) + streambuf.SCRATCH
        total = 0
        while total < sent:
            total += len(await reader.read(1 << 20))
        assert total == sent
        writer.close()
        theirs.close()

    run_on(loop_name, main())
