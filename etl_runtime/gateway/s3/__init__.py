"""The S3 API of the gateway (issue 22): path-style under ``/s3``, SigV4, multipart.

``s3_router(gw, keys)`` is mounted by ``gateway/app.py``; modules:
``routes`` (which call a request is; buckets, listings, DeleteObjects),
``objects`` (the object data path, proxied to the owner: why, in its
docstring), ``multipart``, ``auth`` and ``sigv4`` (who may call),
``keys`` (the S3 keys and ``/v1/s3/keys``), ``xml`` and ``errors``.
See docs/s3-api.md.
"""

from __future__ import annotations

from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3.keys import KeyStore, keys_router
from etl_runtime.gateway.s3.routes import s3_router as _routes
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.fastpath import FastRouter

__all__ = ["KeyStore", "s3_router"]


def s3_router(gw: Gateway, keys: KeyStore, duplex: DuplexClient | None = None) -> FastRouter:
    """The S3 routes under ``/s3`` and the key routes under ``/v1/s3/keys``."""
    router = FastRouter()
    router.include_router(keys_router(gw, keys))
    router.include_router(_routes(gw, keys, duplex))
    return router
