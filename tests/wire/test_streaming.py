"""``wire/http/streaming.py``'s ``until_gone`` on asyncio and uvloop: what an answer's
sender sees when the stream ends, breaks off, or its client leaves first."""

from __future__ import annotations

import asyncio
from typing import Any

from etl_runtime.wire.http.streaming import END, until_gone
from tests.servers import run_on


class Client:
    """An ASGI ``receive``/``send`` pair: ``leave()`` is the client going away."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        await asyncio.sleep(0)

    def leave(self) -> None:
        self._gone.set()


def piece(n: int) -> dict[str, Any]:
    return {"type": "http.response.body", "body": b"x" * n, "more_body": True}


def test_a_whole_stream_ends_with_the_last_message(loop_name: str) -> None:
    async def main() -> tuple[bool, list[dict[str, Any]]]:
        c = Client()

        async def stream() -> bool:
            for n in (1, 2):
                await c.send(piece(n))
            return True

        return await until_gone(stream, c.receive, c.send), c.sent

    done, sent = run_on(loop_name, main())
    assert done and sent == [piece(1), piece(2), END]


def test_a_stream_broken_off_gets_no_last_message(loop_name: str) -> None:
    async def main() -> tuple[bool, list[dict[str, Any]]]:
        c = Client()

        async def stream() -> bool:
            await c.send(piece(1))
            return False

        return await until_gone(stream, c.receive, c.send), c.sent

    done, sent = run_on(loop_name, main())
    assert not done and sent == [piece(1)]


def test_a_client_that_leaves_stops_the_stream_and_nothing_else(loop_name: str) -> None:
    async def main() -> tuple[bool, list[dict[str, Any]], str]:
        c = Client()

        async def stream() -> bool:
            await c.send(piece(1))
            c.leave()
            await asyncio.sleep(10)  # cancelled: the client is gone
            await c.send(piece(2))
            return True

        done = await until_gone(stream, c.receive, c.send)
        await asyncio.sleep(0.01)  # the caller's task goes on: the cancel was taken back
        return done, c.sent, "still running"

    done, sent, after = run_on(loop_name, main())
    assert not done and sent == [piece(1)] and after == "still running"


def test_a_cancel_from_elsewhere_still_cancels(loop_name: str) -> None:
    async def main() -> str:
        c = Client()

        async def stream() -> bool:
            await asyncio.sleep(10)
            return True

        task = asyncio.ensure_future(until_gone(stream, c.receive, c.send))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    assert run_on(loop_name, main()) == "cancelled"


def test_listening_waits_for_the_body_to_be_read(loop_name: str) -> None:
    async def main() -> tuple[bool, list[dict[str, Any]]]:
        c = Client()
        c.leave()  # receive() would say "gone" at once: not asked before the body is read
        body_read = asyncio.Event()

        async def stream() -> bool:
            await c.send(piece(1))
            await asyncio.sleep(0.01)
            return True

        return await until_gone(stream, c.receive, c.send, body_read), c.sent

    done, sent = run_on(loop_name, main())
    assert done and sent == [piece(1), END]
