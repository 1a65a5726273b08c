"""``core/tokens.py`` and ``core/access.py``'s check, without servers: what a forged,
altered, expired or revoked token gets, and which credential passes which check."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from starlette.requests import Request

from etl_runtime.core import access, tokens
from etl_runtime.core.errors import Forbidden, Unauthorized

KEY = "k" * 64


class Holder:
    def __init__(self, token: str | None = "admin", read_token: str | None = "reader") -> None:
        self.token, self.read_token, self.cluster_key = token, read_token, KEY
        self.records: dict[str, dict[str, object]] = {}

    def token_records(self) -> dict[str, dict[str, object]]:
        return self.records


def request(token: str | None, method: str = "GET") -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return Request({"type": "http", "method": method, "headers": headers, "query_string": b""})


def test_a_token_verifies_with_its_claims_and_only_so() -> None:
    token, claims = tokens.mint(KEY, ["b", "a", "a"], "read", ttl=60)
    assert tokens.verify(KEY, token) == claims
    assert claims.buckets == ("a", "b") and claims.permission == "read"
    with pytest.raises(tokens.TokenError, match="signature"):
        tokens.verify("another cluster's key", token)
    payload, _, mac = token.rpartition(".")
    forged = tokens.mint(KEY, ["c"], "write")[0].rpartition(".")[0]  # another body, same mac
    with pytest.raises(tokens.TokenError, match="signature"):
        tokens.verify(KEY, f"{forged}.{mac}")
    with pytest.raises(tokens.TokenError, match="signature"):
        tokens.verify(KEY, f"{payload}.!!")
    for body in (b"not json", b'{"id": "x"}'):  # signed, but no claims: malformed
        bad = tokens.PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")
        mac = hmac.new(tokens.signing_key(KEY), bad.encode(), hashlib.sha256).digest()
        signed = f"{bad}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"
        with pytest.raises(tokens.TokenError, match="malformed"):
            tokens.verify(KEY, signed)
    with pytest.raises(tokens.TokenError, match="not a Sluice token"):
        tokens.verify(KEY, "admin")
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(KEY, token, now=claims.expires)
    with pytest.raises(tokens.TokenError, match="revoked"):
        tokens.verify(KEY, token, {claims.id: {"revoked": True}})


def test_ttls_and_permissions() -> None:
    assert [tokens.parse_ttl(t) for t in ("90", "30s", "15m", "8h", "2d")] == [
        90,
        30,
        900,
        28800,
        172800,
    ]
    for bad in ("0", "-1h", "8w", "h", "400d", ""):
        with pytest.raises(ValueError, match="ttl"):
            tokens.parse_ttl(bad)
    with pytest.raises(ValueError, match="permission"):
        tokens.mint(KEY, ["a"], "admin")
    with pytest.raises(ValueError, match="at least one bucket"):
        tokens.mint(KEY, [], "read")


def test_the_check_for_each_credential() -> None:
    h = Holder()
    reader, _ = tokens.mint(KEY, ["a"], "read")
    writer, claims = tokens.mint(KEY, ["a", "b"], "write")
    access.check(h, request("admin"), "write", None)  # the user token: everything
    access.check(h, request("reader"), "read", ["z"])  # the read token: every read
    with pytest.raises(Unauthorized):
        access.check(h, request("reader"), "write", ["a"])
    access.check(h, request(reader), "read", ["a"])
    access.check(h, request(writer), "write", ["a", "b"])
    access.check(h, request(writer), "write", [access.IN_BODY])  # buckets checked later
    with pytest.raises(Forbidden) as err:
        access.check(h, request(reader), "write", ["a"])
    assert err.value.context["bucket"] == "a"
    with pytest.raises(Forbidden) as err:
        access.check(h, request(writer), "read", ["a", "c"])
    assert err.value.context["bucket"] == "c" and "'c'" in err.value.message
    with pytest.raises(Forbidden, match="not about one bucket"):
        access.check(h, request(writer), "read", None)  # cluster-wide: fails closed
    with pytest.raises(Forbidden):
        access.check(h, request(reader), "write", [access.IN_BODY])
    for nobody in (None, "wrong"):
        with pytest.raises(Unauthorized):
            access.check(h, request(nobody), "read", ["a"])
    h.records[claims.id] = {"revoked": True}
    with pytest.raises(Unauthorized, match="revoked"):
        access.check(h, request(writer), "read", ["a"])
    # An open cluster stays open: no user token, no read token.
    access.check(Holder(None, None), request(None), "write", ["a"])
