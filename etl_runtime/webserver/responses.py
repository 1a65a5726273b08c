"""``TransformedStream``: the streamed 200 answer of both modes.

Starlette's ``StreamingResponse`` listens for a client disconnect by calling
``receive()`` while it streams, which would steal request-body chunks from a
WebDataset shard still being uploaded and parsed. This response starts
listening only once the request body is fully consumed (``body_done``); before
that, the body reader itself notices a vanished client. An exception from the
body iterator propagates, so uvicorn drops the connection without the final
chunk and the client sees an incomplete response, never a clean short one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from etl_runtime.wire.http.streaming import until_gone


class TransformedStream(Response):
    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        media_type: str,
        body_done: asyncio.Event | None = None,
        length: int | None = None,
    ) -> None:
        super().__init__(content=None, status_code=200, media_type=media_type)
        # Drop the "content-length: 0" of the empty body: length unknown -> chunked.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        if length is not None:
            self.raw_headers.append((b"content-length", str(length).encode()))
        self.chunks = chunks
        if body_done is None:
            body_done = asyncio.Event()
            body_done.set()
        self.body_done = body_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream() -> bool:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.chunks:
                # A memoryview: the transport slices off what the socket did not
                # take without copying it first (bytes[n:] would).
                body = memoryview(chunk)
                await send({"type": "http.response.body", "body": body, "more_body": True})
            return True

        try:
            await until_gone(stream, receive, send, self.body_done)
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
