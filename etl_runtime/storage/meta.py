"""An object's metadata on disk: its content type and user metadata, beside its bytes.

Kept as JSON in one extended attribute of the object's file (``META_XATTR``),
set on the temp file before it is renamed into place (``store.write_object``),
so a reader sees one version's bytes and metadata, never a mix. Shape:
``{"content-type": str, "meta": {key: value}}``, each part absent when not
given. User metadata is bounded as in S3 (``META_MAX``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from etl_runtime.core.errors import InvalidRequest

META_XATTR = "user.sluice.meta"
META_MAX = 2048  # bytes of user metadata per object (keys and values), as S3 allows


def check_meta(meta: Mapping[str, Any] | None, bucket: str, name: str) -> dict[str, Any]:
    """An object's metadata as stored: a ``content-type`` and user ``meta`` (str -> str).

    User metadata is at most ``META_MAX`` bytes (keys and values, as S3 counts
    it); more is a 400 naming the object, never silently cut.
    """
    if not meta:
        return {}
    out: dict[str, Any] = {}
    ctype = meta.get("content-type")
    if ctype:
        out["content-type"] = str(ctype)
    user = {str(k).lower(): str(v) for k, v in (meta.get("meta") or {}).items()}
    if sum(len(k) + len(v) for k, v in user.items()) > META_MAX:
        raise InvalidRequest(
            f"user metadata of {bucket}/{name} is over {META_MAX} bytes", bucket=bucket, object=name
        )
    if user:
        out["meta"] = dict(sorted(user.items()))
    return out


def read_meta(fd: int | str | Path) -> dict[str, Any]:
    """The metadata stored beside an object (an extended attribute), or {}."""
    try:
        raw = os.getxattr(fd, META_XATTR)
    except OSError:
        return {}
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def encode_meta(meta: Mapping[str, Any]) -> bytes:
    return json.dumps(meta).encode()
