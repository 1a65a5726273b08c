"""An object's content type and user metadata on the wire of the native API.

A PUT keeps ``Content-Type`` and every ``X-Sluice-Meta-<key>: <value>`` header
(keys lower-cased, at most 2 KiB in all: ``store.check_meta``); a GET or HEAD
answers them the same way (``Content-Type: application/octet-stream`` when
none was given). The S3 API maps ``x-amz-meta-*`` to these. Values must be
ASCII header text; a client that needs more encodes it itself, as with S3.
Targets pass them to each other in one ``X-Sluice-Meta`` header (the stored
JSON) so copies and moved objects keep them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from etl_runtime.core.errors import InvalidRequest
from etl_runtime.storage.meta import check_meta
from etl_runtime.storage.peers import META_HEADER

PREFIX = "x-sluice-meta-"
INTERNAL = META_HEADER  # the stored JSON, between targets


def meta_of_headers(headers: Mapping[str, str], bucket: str, name: str) -> dict[str, Any]:
    """The metadata a PUT's headers give (``check_meta`` refuses too much of it)."""
    user = {k[len(PREFIX) :]: v for k, v in headers.items() if k.lower().startswith(PREFIX)}
    if any(not k for k in user):
        raise InvalidRequest(f"{PREFIX}<key> needs a key, for {bucket}/{name}", bucket=bucket)
    ctype = headers.get("content-type")
    return check_meta({"content-type": ctype, "meta": user}, bucket, name)


def meta_headers(meta: Mapping[str, Any]) -> dict[str, str]:
    """The headers of a GET/HEAD answer for stored metadata."""
    out = {"Content-Type": str(meta.get("content-type") or "application/octet-stream")}
    for key, value in (meta.get("meta") or {}).items():
        out[f"X-Sluice-Meta-{key}"] = str(value)
    return out


def internal_meta(raw: str | None) -> dict[str, Any] | None:
    """The metadata a peer sent with a copy (``X-Sluice-Meta``), or None."""
    if not raw:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        raise InvalidRequest(f"{INTERNAL}: not JSON") from None
    return found if isinstance(found, dict) else None
