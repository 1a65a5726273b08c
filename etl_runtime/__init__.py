"""Sluice: run Python transforms next to the data.

The public Python API is the SDK, re-exported here::

    from etl_runtime import Client

Servers (``webserver``, ``target``, ``gateway``, ``local``) are started as
processes (``sluice up``, ``python -m etl_runtime.<part>``), not imported.
The SDK is loaded on first use, so those servers (which import ``etl_runtime``
sub-modules) do not pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_runtime.sdk import (
        BadRequest,
        Bucket,
        Client,
        Conflict,
        Etl,
        EtlDetails,
        EtlError,
        EtlSummary,
        HTTPError,
        NetworkError,
        NotFound,
        Object,
        ObjectInfo,
        ObjectReader,
        ServerError,
        SluiceError,
        StreamError,
        TransformError,
        Unauthorized,
        Unavailable,
    )

__all__ = [
    "BadRequest",
    "Bucket",
    "Client",
    "Conflict",
    "Etl",
    "EtlDetails",
    "EtlError",
    "EtlSummary",
    "HTTPError",
    "NetworkError",
    "NotFound",
    "Object",
    "ObjectInfo",
    "ObjectReader",
    "ServerError",
    "SluiceError",
    "StreamError",
    "TransformError",
    "Unauthorized",
    "Unavailable",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("etl_runtime.sdk"), name)
    raise AttributeError(f"module 'etl_runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
