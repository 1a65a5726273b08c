"""S3 access keys: made and dropped by a token holder, kept in one file by the gateway.

A key is an access key id, a secret, a permission: ``read`` (GET, HEAD,
listings) or ``write`` (everything, reads included), and optionally the
buckets it is limited to (``auth.py`` refuses any other with a 403 naming it). They live in one JSON
file, mode 0600, replaced atomically (``core.durable.write_atomic``): by
default ``STATE_DIR/s3-keys.json`` of a local gateway (``sluice up``: the
data dir's ``etl/``), or ``--s3-keys`` / ``SLUICE_S3_KEYS``. On Kubernetes
the same JSON lives in a Secret (``kubekeys.KubeKeyStore``), shared by every
gateway replica. A gateway with neither serves the S3 API anonymously only
where reads are open, and ``/v1/s3/keys`` answers 400 saying so.

Routes (JSON, the Sluice error tree; a token holder only, like every write):

* ``POST /v1/s3/keys`` body ``{"permission": "read"|"write", "buckets": [B, ...]}``
  (default ``write``, every bucket) -> ``{"access_key", "secret_key",
  "permission", "buckets", "created"}``: the only time the secret is shown;
* ``GET /v1/s3/keys`` -> ``{"keys": [{"access_key", "permission", "buckets", "created"}]}``
  (``buckets`` null: every bucket);
* ``DELETE /v1/s3/keys/{access_key}`` -> ``{"access_key", "deleted": true}``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request

from etl_runtime.core.durable import write_atomic
from etl_runtime.core.errors import InvalidRequest, NotFound
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.gateway.context import Gateway

PERMISSIONS = ("read", "write")
KEY_PREFIX = "SLK"


class KeyStore:
    """The keys in one JSON file, re-read when the file changes (another gateway process)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, dict[str, Any]] = {}

    @property
    def enabled(self) -> bool:
        """Whether keys can be kept (else ``/v1/s3/keys`` says how to enable them)."""
        return self.path is not None

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return {}
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._keys = None, {}
            return self._keys
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._keys = json.loads(self.path.read_text()).get("keys", {})
            self._stamp = stamp
        return self._keys

    def _save(self, keys: dict[str, dict[str, Any]]) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({"keys": keys}, indent=1).encode())
        self._stamp = None

    def secret(self, access_key: str) -> str | None:
        with self._lock:
            key = self._load().get(access_key)
        return str(key["secret"]) if key else None

    def permission(self, access_key: str) -> str | None:
        with self._lock:
            key = self._load().get(access_key)
        return str(key["permission"]) if key else None

    def buckets(self, access_key: str) -> list[str] | None:
        """The buckets the key is limited to; None: every bucket."""
        with self._lock:
            key = self._load().get(access_key)
        scope = key.get("buckets") if key else None
        return [str(b) for b in scope] if isinstance(scope, list) else None

    def create(self, permission: str, buckets: list[str] | None = None) -> dict[str, Any]:
        access_key = KEY_PREFIX + base64.b32encode(secrets.token_bytes(10)).decode()[:17]
        secret = base64.b64encode(secrets.token_bytes(30)).decode()
        entry = {"secret": secret, "permission": permission, "created": time.time()}
        if buckets is not None:
            entry["buckets"] = sorted(set(buckets))
        with self._lock:
            keys = dict(self._load())
            keys[access_key] = entry
            self._save(keys)
        return {
            "access_key": access_key,
            "secret_key": secret,
            "permission": permission,
            "buckets": entry.get("buckets"),
            "created": entry["created"],
        }

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            keys = self._load()
        return [
            {
                "access_key": k,
                "permission": v["permission"],
                "buckets": v.get("buckets"),
                "created": v["created"],
            }
            for k, v in sorted(keys.items(), key=lambda kv: kv[1]["created"])
        ]

    def delete(self, access_key: str) -> bool:
        with self._lock:
            keys = dict(self._load())
            if keys.pop(access_key, None) is None:
                return False
            self._save(keys)
        return True


def key_buckets(body: dict[str, Any]) -> list[str] | None:
    """The body's ``buckets`` (a non-empty list of names), None where it has none;
    any other field is a 400 naming it."""
    unknown = sorted(set(body) - {"permission", "buckets"})
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; known: permission, buckets")
    buckets = body.get("buckets")
    if buckets is None:
        return None
    if not isinstance(buckets, list) or not buckets or not all(isinstance(b, str) for b in buckets):
        raise InvalidRequest("'buckets' must be a non-empty list of bucket names")
    for b in buckets:
        validate_bucket(b)
    return buckets


def keys_router(gw: Gateway, store: KeyStore) -> APIRouter:
    router = APIRouter()

    def usable() -> None:
        if not store.enabled:
            raise InvalidRequest(
                "this gateway keeps no S3 keys: start it with --s3-keys FILE "
                "(or SLUICE_S3_KEYS, or a --state-dir)"
            )

    @router.post("/v1/s3/keys")
    async def create_key(request: Request) -> dict[str, Any]:
        gw.require_write(request)
        usable()
        body = (
            await read_json(request, "the body of POST /v1/s3/keys") if await request.body() else {}
        )
        permission = body.get("permission", "write") if isinstance(body, dict) else None
        if permission not in PERMISSIONS:
            raise InvalidRequest(f"'permission' must be 'read' or 'write', got {permission!r}")
        buckets = key_buckets(body)
        return await anyio.to_thread.run_sync(store.create, permission, buckets)

    @router.get("/v1/s3/keys")
    async def list_keys(request: Request) -> dict[str, Any]:
        gw.require_write(request)
        usable()
        return {"keys": await anyio.to_thread.run_sync(store.listing)}

    @router.delete("/v1/s3/keys/{access_key}")
    async def delete_key(access_key: str, request: Request) -> dict[str, Any]:
        gw.require_write(request)
        usable()
        if not await anyio.to_thread.run_sync(store.delete, access_key):
            raise NotFound(f"no S3 key {access_key!r}", access_key=access_key)
        return {"access_key": access_key, "deleted": True}

    return router
