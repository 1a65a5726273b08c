"""Signed access tokens scoped to buckets, checked by every server without a round trip.

A token is ``sluice1.<claims>.<mac>``: ``claims`` is compact JSON (base64url)
of ``{"id", "b": [bucket, ...], "p": "read"|"write", "exp": unix seconds}``
and ``mac`` the HMAC-SHA256 of ``sluice1.<claims>`` under the signing key,
itself an HMAC of the cluster key (``signing_key``): every gateway and target
already holds the cluster key, so each verifies a token by itself.

``write`` includes ``read``. A token never manages ETLs or tokens: that stays
with the user token (``SLUICE_TOKEN``) and the cluster key.

Revocation: the gateway keeps each token's record (id, buckets, permission,
expiry, ``revoked``) in the cluster map's ``tokens``, the shared state every
server already watches (a file stat per read locally, a watch on Kubernetes);
a server refuses a token whose record says ``revoked``. Records are dropped
once their token has expired (an expired token is refused on its own).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "sluice1."
PERMISSIONS = ("read", "write")
MAX_TTL_SECONDS = 366 * 24 * 3600
DEFAULT_TTL_SECONDS = 8 * 3600
_TTL = re.compile(r"^(\d+)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class TokenError(ValueError):
    """A token that does not verify: ``reason`` says why, in words for the 401."""


@dataclass(frozen=True)
class Claims:
    id: str
    buckets: tuple[str, ...]
    permission: str
    expires: int

    def may(self, need: str, bucket: str) -> bool:
        if bucket not in self.buckets:
            return False
        return need == "read" or self.permission == "write"

    def record(self, created: float | None = None) -> dict[str, Any]:
        """What the cluster map keeps of the token (never the token itself)."""
        return {
            "buckets": list(self.buckets),
            "permission": self.permission,
            "expires": self.expires,
            "created": created if created is not None else time.time(),
            "revoked": False,
        }


def signing_key(cluster_key: str) -> bytes:
    return hmac.new(cluster_key.encode(), b"sluice-token-signing", hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_ttl(text: str) -> int:
    """``8h``, ``30m``, ``2d``, ``90`` (seconds) -> seconds; ValueError naming the rule."""
    m = _TTL.match(text.strip())
    seconds = int(m.group(1)) * _UNITS[m.group(2)] if m else 0
    if not m or seconds <= 0 or seconds > MAX_TTL_SECONDS:
        raise ValueError(
            f"ttl {text!r}: give a positive number of seconds or Ns/Nm/Nh/Nd, at most 366d"
        )
    return seconds


def mint(
    cluster_key: str,
    buckets: Iterable[str],
    permission: str,
    ttl: int = DEFAULT_TTL_SECONDS,
    now: float | None = None,
) -> tuple[str, Claims]:
    """A new token and its claims."""
    if permission not in PERMISSIONS:
        raise ValueError(f"permission must be 'read' or 'write', got {permission!r}")
    scope = tuple(sorted(set(buckets)))
    if not scope:
        raise ValueError("a token names at least one bucket")
    claims = Claims(
        id=secrets.token_hex(8),
        buckets=scope,
        permission=permission,
        expires=int((now if now is not None else time.time()) + ttl),
    )
    body = {"id": claims.id, "b": list(scope), "p": permission, "exp": claims.expires}
    payload = PREFIX + _b64(json.dumps(body, separators=(",", ":")).encode())
    mac = hmac.new(signing_key(cluster_key), payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}", claims


def looks_like_token(value: str) -> bool:
    return value.startswith(PREFIX)


def verify(
    cluster_key: str,
    token: str,
    records: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> Claims:
    """The claims of a token that verifies, is not expired and not revoked; else TokenError."""
    payload, _, mac = token.rpartition(".")
    if not payload.startswith(PREFIX) or not mac:
        raise TokenError("not a Sluice token")
    expected = hmac.new(signing_key(cluster_key), payload.encode(), hashlib.sha256).digest()
    try:
        given = _unb64(mac)
    except (binascii.Error, ValueError):
        given = b""
    if not hmac.compare_digest(expected, given):  # before reading anything of the claims
        raise TokenError("the token's signature does not verify (another cluster's token?)")
    try:
        body = json.loads(_unb64(payload[len(PREFIX) :]))
        claims = Claims(
            id=str(body["id"]),
            buckets=tuple(str(b) for b in body["b"]),
            permission=str(body["p"]),
            expires=int(body["exp"]),
        )
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise TokenError("the token is malformed") from None
    if claims.expires <= (now if now is not None else time.time()):
        raise TokenError(f"the token {claims.id} has expired")
    record = (records or {}).get(claims.id)
    if isinstance(record, Mapping) and record.get("revoked"):
        raise TokenError(f"the token {claims.id} was revoked")
    return claims


def claimed_id(token: str) -> str | None:
    """The id in a token's claims, unverified (for a token ``verify`` passed already)."""
    try:
        body = json.loads(_unb64(token.rpartition(".")[0][len(PREFIX) :]))
        return str(body["id"]) if isinstance(body, dict) and "id" in body else None
    except (binascii.Error, ValueError):
        return None


def pruned(records: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """The records whose token has not expired yet (the rest need no revocation)."""
    at = now if now is not None else time.time()
    return {k: v for k, v in records.items() if int(v.get("expires", 0)) > at}
