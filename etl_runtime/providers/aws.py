"""``S3Backend``: the S3 calls of one remote bucket, through obstore.

obstore (Rust ``object_store`` under a thin Python layer) was chosen over
boto3/aiobotocore by ``bench/remote.py`` (figures in docs/remote.md): it is
async on any asyncio loop (uvloop included), streams a GET in chunks we pick,
and spends a fraction of the CPU per MiB. Every obstore exception is mapped
here to one Sluice error (``etl_runtime.core.errors``) whose message names the bucket, the
object and the backend; nothing else in Sluice sees obstore's exceptions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import obstore
from obstore import exceptions as obx
from obstore.store import S3Store

from etl_runtime.core.errors import (
    BackendError,
    BackendForbidden,
    BackendUnauthorized,
    BackendUnavailable,
    ObjectNotFound,
    SluiceError,
)
from etl_runtime.providers.backend import RemoteMeta
from etl_runtime.providers.props import S3Settings, resolve

STREAM_CHUNK = 1 << 20  # small enough that the first byte does not wait for much
CONNECT_TIMEOUT = "3s"
REQUEST_TIMEOUT = "600s"  # a whole GET of a big shard; reads stall-check below
RETRIES = 2
RETRY_TIMEOUT = dt.timedelta(seconds=6)
# obstore raises Python's FileNotFoundError for a missing object (and NotFoundError
# in some versions).
NOT_FOUND = (obx.NotFoundError, FileNotFoundError)


class S3Backend:
    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self.where = settings.where
        config: dict[str, Any] = {"region": settings.region}
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
        if settings.anonymous:
            config["skip_signature"] = True
        elif settings.access_key_id and settings.secret_access_key:
            config["access_key_id"] = settings.access_key_id
            config["secret_access_key"] = settings.secret_access_key
            if settings.session_token:
                config["session_token"] = settings.session_token
        self._has_credentials = bool(
            settings.anonymous or "access_key_id" in config or _ambient_credentials()
        )
        self.store = S3Store(
            settings.bucket,
            config=config,  # type: ignore[arg-type]
            client_options={
                "allow_http": bool(settings.endpoint and settings.endpoint.startswith("http:")),
                "connect_timeout": CONNECT_TIMEOUT,
                "timeout": REQUEST_TIMEOUT,
            },
            retry_config={"max_retries": RETRIES, "retry_timeout": RETRY_TIMEOUT},
        )

    @classmethod
    def for_bucket(
        cls, bucket: str, backend: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> S3Backend:
        return cls(resolve(bucket, backend, env))

    # -- errors ----------------------------------------------------------------------

    def _check_credentials(self, name: str | None) -> None:
        if not self._has_credentials:
            raise BackendUnauthorized(
                f"no credentials for aws://{self.bucket} on backend {self.where}: set "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) on the targets, or "
                "the bucket's 'secret' prop",
                bucket=self.bucket,
                object=name,
                backend=self.where,
            )

    def error(self, e: Exception, name: str | None, op: str) -> SluiceError:
        """The Sluice error for obstore's ``e`` during ``op`` of ``name`` (or the bucket)."""
        what = f"aws://{self.bucket}/{name}" if name else f"aws://{self.bucket}"
        reason = _reason(e)
        ctx: dict[str, Any] = {"bucket": self.bucket, "object": name, "backend": self.where}
        if isinstance(e, NOT_FOUND) or "NoSuchBucket" in reason:
            if "NoSuchBucket" in reason:
                return ObjectNotFound(
                    f"backend {self.where} has no bucket {self.bucket!r} ({op} {what})", **ctx
                )
            return ObjectNotFound(f"object {what} does not exist on backend {self.where}", **ctx)
        if isinstance(e, obx.UnauthenticatedError) or _any(
            reason, "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"
        ):
            return BackendUnauthorized(
                f"backend {self.where} rejected the credentials ({self.settings.credentials_from})"
                f" for {op} {what}: {reason}",
                **ctx,
            )
        if isinstance(e, obx.PermissionDeniedError | PermissionError) or "AccessDenied" in reason:
            return BackendForbidden(
                f"backend {self.where} denied {op} {what} with the credentials from "
                f"{self.settings.credentials_from}: {reason}",
                **ctx,
            )
        if _any(reason, *UNREACHABLE) or ("Server returned" in reason and " 50" in reason):
            return BackendUnavailable(
                f"backend {self.where} of aws://{self.bucket} is not reachable ({op} {what}): "
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
        return meta, self._chunks(result.stream(min_chunk_size=STREAM_CHUNK), name)

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

        S3 lists by string prefix but obstore by path segments, so we ask for the
        prefix's directory and filter; S3 answers in name order.
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
                    if m.name.startswith(prefix) and m.name > start_after:
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


UNREACHABLE = ("error sending request", "connect", "timed out", "Timeout", "dns", "refused")


def _reason(e: Exception) -> str:
    text = " ".join(str(e).split()).split(" Debug source:")[0]
    return text[:400]


def _any(text: str, *needles: str) -> bool:
    return any(n in text for n in needles)


def _ambient_credentials() -> bool:
    """Credentials obstore finds itself (web identity on EKS, container credentials)."""
    import os

    return any(
        os.environ.get(k)
        for k in (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    )


BACKEND = S3Backend  # what etl_runtime.providers.backend.backend_class('aws') finds
