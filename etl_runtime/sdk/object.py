"""``Object``: one object in a bucket — put, get (optionally through an ETL), head, delete.

Reads come in two shapes: ``get_bytes()`` for small objects and ``open()`` for a
streaming, file-like ``ObjectReader`` that raises ``StreamError`` instead of
returning a silently short result when the connection breaks mid-body.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httpx

from etl_runtime.core.spec import SKIPPED_HEADER, SKIPPED_KEY_HEADER
from etl_runtime.sdk import errors
from etl_runtime.sdk.client import EtlArgs, EtlName, etl_params, quote_path
from etl_runtime.sdk.progress import byte_bar

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tqdm import tqdm

    from etl_runtime.sdk.bucket import Bucket

CHUNK = 1 << 20


def clean_etag(etag: str | None) -> str | None:
    """``W/"abc"`` / ``"abc"`` -> ``abc``, so HEAD and listing etags compare equal."""
    if etag is None:
        return None
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


@dataclass(frozen=True)
class ObjectInfo:
    """What the cluster knows about a stored object.

    In an ETL view's listing the transformed size is not known until read:
    ``size_known`` is False and ``size`` is the source object's (an estimate).
    """

    name: str
    size: int
    etag: str | None = None
    mtime: float | None = None
    size_known: bool = True
    content_type: str | None = None  # head(): as stored (None: none was given)
    metadata: dict[str, str] = field(default_factory=dict)  # head(): user metadata

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str | None = None) -> ObjectInfo:
        mtime = d.get("mtime")
        known = "size" not in d or d["size"] is not None
        size = d.get("size") if known else d.get("source_size")
        return cls(
            name=str(d.get("name") or d.get("object") or name or ""),
            size=int(size or 0),
            etag=clean_etag(d.get("etag")),
            mtime=float(mtime) if isinstance(mtime, int | float) else None,
            size_known=known,
        )


META_PREFIX = "x-sluice-meta-"


def _meta_headers(content_type: str | None, metadata: Mapping[str, str] | None) -> dict[str, str]:
    headers = {f"X-Sluice-Meta-{k}": str(v) for k, v in (metadata or {}).items()}
    if content_type:
        headers["Content-Type"] = content_type
    return headers


class Object:
    """A handle on ``bucket/name``; nothing is fetched until you call a method."""

    def __init__(self, bucket: Bucket, name: str) -> None:
        if not name:
            raise ValueError("object name must not be empty")
        self.bucket = bucket
        self.name = name

    @property
    def _path(self) -> str:
        return f"/v1/objects/{quote_path(self.bucket.name)}/{quote_path(self.name)}"

    @property
    def _context(self) -> dict[str, str | None]:
        return {"bucket": self.bucket.name, "object": self.name}

    def url(self, etl_name: EtlName = None, etl_args: EtlArgs = None) -> str:
        """A plain GET URL on the gateway (curl -L, webdataset, a browser)."""
        return self.bucket.client.url(self._path, etl_params(etl_name, etl_args))

    # -- writes ------------------------------------------------------------------

    def put_content(
        self,
        data: bytes,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Store ``data`` (atomically replacing any previous version).

        ``content_type`` and ``metadata`` (str -> str, at most 2 KiB) are stored
        with it and come back from ``head()`` (and as S3's ``x-amz-meta-*``).
        """
        headers = {"Content-Length": str(len(data)), **_meta_headers(content_type, metadata)}
        return self._put(bytes(data), headers)

    def put_file(
        self,
        path: str | os.PathLike[str],
        progress: bool = False,
        content_type: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Store a file, streamed from disk (never read into memory whole).

        ``progress=True`` shows a ``tqdm`` bar on stderr (started over on a retry);
        ``content_type`` and ``metadata`` as for ``put_content``.
        """
        path = os.fspath(path)
        size = os.path.getsize(path)
        bar = byte_bar(progress, size, f"put {self.bucket.name}/{self.name}")

        def chunks() -> Iterator[bytes]:
            if bar is not None:
                bar.reset(total=size)  # each try sends the file from its start
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
                    if bar is not None:
                        bar.update(len(chunk))

        try:
            headers = {"Content-Length": str(size), **_meta_headers(content_type, metadata)}
            return self._put(chunks, headers)
        finally:
            if bar is not None:
                bar.close()

    def _put(self, content: Any, headers: dict[str, str]) -> ObjectInfo:
        client = self.bucket.client
        with client.object_request(
            "PUT", self._path, content=content, headers=headers, context=self._context
        ) as response:
            response.read()
        try:
            return ObjectInfo.from_dict(response.json(), name=self.name)
        except ValueError:
            return ObjectInfo(self.name, int(headers["Content-Length"]), None)

    def delete(self) -> None:
        with self.bucket.client.object_request("DELETE", self._path, context=self._context) as r:
            r.read()

    # -- reads -------------------------------------------------------------------

    def head(self) -> ObjectInfo:
        with self.bucket.client.object_request("HEAD", self._path, context=self._context) as r:
            mtime = None
            if "last-modified" in r.headers:
                try:
                    mtime = parsedate_to_datetime(r.headers["last-modified"]).timestamp()
                except (TypeError, ValueError):
                    mtime = None
            ctype = r.headers.get("content-type")
            return ObjectInfo(
                name=self.name,
                size=int(r.headers.get("content-length", 0)),
                etag=clean_etag(r.headers.get("etag")),
                mtime=mtime,
                content_type=None if ctype == "application/octet-stream" else ctype,
                metadata={
                    k[len(META_PREFIX) :]: v
                    for k, v in r.headers.items()
                    if k.lower().startswith(META_PREFIX)
                },
            )

    def exists(self) -> bool:
        try:
            self.head()
        except errors.NotFound:
            return False
        return True

    def get_bytes(
        self, etl_name: EtlName = None, etl_args: EtlArgs = None, progress: bool = False
    ) -> bytes:
        """The whole object (transformed by ``etl_name`` if given) in memory."""
        with self.open(etl_name=etl_name, etl_args=etl_args, progress=progress) as reader:
            return reader.read()

    def open(
        self,
        etl_name: EtlName = None,
        etl_args: EtlArgs = None,
        progress: bool = False,
        offset: int = 0,
        etl_skip: int = 0,
    ) -> ObjectReader:
        """A streaming reader; use it as a context manager so the connection is freed.

        ``progress=True`` shows a ``tqdm`` bar on stderr as the body is read
        (without a total when the size is not known, as for most ETL output).
        ``offset``: ask for the bytes from there on (a ``Range`` GET, stored bytes
        only); ``reader.start`` says where the body begins (0 if the whole object came).
        ``etl_skip``: a wds ETL's shard without its first ``etl_skip`` samples, which
        are not transformed; ``reader.skipped`` says how many were left out and the
        key of the last of them.
        """
        etl = etl_name if isinstance(etl_name, str | None) else ",".join(etl_name)
        ctx = dict(self._context, etl=etl)
        params = etl_params(etl_name, etl_args)
        if etl_skip:
            params["etl_skip"] = str(etl_skip)
        cm = self.bucket.client.object_request(
            "GET",
            self._path,
            params=params,
            headers={"Range": f"bytes={offset}-"} if offset else None,
            context=ctx,
        )
        response = cm.__enter__()
        reader = ObjectReader(response, cm, f"{self.bucket.name}/{self.name}")
        if progress:
            via = f" via {etl}" if etl_name else ""
            reader.bar = byte_bar(True, reader.size, f"get {reader.what}{via}")
        return reader

    def __repr__(self) -> str:
        return f"Object({self.bucket.name!r}, {self.name!r})"


class ObjectReader(io.RawIOBase):
    """A read-only binary stream over one GET response.

    Raises ``StreamError`` if the connection breaks or the body ends before its
    announced ``Content-Length``: a short read is never mistaken for the end.
    """

    def __init__(
        self, response: httpx.Response, cm: AbstractContextManager[Any], what: str
    ) -> None:
        super().__init__()
        self.response = response
        self._cm = cm
        self._what = what
        self.bar: tqdm | None = None  # a progress bar, advanced as chunks arrive
        # As the socket gives them (up to 64 KiB): a chunk size makes httpx gather that
        # many bytes first (a streamed ETL answer then arrives in bursts) and copy them.
        self._chunks = response.iter_raw()
        self._pending = memoryview(b"")
        self._received = 0
        self._eof = False
        length = response.headers.get("content-length")
        self.size: int | None = int(length) if length and length.isdigit() else None
        self.etag = clean_etag(response.headers.get("etag"))
        self.start = 0  # the offset of the body's first byte in the object (a Range GET's)
        skipped = response.headers.get(SKIPPED_HEADER, "")
        # (count, key of the last) of the samples an ``etl_skip`` GET left out
        self.skipped: tuple[int, str | None] | None = None
        if skipped.isdigit():
            key = response.headers.get(SKIPPED_KEY_HEADER)
            self.skipped = (int(skipped), None if key is None else unquote(key))
        span = response.headers.get("content-range", "") if response.status_code == 206 else ""
        if span.startswith("bytes ") and "-" in span:
            first = span[6:].split("-", 1)[0]
            self.start = int(first) if first.isdigit() else 0

    @property
    def what(self) -> str:
        """``bucket/object``, as errors name it."""
        return self._what

    def readable(self) -> bool:
        return True

    def _fetch(self) -> bytes | None:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self._eof = True
            if self.size is not None and self._received < self.size:
                raise errors.StreamError(
                    f"GET {self._what}: body ended after {self._received} of {self.size} bytes"
                ) from None
            return None
        except httpx.TransportError as exc:
            raise errors.from_transport(exc, f"GET {self._what}") from exc
        self._received += len(chunk)
        if self.bar is not None:
            self.bar.update(len(chunk))
        return chunk

    def _next_chunk(self) -> bool:
        chunk = self._fetch()
        if chunk is None:
            return False
        self._pending = memoryview(chunk)
        return True

    def chunks(self) -> Iterator[bytes]:
        """The rest of the body as it arrives, in chunks (no copy into a caller's
        buffer); a short or broken body raises ``StreamError`` as ``read()`` does."""
        if self._pending:
            yield bytes(self._pending)
            self._pending = memoryview(b"")
        while not self._eof:
            chunk = self._fetch()
            if chunk is None:
                return
            yield chunk

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed ObjectReader")
        while not self._pending:
            if self._eof or not self._next_chunk():
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def readall(self) -> bytes:
        parts = [bytes(self._pending)]
        self._pending = memoryview(b"")
        while not self._eof and self._next_chunk():
            parts.append(bytes(self._pending))
            self._pending = memoryview(b"")
        return b"".join(parts)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes, fewer only at the end of the body: a file's ``read`` (the
        body arrives in chunks of any size; ``tarfile`` and friends count on it)."""
        if size is None or size < 0:
            return self.readall()
        out = bytearray(size)
        view, got = memoryview(out), 0
        while got < size and (n := self.readinto(view[got:])):
            got += n
        view.release()
        del out[got:]
        return bytes(out)

    def close(self) -> None:
        if not self.closed:
            try:
                self._cm.__exit__(None, None, None)
            finally:
                if self.bar is not None:
                    self.bar.close()
                super().close()

    def __enter__(self) -> ObjectReader:
        return self
