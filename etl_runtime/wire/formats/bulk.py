"""The batched transform exchange: many objects to a Sluice transformer in one request.

GetBatch through an object-mode ETL used to cost one hpush ``PUT`` per item
between a target and its transformer; the HTTP exchange (written and parsed
on both sides) cost more CPU than an identity transform. A target now sends
a share's objects in one request, by path, and reads all outputs from one
answer (``storage_target/getbatch_etl.py`` sends, ``webserver/bulk.py``
answers). Both sides take the framing from here.

Request: ``POST {transformer}/_sluice/batch`` with the ETL's bearer token and
a JSON body ``{"etl_args": str | null, "items": [[object, etl_fqn], ...]}``
(``object`` is ``bucket/name``; ``etl_fqn`` the file's path, checked as for
an hpush ``PUT``; a third element, ``etl_grant``, where the target hands its
files: ``etl/grants.py``). Only by path: an object the transformer cannot read takes
the per-object path.

Answer: 200, ``application/x-sluice-batch``, chunked. For each item, in
request order, one or more frames; a frame is a 10-byte head ``>HQ``
(status, length) and ``length`` bytes:

* ``206``: a piece of the item's output; more frames of the item follow
  (an iterable result: one frame per chunk it yields);
* ``200``: the item's last piece (maybe empty): the item is whole;
* any other status: the item failed; the bytes are its JSON error body (as
  the hpush ``PUT`` would have answered it) and pieces sent before are void.

The answer ends with the last item's last frame. One that ends sooner (the
transformer died, a timeout) leaves the items after the last whole one
without an outcome: the reader raises ``StreamBroken`` and the target fails
them (502 naming the ETL, object and target), never a short output.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

from etl_runtime.core.errors import StreamBroken

PATH = "/_sluice/batch"
MEDIA_TYPE = "application/x-sluice-batch"
HEAD = struct.Struct(">HQ")
LAST = 200  # the item's last piece
MORE = 206  # a piece; more follow
ERROR_MAX = 64 << 10  # an error body longer than this is a broken answer


def head(status: int, length: int) -> bytes:
    return HEAD.pack(status, length)


class FrameReader:
    """Frames out of an answer's body (``chunks``: its pieces as they arrive).

    ``next_head()`` returns the next frame's (status, length); then ``piece()``
    hands out its bytes, as they arrive, until it returns ``b""``. A body that
    ends inside or before a frame the caller asked for raises ``StreamBroken``.
    """

    def __init__(self, chunks: AsyncIterator[bytes | bytearray]) -> None:
        self._chunks = chunks
        self._buf: bytes | bytearray = b""
        self._at = 0  # how much of _buf was handed out
        self._left = 0  # bytes of the current frame not handed out yet

    async def _more(self) -> None:
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            raise StreamBroken("the batch answer ended before its last item") from None
        rest = len(self._buf) - self._at
        self._buf = bytes(memoryview(self._buf)[self._at :]) + chunk if rest else chunk
        self._at = 0

    async def next_head(self) -> tuple[int, int]:
        while self._left:  # the rest of a frame the caller did not read: skipped
            await self.piece()
        while len(self._buf) - self._at < HEAD.size:
            await self._more()
        status, length = HEAD.unpack_from(self._buf, self._at)
        self._at += HEAD.size
        self._left = length
        return status, length

    async def piece(self) -> bytes | bytearray | memoryview:
        """The next bytes of the current frame (at most what is buffered); ``b""`` at its end."""
        if not self._left:
            return b""
        if self._at == len(self._buf):
            await self._more()
        n = min(self._left, len(self._buf) - self._at)
        if self._at == 0 and n == len(self._buf):
            out: bytes | bytearray | memoryview = self._buf  # a whole chunk: no copy
        else:
            out = memoryview(self._buf)[self._at : self._at + n]
        self._at += n
        self._left -= n
        return out

    async def whole(self, limit: int = ERROR_MAX) -> bytes:
        """The current frame's bytes joined (an error body)."""
        if self._left > limit:
            raise StreamBroken(f"a batch answer's error body of {self._left} bytes")
        parts = []
        while piece := await self.piece():
            parts.append(bytes(piece))
        return b"".join(parts)

    async def end(self) -> bool:
        """After the last item: True if the answer ends here (its connection is then kept)."""
        if self._left or self._at < len(self._buf):
            return False
        try:
            await anext(self._chunks)
        except StopAsyncIteration:
            return True
        return False
