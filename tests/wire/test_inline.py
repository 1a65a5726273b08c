"""``wire/http/inprotocol.py``'s hooks on a real uvicorn server, on asyncio and on uvloop.

The answerer's behaviour with a real target is in
``tests/storage_target/test_inline.py``; here the starter: what it puts in
the scope reaches the app, what it returns runs once the app is done (after
the answer, whether the app used the scope's value or failed), a starter that
raises leaves the request to the app, and a request with a body still reads
its body.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from etl_runtime.wire.http import connections, zerocopy
from etl_runtime.wire.http.connections import Limits
from tests.servers import serve_in_thread


class Seen:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.answered: list[str] = []
        self.event = threading.Event()


@pytest.fixture
def served(loop_name: str) -> Iterator[tuple[httpx.Client, Seen]]:
    seen = Seen()

    def starter(scope: dict[str, Any]) -> Any:
        path = scope["path"]
        if path == "/raise":
            raise RuntimeError("a starter that fails")
        if path == "/none":
            return None
        scope["test.started"] = f"started {path}"

        def done() -> None:
            assert path in seen.answered  # the app ran first
            seen.done.append(path)
            seen.event.set()

        return done

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.answered.append(scope["path"])
        if scope["path"] == "/fail":
            raise RuntimeError("an app that fails")
        text = f"{scope.get('test.started')} body={body.decode()}".encode()
        headers = [(b"content-length", str(len(text)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": text})

    http = connections.http_protocol(zerocopy.http_protocol({}), Limits(), starter=starter)
    with (
        serve_in_thread(app, loop=loop_name, http=http) as url,
        httpx.Client(base_url=url, timeout=10) as c,
    ):
        yield c, seen


def _wait_done(seen: Seen, path: str) -> None:
    for _ in range(100):
        if path in seen.done:
            return
        seen.event.wait(0.05)
        seen.event.clear()
    raise AssertionError(f"done() of {path} never ran: {seen.done}")


def test_what_the_starter_leaves_reaches_the_app_and_done_runs_after(
    served: tuple[httpx.Client, Seen],
) -> None:
    c, seen = served
    assert c.get("/a").text == "started /a body="
    _wait_done(seen, "/a")
    assert c.post("/b", content=b"xyz").text == "started /b body=xyz"
    _wait_done(seen, "/b")
    assert c.get("/fail").status_code == 500  # uvicorn's answer to an app that raised
    _wait_done(seen, "/fail")
    assert seen.done == ["/a", "/b", "/fail"]


def test_a_starter_that_raises_or_declines_leaves_the_request_to_the_app(
    served: tuple[httpx.Client, Seen],
) -> None:
    c, seen = served
    assert c.get("/raise").text == "None body="
    assert c.get("/none").text == "None body="
    assert c.get("/after").text == "started /after body="
    _wait_done(seen, "/after")
    assert seen.done == ["/after"]
