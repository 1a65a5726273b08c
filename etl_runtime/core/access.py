"""Who may do what, on the gateway and on every target: one check, ``check``.

Credentials, in ``Authorization: Bearer ...``:

* the user token (``SLUICE_TOKEN``): everything; with none configured, writes
  are open (reads likewise without ``SLUICE_READ_TOKEN``);
* the read token (``SLUICE_READ_TOKEN``): every read;
* a signed token (``core/tokens.py``, ``sluice token create``): reads, or
  reads and writes, of the buckets it names, until it expires or is revoked;
* a JWT from the configured OIDC issuer (``core/oidc.py``): the buckets its
  claim grants (``bucket:B:read|write``), or everything for the admin value;
* for object calls redirected by the gateway, the ``sluice_exp``/``sluice_sig``
  query parameters it signed with the cluster key after its own check (HTTP
  clients drop ``Authorization`` when a redirect changes the port).

Every route calls ``check`` (through ``Gateway.require_read/require_write`` or
the target's ``require_read/require_write``) with the buckets it touches — the
object's bucket, a view's source, every bucket of a GetBatch, a job's source
and destination. A call that names no bucket is cluster-wide: a signed token
may not make it (403), so a route that forgets its buckets fails closed, and
managing ETLs and tokens stays with the user token and the cluster key.
``tests/auth/test_routes.py`` walks the gateway's and a target's route tables: with
both tokens set, every route but a short allow-list (health, metrics, the API's
description, the static status page) refuses a call without a token.

401: no usable credentials (none, wrong, expired, revoked); 403 ``Forbidden``:
a valid token whose scope does not cover the call, naming the bucket.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

from fastapi import Request

from etl_runtime.core import auth, jsonbody, oidc, tokens
from etl_runtime.core.errors import Forbidden, Unauthorized

# The gateway's redirect signature; ``sluice_tid``: the access token it was checked for.
SIGNATURE_PARAMS = ("sluice_exp", "sluice_sig", "sluice_tid")
# Set by a target that redirects a read it does not own to the owner (once: see
# storage/copies.py, Placement.read_owner).
REDIRECTED_FROM = "sluice_from"
READ_HINT = "send 'Authorization: Bearer <SLUICE_READ_TOKEN or SLUICE_TOKEN or a token>'"


class InBody:
    """A route whose buckets are in its body (a job's spec): ``check`` with ``IN_BODY``
    checks the credentials now, and the route checks the buckets once it has read them."""

    def __repr__(self) -> str:
        return "IN_BODY"


IN_BODY = InBody()


class Holder(Protocol):
    """What a server knows to check a call: its secrets and the tokens' records."""

    token: str | None
    read_token: str | None
    cluster_key: str | None

    def token_records(self) -> Mapping[str, Any]: ...

    # And, where the holder knows the buckets: ``view_sources(buckets) -> list[str]``,
    # the source of each that is an ETL view, which ``check`` adds to a read's buckets.


def object_path(bucket: str, name: str) -> str:
    """The canonical path of an object call: what the gateway signs and targets check."""
    return f"/v1/objects/{bucket}/{name}"


def object_url(base: str, bucket: str, name: str) -> str:
    return f"{base.rstrip('/')}/v1/objects/{quote(bucket, safe='')}/{quote(name, safe='/')}"


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header or not header.startswith("Bearer "):
        return None
    return header[len("Bearer ") :].strip() or None


def _signed(holder: Holder, request: Request, signed_path: str | None) -> bool:
    """A redirect the gateway signed (after its check); one signed for an access token
    that was revoked since is refused."""
    if not (holder.cluster_key and signed_path is not None):
        return False
    q = request.query_params
    tid = q.get("sluice_tid")
    if not auth.verify_redirect(
        holder.cluster_key,
        request.method,
        signed_path,
        q.get("sluice_exp"),
        q.get("sluice_sig"),
        tid,
    ):
        return False
    record = holder.token_records().get(tid) if tid else None
    if isinstance(record, Mapping) and record.get("revoked"):
        raise Unauthorized(
            f"the token {tid} was revoked: ask for a new one (`sluice token create`)"
        )
    return True


def is_access_token(held: str) -> bool:
    """A signed token's or, with an OIDC issuer configured, a JWT's shape (not verified)."""
    return tokens.looks_like_token(held) or (
        oidc.looks_like_jwt(held) and oidc.issuer() is not None
    )


def _verify(holder: Holder, held: str) -> tokens.Claims | None:
    """The claims of access token ``held`` (None: none this server can check); a
    ``tokens.TokenError`` for one that does not verify. A JWT is checked against the
    issuer's cached keys: ``CredentialGate`` loaded them, where a kid was new."""
    if tokens.looks_like_token(held):
        if not holder.cluster_key:
            return None
        return tokens.verify(holder.cluster_key, held, holder.token_records())
    issuer = oidc.issuer() if oidc.looks_like_jwt(held) else None
    return issuer.verify(held) if issuer is not None else None


def _refused(e: tokens.TokenError, held: str) -> Unauthorized:
    ask = "`sluice token create`" if tokens.looks_like_token(held) else "your identity provider"
    return Unauthorized(f"{e}: ask for a new one ({ask})")


def token_id(request: Request) -> str | None:
    """The id the call's access token claims (``check`` verified it, where it ran), or
    the one its signed redirect carries: what a redirect signed for it names."""
    held = bearer(request)
    if held and tokens.looks_like_token(held):
        return tokens.claimed_id(held)
    if held and is_access_token(held):
        return None  # a JWT: no record to revoke (it lives until its exp)
    return request.query_params.get("sluice_tid")


def scoped_claims(holder: Holder, request: Request) -> tokens.Claims | None:
    """The claims of the access token the call carries (None: it carries none);
    ``Unauthorized`` for one that does not verify, has expired or was revoked."""
    held = bearer(request)
    if not held or not is_access_token(held):
        return None
    verified = request.scope.get(_VERIFIED)  # by CredentialGate, for this very call
    if verified is not None and verified[0] == held:
        return verified[1]  # type: ignore[no-any-return]
    try:
        return _verify(holder, held)
    except tokens.TokenError as e:
        raise _refused(e, held) from None


def check(
    holder: Holder,
    request: Request,
    need: str,
    buckets: Iterable[str | InBody] | None = None,
    signed_path: str | None = None,
) -> None:
    """Raise unless the call may ``need`` (``read``/``write``) ``buckets``.

    ``buckets`` None or empty: a cluster-wide call (listing every bucket,
    ETLs, tokens, keys), which a signed token may not make. ``IN_BODY``: only
    the credentials and the permission now; the caller checks the buckets later.
    """
    header = request.headers.get("authorization")
    if auth.bearer_ok(header, holder.token) and (holder.token or need == "write"):
        return  # the user token; or no user token and a write (open cluster)
    if need == "read" and auth.read_ok(header, holder.read_token, holder.token):
        return
    if _signed(holder, request, signed_path):
        return
    claims = scoped_claims(holder, request)
    if claims is None:
        if need == "read":
            raise Unauthorized(f"this call reads data: {READ_HINT}")
        raise Unauthorized()
    if isinstance(claims, oidc.OidcClaims) and claims.admin:
        return  # the configured admin value: the user token's rights
    given = list(buckets or ())
    named = tuple(b for b in given if isinstance(b, str))
    views = getattr(holder, "view_sources", None)  # reading a view reads its source too
    if need == "read" and named and callable(views):
        named += tuple(views(named))
    wanted = sorted(set(named))
    if not wanted and IN_BODY in given:
        if need == "write" and claims.permission != "write":
            raise Forbidden(f"token {claims.id} may only read", token=claims.id)
        return
    if not wanted:
        raise Forbidden(
            f"token {claims.id} is scoped to bucket(s) {', '.join(claims.buckets)}: "
            "this call is not about one bucket and needs SLUICE_TOKEN"
            + ("" if need == "write" else " or SLUICE_READ_TOKEN"),
            token=claims.id,
        )
    for bucket in wanted:
        if bucket not in claims.buckets:
            raise Forbidden(
                f"token {claims.id} may not {need} bucket {bucket!r} "
                f"(its buckets: {', '.join(claims.buckets)})",
                bucket=bucket,
                token=claims.id,
            )
        if not claims.may(need, bucket):
            raise Forbidden(
                f"token {claims.id} may only read bucket {bucket!r}, not write it",
                bucket=bucket,
                token=claims.id,
            )


class _Secrets:
    def __init__(self, token: str | None, read_token: str | None, cluster_key: str | None):
        self.token, self.read_token, self.cluster_key = token, read_token, cluster_key

    def token_records(self) -> Mapping[str, Any]:
        return {}


def require_read(
    request: Request,
    read_token: str | None,
    token: str | None,
    cluster_key: str | None,
    signed_path: str | None = None,
    *,
    buckets: Iterable[str] | None = None,
    holder: Holder | None = None,
) -> None:
    """Raise unless the caller may read ``buckets``; no-op without a read token."""
    check(holder or _Secrets(token, read_token, cluster_key), request, "read", buckets, signed_path)


def require_write(
    request: Request,
    token: str | None,
    cluster_key: str | None,
    signed_path: str | None = None,
    *,
    buckets: Iterable[str] | None = None,
    holder: Holder | None = None,
) -> None:
    """Raise unless the caller may change ``buckets``; no-op without a token."""
    check(holder or _Secrets(token, None, cluster_key), request, "write", buckets, signed_path)


def batch_buckets(request: Request, body: bytes, default: str | None) -> list[str | InBody]:
    """The buckets a GetBatch body names (each item's ``bucket``, else ``default``), for
    a call with a signed token; ``[IN_BODY]`` for any other (no need to parse it here).
    A body that names none is cluster-wide to ``check``: a signed token is refused."""
    held = bearer(request)
    if not held or not is_access_token(held):
        return [IN_BODY]
    if jsonbody.nesting_depth(body) > jsonbody.MAX_DEPTH:
        return []  # json.loads would raise RecursionError (a 500): refused, unread
    try:
        items = json.loads(body or b"{}").get("in")
    except (ValueError, AttributeError, RecursionError):
        return []  # the parser answers the 400 for an admin; a token holder is refused
    if not isinstance(items, list):
        return []
    named = [i.get("bucket") for i in items if isinstance(i, dict)]
    found = [b if isinstance(b, str) and b else default or "" for b in named]
    return [b for b in found if b]


def carries_token(request: Request) -> bool:
    """The call's bearer is an access token (which ``check`` verified, where it ran)."""
    held = bearer(request)
    return bool(held) and is_access_token(held or "")


# -- the credentials before anything else --------------------------------------------

# Paths every server answers anyone (the probes, the metrics, the API's description and
# the status page's HTML): ``tests/auth/test_routes.py`` lists why, route by route.
OPEN_PATHS = frozenset(
    {"/v1/health", "/metrics", "/ui", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
)
WRITE_METHODS = frozenset({b"PUT", b"POST", b"DELETE", b"PATCH"})
_INTERNAL = b"x-sluice-internal"  # storage/peers.py INTERNAL_HEADER, lower-cased
_SIGNED = b"sluice_sig="
_VERIFIED = "sluice.claims"  # the scope's (token, claims) the gate verified: checked once


def _send_json(status: int, body: dict[str, Any], headers: Mapping[str, str], head: bool) -> Any:
    raw = json.dumps(body, separators=(",", ":")).encode()
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    fields += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return [
        {"type": "http.response.start", "status": status, "headers": fields},
        {"type": "http.response.body", "body": b"" if head else raw},
    ]


class CredentialGate:
    """ASGI: with a user or a read token set, a call that carries no credential this
    server could accept is a 401 before its route reads anything of it.

    Routes check names, query parameters (FastAPI's own validation included) and
    bodies; before this gate some did so before ``check``, so a caller without a token
    could tell which routes and parameters exist from their 400s. Here, ahead of
    routing: a call is let through when it could be allowed at all (an open read or
    write, the user or read token, a signed token that verifies and is not revoked, a
    JWT of the OIDC issuer that verifies, a redirect's signature, the targets' internal
    header); the route then makes the full
    check, with the call's buckets (a 403 naming the bucket), before anything else.
    ``passes``: calls another check answers (the S3 API's signatures).
    """

    def __init__(self, app: Any, holder: Holder, passes: Any = None) -> None:
        self.app, self.holder, self.passes = app, holder, passes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (self.holder.token or self.holder.read_token):
            await self.load_keys(scope)
            refused = self.refusal(scope)
            if refused is not None:
                head = scope["method"] == "HEAD"
                for message in _send_json(refused.status, refused.body(), refused.headers, head):
                    await send(message)
                return
        await self.app(scope, receive, send)

    async def load_keys(self, scope: Any) -> None:
        """A JWT whose key is new (or the keys old): the issuer's keys, fetched in a thread
        (at most once per interval, ``core/oidc.py``), before ``refusal`` checks it."""
        issuer = oidc.issuer()
        if issuer is None:
            return
        for name, value in scope["headers"]:
            if name == b"authorization" and value.startswith(b"Bearer eyJ"):
                held = value[len(b"Bearer ") :].strip().decode("latin-1")
                missing, kid = issuer.missing_key(held)
                if missing:
                    await asyncio.to_thread(issuer.refresh, kid, time.monotonic())

    def refusal(self, scope: Any) -> Unauthorized | None:
        h = self.holder
        write = scope["method"].encode() in WRITE_METHODS
        if (write and not h.token) or (not write and not h.read_token):
            return None  # open to anyone: the route's own check says the rest
        if scope["path"] in OPEN_PATHS or (self.passes is not None and self.passes(scope)):
            return None
        if _SIGNED in scope.get("query_string", b""):
            return None  # a redirect's signature: checked by the route, over its path
        held = None
        for name, value in scope["headers"]:
            if name == _INTERNAL:
                return None  # checked by the internal route (core/auth.py internal_ok)
            if name == b"authorization" and value.startswith(b"Bearer "):
                held = value[len(b"Bearer ") :].strip().decode("latin-1") or None
        if held is not None:
            for known in (h.token, h.read_token):
                if known and hmac.compare_digest(held.encode(), known.encode()):
                    return None
            try:
                claims = _verify(h, held)
            except tokens.TokenError as e:
                return _refused(e, held)
            if claims is not None:
                scope[_VERIFIED] = (held, claims)
                return None
        return Unauthorized() if write else Unauthorized(f"this call reads data: {READ_HINT}")
