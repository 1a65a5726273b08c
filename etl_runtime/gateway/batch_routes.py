"""The gateway's GetBatch route: ``GET /v1/ml/moss[/{bucket}]`` with a JSON ``MossReq`` body.

What the official SDK sends (``client.batch(...).get()``,
``aistore.pytorch.AISBatchIterDataset``): the default bucket in the path with
``?provider=``, an optional ``?coloc=`` hint (taken and not needed: the
gateway fetches every item from its owner itself), and the body. Beyond
AIStore, ``?etl_name=`` (with ``etl_args``, ``etl_pipeline``, as for an object
GET) transforms every item on its own target before it joins the archive.

The answer is the archive itself (``strm``: true, ``Content-Type:
application/x-tar``, or ``application/gzip`` for ``.tgz``) or, with ``strm``
false, ``multipart/mixed``: a ``metadata`` part (``{"uuid", "out":
[MossOut]}``) then an ``archive`` part.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import cast

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from etl_runtime.core.errors import SluiceError
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.core.params import refuse_unknown
from etl_runtime.etl.pipeline import check_chain_async, parse_chain
from etl_runtime.gateway.context import Gateway
from etl_runtime.getbatch.archive import Piece
from etl_runtime.getbatch.assemble import Assembler, multipart
from etl_runtime.getbatch.items import ITEM_TIMEOUT
from etl_runtime.getbatch.request import parse_request
from etl_runtime.wire import splice
from etl_runtime.wire.batchshare import Spliced
from etl_runtime.wire.duplex import DuplexClient
from etl_runtime.wire.fastpath import FastRouter

log = logging.getLogger(__name__)

QUERY = ("provider", "coloc", "etl_name", "etl_args", "etl_pipeline")


class BatchResponse(StreamingResponse):
    """Stops the batch's items in flight however the answer ends (a client gone early too).

    A batch that fails after its answer started returns without the final
    empty chunk: the server then closes the connection (uvicorn logs one line,
    "ASGI callable returned without completing response"), and the client's
    HTTP library sees a chunked body that never ended, or, for an answer sent
    with a ``length`` (``Assembler.known_length``), a body shorter than its
    Content-Length.
    """

    def __init__(
        self,
        content: AsyncIterator[Piece],
        asm: Assembler,
        media_type: str,
        length: int | None = None,
    ) -> None:
        # bytearray pieces too: the server writes any bytes-like body as is
        headers = {"Content-Length": str(length)} if length is not None else None
        super().__init__(
            cast(AsyncIterator[bytes], content), headers=headers, media_type=media_type
        )
        self._pieces = content
        self._asm = asm

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        try:
            async for chunk in self._pieces:
                if isinstance(chunk, Spliced):  # wire/splice.py: socket to socket
                    await send(
                        {
                            "type": splice.MESSAGE,
                            "fd": chunk.fd,
                            "count": chunk.count,
                            "timeout": ITEM_TIMEOUT,
                            "more_body": True,
                        }
                    )
                else:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except SluiceError as e:
            log.warning("GetBatch answer broken off (the connection is dropped): %s", e.message)
            return
        except splice.ClientGone:
            return  # the share's socket is left mid-entry: closed with the batch, never pooled
        except splice.SourceBroken as e:
            assert isinstance(chunk, Spliced)
            log.warning(
                "GetBatch answer broken off (the connection is dropped): %s (%s)", chunk.what, e
            )
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._asm.close()


async def get_batch(
    gw: Gateway, http: DuplexClient, request: Request, bucket: str | None
) -> Response:
    refuse_unknown(request, QUERY, bucket=bucket)
    if bucket is not None:
        validate_bucket(bucket)
    gw.require_read(request)
    q = request.query_params
    chain = parse_chain(q.get("etl_name"), q.get("etl_pipeline"))
    if chain:
        await check_chain_async(gw.backend.get, chain)
    body = await read_json(request, "the GetBatch request")
    req = parse_request(
        body,
        bucket,
        q.get("provider") or "",
        gw.cmap.get() if gw.cmap is not None else None,
        etl_name=q.get("etl_name"),
        etl_args=q.get("etl_args"),
        etl_pipeline=q.get("etl_pipeline"),
    )
    asm = Assembler(gw, http, req)
    if not req.streaming:
        boundary, body_iter = await multipart(asm, req.fmt)
        return BatchResponse(body_iter, asm, f"multipart/mixed; boundary={boundary}")
    await asm.prime()  # a failure among the first items: a plain JSON error
    length = asm.known_length()
    if length is not None and splice.MESSAGE in (request.scope.get("extensions") or {}):
        asm.use_splice()
    return BatchResponse(asm.archive(), asm, req.content_type, length)


def batch_router(gw: Gateway, http: DuplexClient) -> FastRouter:
    """``http``: the client items are read with (the app closes it at shutdown)."""
    router = FastRouter()

    @router.get("/v1/ml/moss")
    async def get_batch_any(request: Request) -> Response:
        return await get_batch(gw, http, request, None)

    @router.get("/v1/ml/moss/{bucket}")
    async def get_batch_bucket(bucket: str, request: Request) -> Response:
        return await get_batch(gw, http, request, bucket)

    router.fast("/v1/ml/moss", ["GET"])  # wire/fastpath.py
    router.fast("/v1/ml/moss/{bucket}", ["GET"])
    return router
