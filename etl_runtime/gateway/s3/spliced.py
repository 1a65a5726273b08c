"""S3 GetObject's bytes moved from the owner's socket to the client's inside the kernel.

An S3 client cannot follow the native API's 307 (``objects.py`` says why),
so the gateway relays every GetObject. Read into Python and written out
again, each byte is copied twice in user space; on two cores that cost the
S3 path about 15–20% of the native GET's rate at 1 MiB (``bench/s3.py``,
docs/benchmarks.md "S3 API"). Here the hop to the owner is one request on a
pooled raw connection (``wire.batchshare.SharePool``, the one GetBatch's
shares use: its answers always carry a ``Content-Length``), and a body over
``SPLICE_MIN`` goes socket → pipe → socket with ``os.splice``
(``wire/http/splice.py``), where the server offers it. Smaller bodies are read
whole and written with the status line and headers in one write
(``WholeResponse``): a pipe and two watched descriptors cost more than the
copy below that size, and a head written alone wakes the client twice.

An owner that breaks off mid-body closes the client's connection too, so its
answer is short of its ``Content-Length``, never complete-looking; a client
that goes away closes the owner's connection (it stands at an unknown place).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from etl_runtime.getbatch.exchange import ShareBody, ShareBroken, SharePool, Spliced
from etl_runtime.wire.http import splice

log = logging.getLogger(__name__)

SPLICE_MIN = 128 << 10  # bodies up to this size are read and written whole
POOL = SharePool()  # this process's connections to the owners, for S3 GETs


def offered(request: Request) -> bool:
    """Whether the server under this request moves bytes with ``os.splice``."""
    return splice.MESSAGE in (request.scope.get("extensions") or {})


async def request(url: str, headers: dict[str, str], timeout: float) -> ShareBody | None:
    """``GET url`` on a pooled connection; None where that answer cannot be relayed
    this way (no ``Content-Length``, or it broke off before its head): the caller then
    asks again with its general client, which answers any framing or the error."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        return await POOL.request("GET", url, path, headers, b"", timeout)
    except ShareBroken as e:
        log.info("S3 GET of %s relayed the general way: %s", url, e)
        return None


def send_now(url: str, headers: dict[str, str], timeout: float) -> ShareBody | None:
    """``GET url`` sent at once on an idle pooled connection (``SharePool.send_now``), its
    answer read later; None where no idle connection takes it (then ``request``)."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return POOL.send_now("GET", url, path, headers, timeout)


class WholeResponse(Response):
    """A small relayed answer: status line, headers and body in one write to the client
    (``splice.together``), so a client that reads the head first is not woken twice."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if splice.MESSAGE in (scope.get("extensions") or {}):
            await send({"type": splice.MESSAGE, "together": True})
        await super().__call__(scope, receive, send)


class SplicedResponse(Response):
    """The owner's answer (status, headers given) with its body spliced to the client."""

    def __init__(
        self,
        answer: ShareBody,
        status_code: int,
        headers: dict[str, str],
        media_type: str,
        what: str,
        timeout: float,
    ) -> None:
        super().__init__(None, status_code, headers=headers, media_type=media_type)
        self._answer, self._what, self._timeout = answer, what, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self._answer
        start = {"type": "http.response.start", "status": self.status_code}
        try:
            await send({**start, "headers": self.raw_headers})
            async for piece in answer.spliced(answer.left, self._what):
                if isinstance(piece, Spliced):
                    message = {"type": splice.MESSAGE, "fd": piece.fd, "count": piece.count}
                    await send({**message, "timeout": self._timeout, "more_body": True})
                else:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await answer.end()
        except splice.ClientGone:
            answer.close()
            return
        except (splice.SourceBroken, ShareBroken) as e:  # the client's connection is closed
            answer.close()
            log.warning("S3 GET of %s broken off (the connection is dropped): %s", self._what, e)
            return
        except BaseException:
            answer.close()
            raise
        await send({"type": "http.response.body", "body": b"", "more_body": False})
