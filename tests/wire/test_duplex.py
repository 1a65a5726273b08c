"""``DuplexClient`` against a real uvicorn server on loopback; the client on both loops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from etl_runtime.webserver.responses import TransformedStream
from etl_runtime.wire.clients.duplex import ConnectError, DuplexClient, StreamBroken, Timeout
from tests.servers import free_port, run_on, serve_in_thread


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.put("/echo")
    async def echo(request: Request) -> Response:
        done = asyncio.Event()  # StreamingResponse would steal body chunks

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in request.stream():
                if chunk:
                    yield chunk
            done.set()

        return TransformedStream(chunks(), "application/octet-stream", done)

    @app.put("/port")
    async def port(request: Request) -> JSONResponse:
        body = await request.body()
        assert request.client is not None
        return JSONResponse({"port": request.client.port, "len": len(body)})

    @app.put("/early")
    async def early() -> JSONResponse:
        return JSONResponse({"error": "no"}, status_code=401)

    @app.get("/broken")
    async def broken() -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"x" * 1000
            raise RuntimeError("boom")

        return StreamingResponse(chunks())

    @app.get("/slow")
    async def slow() -> Response:
        await asyncio.sleep(2)
        return Response(b"late")

    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(echo_app()) as base:
        yield base


def test_full_duplex_echo_and_reuse(url: str, loop_name: str) -> None:
    """Each chunk is sent only after the previous one came back: needs real duplex."""

    async def main() -> None:
        client = DuplexClient()
        echoed = asyncio.Queue[bytes]()

        async def body() -> AsyncIterator[bytes]:
            for i in range(20):
                chunk = f"chunk-{i:03d};".encode() * 100
                yield chunk
                got = b""
                while len(got) < len(chunk):
                    got += await asyncio.wait_for(echoed.get(), 5)
                assert got == chunk

        r = await client.request("PUT", f"{url}/echo", body=body(), timeout=10)
        assert r.status_code == 200
        total = 0
        async for data in r.aiter_bytes():
            total += len(data)
            echoed.put_nowait(bytes(data))
        assert total == 20 * 1000
        ports = set()
        for _ in range(3):
            r = await client.request("PUT", f"{url}/port", body=b"abc", timeout=10)
            body_json = await r.read(1000)
            assert b'"len":3' in body_json
            ports.add(body_json)
        assert len(ports) == 1  # one kept-alive connection served all three
        await client.aclose()

    run_on(loop_name, main())


def test_early_answer_and_broken_stream(url: str, loop_name: str) -> None:
    async def main() -> None:
        client = DuplexClient()

        async def endless() -> AsyncIterator[bytes]:
            while True:
                yield b"y" * 65536
                await asyncio.sleep(0)

        r = await client.request("PUT", f"{url}/early", body=endless(), timeout=10)
        assert r.status_code == 401 and b"no" in await r.read(1000)
        r = await client.request("GET", f"{url}/broken", timeout=10)
        assert r.status_code == 200
        with pytest.raises(StreamBroken):
            async for _ in r.aiter_bytes():
                pass
        with pytest.raises(Timeout):
            await client.request("GET", f"{url}/slow", timeout=0.3)
        with pytest.raises(ConnectError):
            await client.request("GET", f"http://127.0.0.1:{free_port()}/", timeout=1)
        # after all that the client still works
        r = await client.request("PUT", f"{url}/port", body=b"ok", timeout=10)
        assert b'"len":2' in await r.read(1000)
        await client.aclose()

    run_on(loop_name, main())
