"""Bearer JWTs from a configured OIDC issuer, checked by every server without a round trip.

``core/access.py`` calls ``issuer()`` (the process's configuration, read once from
the environment that ``sluice up`` and the chart set) and ``Issuer.verify``:

* ``SLUICE_OIDC_ISSUER``: the issuer URL, exactly as tokens' ``iss`` says it;
* ``SLUICE_OIDC_AUDIENCE``: what ``aud`` must hold (required: a token minted
  for another application of the same issuer is refused);
* ``SLUICE_OIDC_JWKS``: a local JWKS file (air-gapped clusters); unset, the keys
  come from the issuer's ``/.well-known/openid-configuration`` -> ``jwks_uri``
  (HTTPS, or HTTP to a loopback address only; ``SLUICE_OIDC_CA`` a CA bundle);
* ``SLUICE_OIDC_CLAIM`` (default ``scope``): the claim, a dotted path
  (``realm_access.roles``), whose values grant Sluice permissions: a string of
  space-separated values or a list; ``bucket:B:read`` and ``bucket:B:write``
  (write includes read), the rest ignored;
* ``SLUICE_OIDC_ADMIN``: a value of that claim that means the user token's
  rights (unset: no JWT is an admin);
* ``SLUICE_OIDC_REFRESH`` (default 30): seconds between two loads of the keys.

Keys are cached: a token with an unknown ``kid`` (or keys older than
``MAX_AGE_SECONDS``) fetches them again, at most once per ``SLUICE_OIDC_REFRESH`` seconds;
a fetch that fails keeps the last good keys. Only asymmetric algorithms are
accepted, each with a key of its own type (``alg: none`` and an HMAC "signed"
with the public key are refused). ``verify`` never fetches (it may run on the
event loop); ``CredentialGate`` awaits ``refresh`` in a thread first.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from etl_runtime.core.tokens import Claims, TokenError

if TYPE_CHECKING:  # PyJWT (and cryptography under it) only where an issuer is configured
    import jwt

log = logging.getLogger("sluice.oidc")

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
LEEWAY_SECONDS = 30  # clock skew between the issuer and the servers
REFRESH_SECONDS = 30.0  # the most often an unknown kid fetches the keys again
MAX_AGE_SECONDS = 3600.0  # keys this old are fetched again (a key dropped from the JWKS goes)
FETCH_TIMEOUT = 5.0
PREFIX = "bucket:"
_FAMILY = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}  # alg -> the JWK kty it takes
ENV = ("SLUICE_OIDC_ISSUER", "SLUICE_OIDC_AUDIENCE", "SLUICE_OIDC_JWKS")


@dataclass(frozen=True)
class OidcClaims(Claims):
    """A JWT's grants: per bucket (``writable`` among ``buckets``), or ``admin``."""

    writable: tuple[str, ...] = ()
    admin: bool = False

    def may(self, need: str, bucket: str) -> bool:
        return bucket in self.buckets and (need == "read" or bucket in self.writable)


def looks_like_jwt(value: str) -> bool:
    """A compact JWS: three base64url parts, the header a JSON object (``eyJ`` = ``{"``)."""
    return value.startswith("eyJ") and value.count(".") == 2


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Issuer:
    def __init__(
        self,
        issuer: str,
        audience: str,
        jwks_file: str | None = None,
        claim: str = "scope",
        admin: str | None = None,
        ca: str | None = None,
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        # A configuration that cannot work refuses every JWT (fail closed), saying why.
        self.problem: str | None = None
        if not audience:
            self.problem = "SLUICE_OIDC_AUDIENCE is required with SLUICE_OIDC_ISSUER"
        elif not jwks_file and not (issuer.startswith("https://") or _loopback(issuer)):
            self.problem = f"OIDC issuer {issuer!r}: use https:// (http only on loopback)"
        self.issuer, self.audience, self.jwks_file = issuer, audience, jwks_file
        self.claim, self.admin, self.ca, self.every = claim, admin, ca, refresh
        self.keys: dict[str | None, Mapping[str, Any]] = {}  # kid -> its JWK
        self._parsed: dict[tuple[str | None, str], jwt.PyJWK] = {}  # (kid, alg) -> key
        self.fetched = 0.0  # when the keys were last loaded
        self.tried = 0.0  # when a load was last tried
        self._lock = threading.Lock()

    # -- the keys ----------------------------------------------------------------

    def _jwks(self) -> Mapping[str, Any]:
        if self.jwks_file:
            return json.loads(Path(self.jwks_file).read_text())  # type: ignore[no-any-return]
        verify: Any = self.ca or True
        with httpx.Client(timeout=FETCH_TIMEOUT, verify=verify, trust_env=False) as http:
            conf = http.get(f"{self.issuer.rstrip('/')}/.well-known/openid-configuration")
            conf.raise_for_status()
            doc = conf.json()
            if doc.get("issuer") != self.issuer:
                raise ValueError(f"the discovery document names issuer {doc.get('issuer')!r}")
            uri = str(doc["jwks_uri"])
            if not (uri.startswith("https://") or _loopback(uri)):
                raise ValueError(f"jwks_uri {uri!r} is not https://")
            got = http.get(uri)
            got.raise_for_status()
            return got.json()  # type: ignore[no-any-return]

    def refresh(self, kid: str | None = None, asked: float | None = None) -> None:
        """Load the keys again unless they hold ``kid`` already, were loaded since
        ``asked`` or were tried within ``REFRESH_SECONDS``; a failure keeps the old ones."""
        import jwt

        asked = asked if asked is not None else time.monotonic()
        if self.problem:
            return
        with self._lock:
            if self.fetched >= asked or (kid in self.keys and not self.stale()):
                return
            if self.tried and time.monotonic() - self.tried < self.every:
                return
            self.tried = time.monotonic()
            try:
                found: dict[str | None, Mapping[str, Any]] = {}
                for entry in self._jwks().get("keys", []):
                    if entry.get("use", "sig") != "sig" or entry.get("kty") not in _FAMILY.values():
                        continue  # never a symmetric ("oct") key: a JWKS is public
                    try:
                        jwt.PyJWK(entry)
                    except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError, KeyError):
                        continue  # a key type or curve we do not take, or a broken one
                    found[entry.get("kid")] = entry
            except (OSError, ValueError, KeyError, TypeError, AttributeError, httpx.HTTPError) as e:
                log.warning(
                    "OIDC keys of %s not loaded (keeping the last good ones): %s", self.issuer, e
                )
                return
            self.keys, self._parsed, self.fetched = found, {}, time.monotonic()

    def stale(self) -> bool:
        return not self.fetched or time.monotonic() - self.fetched > MAX_AGE_SECONDS

    def missing_key(self, token: str) -> tuple[bool, str | None]:
        """Whether the keys should be loaded before ``token`` is checked, and its ``kid``."""
        import jwt

        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            return False, None
        if kid is not None and not isinstance(kid, str):
            return False, None  # refused by ``verify``
        unknown = kid not in self.keys and not (kid is None and len(self.keys) == 1)
        return unknown or self.stale(), kid

    # -- the token -----------------------------------------------------------------

    def verify(self, token: str) -> OidcClaims:
        """The grants of a JWT that verifies; ``TokenError`` (a 401) otherwise."""
        import jwt

        if self.problem:
            raise TokenError(f"this server's OIDC setting is wrong: {self.problem}")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenError("the bearer token is not a well-formed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise TokenError("the JWT's kid is not a string")
        if alg not in ALGORITHMS:
            raise TokenError(
                f"the JWT's algorithm {alg!r} is not accepted (only {', '.join(ALGORITHMS)})"
            )
        key = self._key(kid, alg)
        try:
            body = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenError("the JWT has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenError("the JWT is not valid yet (nbf/iat)") from None
        except jwt.InvalidAudienceError:
            raise TokenError(f"the JWT is not for audience {self.audience!r}") from None
        except jwt.InvalidIssuerError:
            raise TokenError(f"the JWT is not from issuer {self.issuer!r}") from None
        except jwt.PyJWTError as e:
            raise TokenError(f"the JWT does not verify ({e})") from None
        return self.grants(body)

    def _key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The key ``kid`` as one of ``alg``, which must be its family's (and its ``alg``
        where the JWK names one): an RSA key never checks an ES256 or HS256 token."""
        import jwt

        if kid is None and len(self.keys) == 1:
            kid = next(iter(self.keys))
        entry = self.keys.get(kid)
        if entry is None:
            raise TokenError(f"the JWT's key {kid!r} is not among {self.issuer}'s keys")
        if entry.get("kty") != _FAMILY[alg[:2]] or entry.get("alg", alg) != alg:
            raise TokenError(f"the JWT's algorithm {alg!r} does not match its key {kid!r}")
        parsed = self._parsed.get((kid, alg))
        if parsed is None:
            try:
                parsed = self._parsed[(kid, alg)] = jwt.PyJWK(dict(entry), algorithm=alg)
            except jwt.PyJWKError:
                raise TokenError(f"the key {kid!r} does not take {alg!r}") from None
        return parsed

    def grants(self, body: Mapping[str, Any]) -> OidcClaims:
        value: Any = body
        for part in self.claim.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        values = (
            value.split() if isinstance(value, str) else value if isinstance(value, list) else []
        )
        read: set[str] = set()
        write: set[str] = set()
        for v in (v for v in values if isinstance(v, str)):
            bucket, _, permission = v.removeprefix(PREFIX).rpartition(":")
            if v.startswith(PREFIX) and bucket and permission in ("read", "write"):
                (write if permission == "write" else read).add(bucket)
        admin = bool(self.admin) and self.admin in values
        return OidcClaims(
            id=f"oidc:{body.get('sub') or body.get('jti') or '?'}",
            buckets=tuple(sorted(read | write)),
            permission="write" if write or admin else "read",
            expires=int(body["exp"]),
            writable=tuple(sorted(write)),
            admin=admin,
        )


_configured: list[Issuer | None] = []


def from_env(env: Mapping[str, str] = os.environ) -> Issuer | None:
    url = env.get("SLUICE_OIDC_ISSUER")
    if not url:
        return None
    return Issuer(
        url,
        env.get("SLUICE_OIDC_AUDIENCE", ""),
        jwks_file=env.get("SLUICE_OIDC_JWKS") or None,
        claim=env.get("SLUICE_OIDC_CLAIM") or "scope",
        admin=env.get("SLUICE_OIDC_ADMIN") or None,
        ca=env.get("SLUICE_OIDC_CA") or None,
        refresh=float(env.get("SLUICE_OIDC_REFRESH") or REFRESH_SECONDS),
    )


def issuer() -> Issuer | None:
    """This process's issuer (from its environment, once), or None."""
    if not _configured:
        found = from_env()
        if found is not None and found.problem:
            log.error("every OIDC token will be refused: %s", found.problem)
        _configured.append(found)
    return _configured[0]


# -- sluice up's flags (``local/up.py``): what it hands every server as SLUICE_OIDC_* --


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--oidc-issuer",
        default=os.environ.get("SLUICE_OIDC_ISSUER"),
        metavar="URL",
        help="every server also takes a bearer JWT of this OIDC issuer, for the buckets its "
        "claim grants (bucket:B:read|write; docs/security.md, 'OIDC')",
    )
    p.add_argument(
        "--oidc-audience",
        default=os.environ.get("SLUICE_OIDC_AUDIENCE"),
        metavar="AUD",
        help="with --oidc-issuer: what the tokens' aud must hold",
    )
    p.add_argument(
        "--oidc-jwks",
        default=os.environ.get("SLUICE_OIDC_JWKS"),
        metavar="FILE",
        help="with --oidc-issuer: the issuer's keys from this JWKS file, not its discovery URL",
    )


def flags_problem(args: argparse.Namespace) -> str | None:
    """Why the flags cannot work (None: they can); makes ``--oidc-jwks`` absolute."""
    if (args.oidc_audience or args.oidc_jwks) and not args.oidc_issuer:
        return "--oidc-audience and --oidc-jwks go with --oidc-issuer"
    if not args.oidc_issuer:
        return None
    if not args.oidc_audience:
        return "--oidc-issuer needs --oidc-audience (what the tokens' aud must hold)"
    if not (args.token or args.read_token):
        return "--oidc-issuer narrows what --token/--read-token close: give one or both"
    if args.oidc_jwks:
        args.oidc_jwks = str(Path(args.oidc_jwks).resolve())
    return Issuer(args.oidc_issuer, args.oidc_audience, args.oidc_jwks).problem


def put_env(env: dict[str, str], args: argparse.Namespace) -> None:
    for name, value in zip(
        ENV, (args.oidc_issuer, args.oidc_audience, args.oidc_jwks), strict=True
    ):
        env.pop(name, None)
        if value:
            env[name] = value
