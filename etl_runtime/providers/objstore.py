"""``ObstoreBackend``: the ``Backend`` calls over an obstore store, whatever the provider.

obstore (Rust ``object_store`` under a thin Python layer) speaks S3, GCS and
Azure Blob with one API; it was chosen over each provider's own Python client
by ``bench/remote.py`` (figures in docs/remote.md): async on any asyncio loop
(uvloop included), a GET streamed in chunks we pick, and a fraction of the CPU
per MiB. A provider module (``aws``, ``gcp``, ``azure``) builds the store from
its settings and says how its backend words errors; this class makes the calls
and maps every obstore exception to one Sluice error
(``etl_runtime.core.errors``) naming the bucket, the object and the backend.
Nothing else in Sluice sees obstore's exceptions.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import obstore
from obstore import exceptions as obx

from etl_runtime.core.errors import (
    BackendError,
    BackendForbidden,
    BackendUnauthorized,
    BackendUnavailable,
    ObjectNotFound,
    SluiceError,
)
from etl_runtime.providers.backend import RemoteMeta

STREAM_CHUNK = 1 << 20  # small enough that the first byte does not wait for much
CONNECT_TIMEOUT = "3s"
REQUEST_TIMEOUT = "600s"  # a whole GET of a big shard
RETRIES = 2
RETRY_TIMEOUT = dt.timedelta(seconds=6)
# obstore raises Python's FileNotFoundError for a missing object (and NotFoundError
# in some versions).
NOT_FOUND = (obx.NotFoundError, FileNotFoundError)
STATUS = re.compile(r"status code: (\d{3})\b")
UNREACHABLE = ("error sending request", "connect", "timed out", "Timeout", "dns", "refused")


def client_options(endpoint: str | None) -> dict[str, Any]:
    return {
        "allow_http": bool(endpoint and endpoint.startswith("http:")),
        "connect_timeout": CONNECT_TIMEOUT,
        "timeout": REQUEST_TIMEOUT,
    }


RETRY_CONFIG: dict[str, Any] = {"max_retries": RETRIES, "retry_timeout": RETRY_TIMEOUT}


class ObstoreBackend:
    """One remote bucket's calls. A provider's subclass sets the class attributes."""

    provider = ""  # its name in core.providers: aws://bucket/object in messages
    no_bucket: tuple[str, ...] = ()  # words of the backend for "no such bucket"
    bad_credentials: tuple[str, ...] = ()  # ... for "these credentials are not valid"
    denied: tuple[str, ...] = ()  # ... for "valid, but not allowed"

    def __init__(self, bucket: str, where: str, store: Any, credentials_from: str) -> None:
        self.bucket = bucket
        self.where = where  # the backend, for messages
        self.store = store
        self.credentials_from = credentials_from

    def uri(self, name: str | None = None) -> str:
        return (
            f"{self.provider}://{self.bucket}/{name}"
            if name
            else f"{self.provider}://{self.bucket}"
        )

    def missing_credentials(self) -> str | None:
        """Why no request can be signed (the hint to fix it), or None."""
        return None

    # -- errors ----------------------------------------------------------------------

    def _check_credentials(self, name: str | None) -> None:
        why = self.missing_credentials()
        if why:
            raise BackendUnauthorized(
                f"no credentials for {self.uri()} on backend {self.where}: {why}",
                bucket=self.bucket,
                object=name,
                backend=self.where,
            )

    def error(self, e: Exception, name: str | None, op: str) -> SluiceError:
        """The Sluice error for obstore's ``e`` during ``op`` of ``name`` (or the bucket)."""
        what = self.uri(name)
        reason = _reason(e)
        ctx: dict[str, Any] = {"bucket": self.bucket, "object": name, "backend": self.where}
        # The backend's HTTP status: a provider's own call's, or as obstore words a
        # GenericError ("Server returned non-2xx status code: 401 Unauthorized").
        status = getattr(e, "status", None) or _status(reason)
        if _any(reason, *self.no_bucket) or (status == 404 and name is None):
            return ObjectNotFound(
                f"backend {self.where} has no bucket {self.bucket!r} ({op} {what})", **ctx
            )
        if isinstance(e, NOT_FOUND) or status == 404:
            return ObjectNotFound(f"object {what} does not exist on backend {self.where}", **ctx)
        if (
            isinstance(e, obx.UnauthenticatedError)
            or status == 401
            or _any(reason, *self.bad_credentials)
        ):
            return BackendUnauthorized(
                f"backend {self.where} rejected the credentials ({self.credentials_from})"
                f" for {op} {what}: {reason}",
                **ctx,
            )
        if (
            isinstance(e, obx.PermissionDeniedError | PermissionError)
            or status == 403
            or _any(reason, *self.denied)
        ):
            return BackendForbidden(
                f"backend {self.where} denied {op} {what} with the credentials from "
                f"{self.credentials_from}: {reason}",
                **ctx,
            )
        if (status is not None and status >= 500) or (
            status is None and _any(reason, *UNREACHABLE)
        ):
            return BackendUnavailable(
                f"backend {self.where} of {self.uri()} is not reachable ({op} {what}): "
                f"{reason}; retry in a few seconds",
                **ctx,
            )
        return BackendError(f"backend {self.where} failed {op} {what}: {reason}", **ctx)

    # -- calls -----------------------------------------------------------------------

    async def head(self, name: str) -> RemoteMeta | None:
        """The object's meta, or None if the backend has no such object."""
        self._check_credentials(name)
        try:
            return RemoteMeta.of(await obstore.head_async(self.store, name))
        except NOT_FOUND:
            return None
        except Exception as e:
            raise self.error(e, name, "HEAD") from None

    async def open(self, name: str) -> tuple[RemoteMeta, AsyncIterator[bytes]]:
        """Start a GET: the meta now, the bytes as they come (errors mapped)."""
        self._check_credentials(name)
        try:
            result = await obstore.get_async(self.store, name)
        except Exception as e:
            raise self.error(e, name, "GET") from None
        meta = RemoteMeta.of(result.meta)
        if meta.size <= STREAM_CHUNK:  # one chunk anyway: one await, not a stream's three
            return meta, self._whole(result, name)
        return meta, self._chunks(result.stream(min_chunk_size=STREAM_CHUNK), name)

    async def _whole(self, result: Any, name: str) -> AsyncIterator[bytes]:
        try:
            data = await result.bytes_async()
        except Exception as e:
            raise self.error(e, name, "GET") from None
        if len(data):
            yield data

    async def _chunks(self, stream: Any, name: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        except Exception as e:
            raise self.error(e, name, "GET") from None

    async def put_file(self, name: str, path: Path) -> RemoteMeta:
        self._check_credentials(name)
        try:
            with open(path, "rb") as f:
                await obstore.put_async(self.store, name, f)  # type: ignore[arg-type]
            return RemoteMeta.of(await obstore.head_async(self.store, name))
        except Exception as e:
            raise self.error(e, name, "PUT") from None

    async def delete(self, name: str) -> None:
        self._check_credentials(name)
        try:
            await obstore.delete_async(self.store, name)
        except Exception as e:
            raise self.error(e, name, "DELETE") from None

    async def list_page(
        self, prefix: str, start_after: str, limit: int
    ) -> tuple[list[RemoteMeta], str | None]:
        """Up to ``limit`` objects after ``start_after`` whose names start with ``prefix``.

        The backends list by string prefix but obstore by path segments, so we
        ask for the prefix's directory and filter; they answer in name order.
        """
        self._check_credentials(None)
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else None
        page: list[RemoteMeta] = []
        try:
            stream = obstore.list(
                self.store, folder, offset=start_after or None, chunk_size=limit + 1
            )
            async for chunk in stream:
                for meta in chunk:
                    m = RemoteMeta.of(meta)
                    if m.name.startswith(prefix):
                        if m.name > start_after:  # a backend may ignore the offset
                            page.append(m)
                    elif prefix and m.name > prefix:  # past the prefix's names (sorted)
                        return _page(page, limit)
                    if len(page) > limit:
                        return _page(page, limit)
        except Exception as e:
            raise self.error(e, None, "LIST") from None
        return _page(page, limit)

    async def check_bucket(self) -> None:
        """Raise the mapped error unless the backend bucket can be listed."""
        await self.list_page("", "", 1)


def _page(page: list[RemoteMeta], limit: int) -> tuple[list[RemoteMeta], str | None]:
    page.sort(key=lambda m: m.name)
    if len(page) > limit:
        return page[:limit], page[limit - 1].name
    return page, None


def _status(reason: str) -> int | None:
    found = STATUS.search(reason)
    return int(found.group(1)) if found else None


def _reason(e: Exception) -> str:
    text = " ".join(str(e).split()).split(" Debug source:")[0]
    return text[:400]


def _any(text: str, *needles: str) -> bool:
    return any(n in text for n in needles)
