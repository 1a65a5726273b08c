"""Target-to-target calls: write-through copies, rebalance moves, get-from-neighbor.

Targets reach each other at the addresses the cluster map records
(``ClusterMap.urls``) on the internal ``/v1/_replica/{bucket}/{object}``
routes (``etl_runtime.storage_target.internal``). They authenticate with a token
derived from the cluster key (``auth.internal_token``), which users never hold.
Bodies are streamed from the file (a copy never sits in memory whole).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.core import auth, tls
from etl_runtime.storage import integrity
from etl_runtime.storage.meta import read_meta
from etl_runtime.storage.store import READ_CHUNK

INTERNAL_HEADER = "X-Sluice-Internal"
META_HEADER = "X-Sluice-Meta"  # an object's stored metadata (JSON) travels with its copies
PEER_TIMEOUT = httpx.Timeout(30.0, connect=3.0)


class PeerError(Exception):
    """A peer target could not be reached or refused a call; ``target`` names it.

    ``status`` is the peer's HTTP status when it answered (None if unreachable).
    """

    def __init__(self, target: str, message: str, status: int | None = None) -> None:
        super().__init__(f"target {target!r}: {message}")
        self.target = target
        self.status = status


def replica_path(bucket: str, name: str) -> str:
    return f"/v1/_replica/{quote(bucket, safe='')}/{quote(name, safe='/')}"


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(READ_CHUNK):
            yield chunk


class Peers:
    def __init__(self, self_id: str, cmap: ClusterMapStore, cluster_key: str | None) -> None:
        self.self_id = self_id
        self.cmap = cmap
        self.headers = {INTERNAL_HEADER: auth.internal_token(cluster_key)} if cluster_key else {}
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                trust_env=False,
                verify=tls.client_context(),  # SLUICE_CA (core/tls.py)
                timeout=PEER_TIMEOUT,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def url(self, target: str) -> str:
        url = self.cmap.get().urls.get(target)
        if not url:
            raise PeerError(target, "no address in the cluster map")
        return url.rstrip("/")

    async def _call(self, target: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        try:
            return await self.http.request(method, self.url(target) + path, headers=headers, **kw)
        except httpx.HTTPError as e:
            raise PeerError(target, f"not reachable ({e!r})") from None

    async def has(self, target: str, bucket: str, name: str) -> bool:
        r = await self._call(target, "HEAD", replica_path(bucket, name))
        if r.status_code == 200:
            return True
        if r.status_code == 404:
            return False
        raise PeerError(target, f"HEAD {bucket}/{name} answered {r.status_code}")

    async def send(
        self, target: str, bucket: str, name: str, path: Path, etag: str, if_absent: bool
    ) -> bool:
        """Copy the file at ``path`` to ``target`` as ``bucket/name``; False if it kept its own."""
        params = {"if_absent": "1"} if if_absent else {}
        headers = {"X-Sluice-Etag": etag}
        if (cs := integrity.stored(path)) is not None:  # checked there before it is published
            headers[integrity.XXH_HEADER] = cs.value
        if meta := read_meta(path):
            headers[META_HEADER] = json.dumps(meta)
        r = await self._call(
            target,
            "PUT",
            replica_path(bucket, name),
            params=params,
            content=_file_chunks(path),
            headers=headers,
        )
        if r.status_code != 200:
            raise PeerError(
                target, f"PUT {bucket}/{name} answered {r.status_code}: {r.text}", r.status_code
            )
        return bool(r.json().get("stored"))

    async def delete(self, target: str, bucket: str, name: str) -> bool:
        r = await self._call(target, "DELETE", replica_path(bucket, name))
        if r.status_code != 200:
            raise PeerError(target, f"DELETE {bucket}/{name} answered {r.status_code}")
        return bool(r.json().get("deleted"))

    async def fetch(
        self, target: str, bucket: str, name: str
    ) -> tuple[AsyncIterator[bytes], dict[str, Any]] | None:
        """The object's bytes and metadata as ``target`` holds them, or None if it has none."""
        try:
            req = self.http.build_request(
                "GET", self.url(target) + replica_path(bucket, name), headers=self.headers
            )
            r = await self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise PeerError(target, f"not reachable ({e!r})") from None
        if r.status_code == 404:
            await r.aclose()
            return None
        if r.status_code != 200:
            await r.aclose()
            raise PeerError(target, f"GET {bucket}/{name} answered {r.status_code}", r.status_code)
        expected = r.headers.get("etag", "").strip('"')
        cs = integrity.parse(r.headers.get(integrity.XXH_HEADER))
        try:
            meta = json.loads(r.headers.get(META_HEADER) or "{}")
        except ValueError:
            meta = {}

        async def body() -> AsyncIterator[bytes]:
            md5, xxh, size = hashlib.md5(), integrity.new_hash(), 0
            try:
                async for chunk in r.aiter_raw():
                    md5.update(chunk)
                    xxh.update(chunk)
                    size += len(chunk)
                    yield chunk
            except httpx.HTTPError as e:
                raise PeerError(target, f"GET {bucket}/{name} broke off ({e!r})") from None
            finally:
                await r.aclose()
            if expected and md5.hexdigest() != expected:
                raise PeerError(target, f"GET {bucket}/{name}: content does not match its ETag")
            if cs is not None and (xxh.hexdigest(), size) != (cs.digest, cs.size):
                raise PeerError(target, f"GET {bucket}/{name}: content does not match its checksum")

        return body(), meta if isinstance(meta, dict) else {}
