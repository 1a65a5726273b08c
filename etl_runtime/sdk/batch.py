"""GetBatch from Sluice's SDK: many objects in one request, in the order asked.

::

    items = [("images", "a.jpg"), ("images", "b.jpg"), ("labels", "a.json")]
    for got in client.get_batch(items, etl_name="resize"):
        got.bucket, got.name, got.data

One ``GET /v1/ml/moss`` (AIStore's GetBatch, docs/getbatch.md) whose
answer, a TAR stream, is read as it arrives: each item is handed on as soon
as its bytes are in, and the items are checked against the request, name by
name, so a stream that breaks off or goes astray raises ``StreamError``
instead of ending early. With ``etl_name`` (and ``etl_args``) every item is
transformed on its own target first. With ``missing_ok`` a missing object (or
one the ETL fails on) is an item whose ``data`` is None and whose ``error``
says why; without it the batch fails with ``NotFound`` (or the ETL's error)
naming the object. A 503 before the answer started is retried like any call.
The gateway redirects the request (307) to the target it designates to
assemble it; the body goes again to that target.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from etl_runtime.sdk import errors
from etl_runtime.sdk.errors import SluiceError, StreamError
from etl_runtime.sdk.retry import RETRY_STATUSES, RETRY_TRANSPORT_ERRORS, Attempts

MAX_HOPS = 3

if TYPE_CHECKING:
    from etl_runtime.sdk.client import Client, EtlArgs, EtlName

MISSING = "__404__/"


@dataclass(frozen=True)
class BatchItem:
    bucket: str
    name: str
    data: bytes | None  # None: the item failed (``missing_ok``): see ``error``
    error: str | None = None  # why: the object does not exist, the ETL refused it...


class _Stream:
    """A file-like view of an answer body, for ``tarfile``'s stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already read

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) - self._pos < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            del self._buf[: self._pos]  # once per chunk, not per read
            self._pos = 0
            self._buf += chunk
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = bytes(self._buf[self._pos : end])
        self._pos = end
        return out


def get_batch(
    client: Client,
    items: Iterable[tuple[str, str]],
    *,
    etl_name: EtlName = None,
    etl_args: EtlArgs = None,
    missing_ok: bool = False,
) -> Iterator[BatchItem]:
    """``(bucket, object)`` pairs -> a ``BatchItem`` each, in the same order."""
    from etl_runtime.sdk.client import etl_params, release_redirect

    wanted = list(items)
    if not wanted:
        return
    body = json.dumps(
        {"in": [{"objname": n, "bucket": b} for b, n in wanted], "strm": True, "coer": missing_ok}
    ).encode()
    what = f"GetBatch of {len(wanted)} items"
    attempts = Attempts(client.retry, what)
    while True:
        request = client._http.build_request(
            "GET",
            client.url("/v1/ml/moss"),
            params=etl_params(etl_name, etl_args),
            content=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            response = client._http.send(request, stream=True)
            for _hop in range(MAX_HOPS):  # the gateway's 307 to the target that assembles it
                location = response.headers.get("location")
                if response.status_code not in (307, 308) or not location:
                    break
                release_redirect(response)  # its connection kept for the next batch
                request = client._http.build_request(
                    "GET",
                    response.url.join(location),  # the whole query, signed where it must be
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
                response = client._http.send(request, stream=True)
        except httpx.TransportError as exc:
            error: SluiceError = errors.from_transport(exc, what)
            if isinstance(exc, RETRY_TRANSPORT_ERRORS) and attempts.again(error):
                continue
            raise attempts.exhausted(error) from exc
        if response.status_code < 400:
            break
        try:
            response.read()
        finally:
            response.close()
        error = errors.from_response(response)
        if response.status_code in RETRY_STATUSES and attempts.again(
            error, response.headers.get("retry-after")
        ):
            continue
        raise attempts.exhausted(error)
    try:
        yield from _items(response, wanted, missing_ok)
    finally:
        response.close()


def _items(
    response: httpx.Response, wanted: list[tuple[str, str]], missing_ok: bool
) -> Iterator[BatchItem]:
    done = 0
    try:
        stream = _Stream(response.iter_bytes())
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                if done == len(wanted):
                    raise StreamError(f"GetBatch: more entries than the {done} items asked")
                bucket, name = wanted[done]
                if member.name == f"{bucket}/{name}":
                    f = tar.extractfile(member)
                    data = f.read() if f is not None else b""
                    if len(data) != member.size:
                        raise StreamError(f"GetBatch: {bucket}/{name} came short")
                    yield BatchItem(bucket, name, data)
                elif missing_ok and member.name == f"{MISSING}{bucket}/{name}":
                    yield BatchItem(bucket, name, None, member.pax_headers.get("comment"))
                else:
                    raise StreamError(
                        f"GetBatch: item {done} should be {bucket}/{name}, the answer has "
                        f"{member.name!r}"
                    )
                done += 1
    except (tarfile.TarError, httpx.TransportError) as exc:
        at = "/".join(wanted[min(done, len(wanted) - 1)])
        raise StreamError(
            f"GetBatch broke off after {done} of {len(wanted)} items (at {at}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if done != len(wanted):
        raise StreamError(f"GetBatch ended after {done} of {len(wanted)} items")
