"""Answering a GetBatch, the same in the gateway and in the target it designates.

``answer`` parses the request (``request.py``), starts the assembly
(``assemble.py``) and returns the response: the archive itself (``strm``),
or the buffered multipart answer. ``BatchResponse`` sends it and stops the
items in flight however it ends.

A GetBatch's body names its items and its query the ETL and provider, so a
redirect to a designated target must not let the redirect's signature be
reused for other items or another query: ``signed_path`` puts the query
(without the signature) and the body's SHA-256 into what the gateway signs
(``core/auth.py``'s ``sign_redirect``) and the target checks.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any, cast
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from etl_runtime.cluster.clustermap import ClusterMap
from etl_runtime.core.access import SIGNATURE_PARAMS
from etl_runtime.core.errors import SluiceError
from etl_runtime.getbatch.archive import Piece
from etl_runtime.getbatch.assemble import Assembler, multipart
from etl_runtime.getbatch.exchange import FileSlice, Spliced
from etl_runtime.getbatch.host import BatchHost
from etl_runtime.getbatch.items import ITEM_TIMEOUT
from etl_runtime.getbatch.request import parse_request
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http import splice
from etl_runtime.wire.http.streaming import until_gone
from etl_runtime.wire.http.zerocopy import EXTENSION

log = logging.getLogger(__name__)

# The query a user may send (``?coloc=`` is taken and not needed).
QUERY = ("provider", "coloc", "etl_name", "etl_args", "etl_pipeline")
# What the gateway adds when it redirects to a designated target: the cluster
# map version it planned with (the target reads its map past the cache if
# older) and the signature (``sluice_exp``, ``sluice_sig``) where reads need a token.
MAP_PARAM = "sluice_map"


def batch_path(bucket: str | None) -> str:
    return "/v1/ml/moss" if bucket is None else f"/v1/ml/moss/{bucket}"


def signed_path(bucket: str | None, query: list[tuple[str, str]], body: bytes) -> str:
    """What a redirect to a designated target signs: the route, its query (in order,
    without ``sluice_exp``/``sluice_sig``) and the body it carries."""
    kept = urlencode([(k, v) for k, v in query if k not in SIGNATURE_PARAMS])
    return f"{batch_path(bucket)}?{kept}#{hashlib.sha256(body).hexdigest()}"


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

    async def _stream(self, send: Send) -> bool:
        """Every message but the last; False: broken off (no end: the server drops it)."""
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        try:
            async for chunk in self._pieces:
                if isinstance(chunk, FileSlice):  # wire/http/zerocopy.py: os.sendfile
                    await send(
                        {
                            "type": EXTENSION,
                            "file": chunk.file,
                            "offset": chunk.offset,
                            "count": chunk.count,
                            "more_body": True,
                        }
                    )
                elif isinstance(chunk, Spliced):  # wire/http/splice.py: socket to socket
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
            return False
        except splice.ClientGone:
            return False  # the share's socket is left mid-entry: closed with the batch
        except splice.SourceBroken as e:
            assert isinstance(chunk, Spliced)
            log.warning(
                "GetBatch answer broken off (the connection is dropped): %s (%s)", chunk.what, e
            )
            return False
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:  # not Starlette's task group (``wire/http/streaming.py``)
            await until_gone(lambda: self._stream(send), receive, send)
        finally:
            self._asm.close()


async def answer(
    host: BatchHost,
    http: DuplexClient,
    request: Request,
    bucket: str | None,
    body: Any,
    cmap: ClusterMap | None,
) -> Response:
    """The GetBatch ``body`` (parsed JSON), checked and answered; the caller checked
    the query, the caller's right to read and the ETLs named."""
    q = request.query_params
    req = parse_request(
        body,
        bucket,
        q.get("provider") or "",
        cmap,
        etl_name=q.get("etl_name"),
        etl_args=q.get("etl_args"),
        etl_pipeline=q.get("etl_pipeline"),
    )
    asm = Assembler(host, http, req)
    if not req.streaming:
        boundary, body_iter = await multipart(asm, req.fmt)
        return BatchResponse(body_iter, asm, f"multipart/mixed; boundary={boundary}")
    await asm.prime()  # a failure among the first items: a plain JSON error
    length = asm.known_length()
    if length is not None and splice.MESSAGE in (request.scope.get("extensions") or {}):
        asm.use_splice()
    return BatchResponse(asm.archive(), asm, req.content_type, length)
