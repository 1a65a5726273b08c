"""AWS Signature Version 4, verified: the header form and the presigned-URL form.

What S3 clients sign (AWS "Signature Version 4 signing process", S3 flavour):

* the canonical request: method, the path exactly as sent (S3 does not
  normalise or double-encode it, so it is the raw path of the request line,
  ``/s3`` prefix included), the query sorted by name and value with each part
  URI-encoded, the signed headers (lower-case name, values trimmed, runs of
  spaces collapsed), the list of signed header names, and the payload hash
  (``x-amz-content-sha256``: a hex SHA-256, or ``UNSIGNED-PAYLOAD``; always
  ``UNSIGNED-PAYLOAD`` for a presigned URL);
* the string to sign: ``AWS4-HMAC-SHA256``, the request time, the credential
  scope ``DATE/REGION/s3/aws4_request`` and the SHA-256 of the canonical request;
* the key: ``HMAC("AWS4" + secret, DATE)``, then region, service,
  ``aws4_request``; the signature is the hex HMAC of the string to sign.

Any region is accepted (the client's choice is part of what it signed); the
service must be ``s3``. A header-signed request more than 15 minutes from the
gateway's clock is refused (``RequestTimeTooSkewed``); a presigned URL past
``X-Amz-Date + X-Amz-Expires`` is ``AccessDenied`` and never served.
Signatures are compared in constant time (``core/auth.py`` ``equal``: any characters).

A hex payload hash is the client's promise about the body: the object data
path checks it while it streams (``objects.py``), and holds back the last
chunk until it matches, so a body that does not is never stored. A
``STREAMING-*`` payload is an aws-chunked body (``chunked.py``): for the signed
forms, ``Signed.signer`` checks each chunk's signature, chained from this one.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import quote, unquote

from fastapi import Request

from etl_runtime.core import auth
from etl_runtime.core.errors import S3Error
from etl_runtime.gateway.s3.chunked import STREAMING, ChunkSigner

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
MAX_SKEW_SECONDS = 15 * 60
MAX_EXPIRES_SECONDS = 7 * 24 * 3600
_SPACES = re.compile(r"\s+")
_ODD_SPACE = re.compile(r"\s\s|[^\S ]")  # what _SPACES would change: a run, or not a space
_AMZ_DATE = re.compile(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z", re.ASCII)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class SecretLookup(Protocol):
    """The keys' secrets (``keys.KeyStore`` implements it)."""

    def secret(self, access_key: str) -> str | None: ...


@dataclass(frozen=True)
class Signed:
    """What a verified request carried: the key it was signed with, and its payload hash."""

    access_key: str
    payload_hash: str  # a hex SHA-256 the body must match, UNSIGNED-PAYLOAD, or STREAMING-...
    signer: ChunkSigner | None = None  # a signed aws-chunked body's chunk signatures

    @property
    def body_sha256(self) -> str | None:
        return self.payload_hash if _HEX64.match(self.payload_hash) else None


def denied(message: str) -> S3Error:
    return S3Error("AccessDenied", 403, message)


def mismatch(message: str = "") -> S3Error:
    return S3Error(
        "SignatureDoesNotMatch",
        403,
        message
        or "the request signature we calculated does not match the signature you provided; "
        "check your key and signing method",
    )


def is_signed(request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    q = request.query_params
    return auth.startswith(ALGORITHM) or "X-Amz-Algorithm" in q or is_v2(request)


def is_v2(request: Request) -> bool:
    return request.headers.get("authorization", "").startswith("AWS ") or (
        "AWSAccessKeyId" in request.query_params
    )


def _canonical_query(raw: str, drop: str | None = None) -> str:
    pairs = []
    for part in raw.split("&") if raw else []:
        if not part:
            continue
        k, _, v = part.partition("=")
        k, v = unquote(k), unquote(v)
        if k == drop:
            continue
        pairs.append((quote(k, safe="-_.~"), quote(v, safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _canonical_headers(request: Request, names: list[str]) -> str:
    # The raw ASGI headers, read once (Starlette's ``getlist`` decodes them all per name).
    wanted: dict[bytes, list[str]] = {name.encode("latin-1"): [] for name in names}
    for name_bytes, value_bytes in request.scope["headers"]:
        values = wanted.get(name_bytes)
        if values is not None:
            value = value_bytes.decode("latin-1").strip()
            values.append(_SPACES.sub(" ", value) if _ODD_SPACE.search(value) else value)
    return "".join(f"{name}:{','.join(wanted[name.encode('latin-1')])}\n" for name in names)


def canonical_request(request: Request, signed: list[str], payload: str, drop: str | None) -> str:
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    path = raw_path.decode("latin-1").split("?", 1)[0]
    query = request.scope.get("query_string", b"").decode("latin-1")
    return "\n".join(
        [
            request.method,
            path,
            _canonical_query(query, drop),
            _canonical_headers(request, signed),
            ";".join(signed),
            payload,
        ]
    )


@functools.lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    """The day's key (four HMACs): kept, as AWS's SDKs do, per secret and scope."""
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _raw(canonical: str) -> bytes:
    """The canonical request as the bytes the client sent: its path, query and header values
    are the raw bytes read as latin-1 (a UTF-8 ``x-amz-meta-*`` value is signed as its
    UTF-8 bytes, not as those bytes read as latin-1 and encoded again)."""
    try:
        return canonical.encode("latin-1")
    except UnicodeEncodeError:
        return canonical.encode()


def signature(secret: str, amz_date: str, scope: str, canonical: str) -> str:
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(_raw(canonical)).hexdigest()])
    key = signing_key(secret, date, region, service)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


@functools.lru_cache(maxsize=64)
def _parse_time(amz_date: str) -> float:
    """``YYYYMMDDTHHMMSSZ`` as a POSIX time (by hand: ``strptime`` was a fifth of the
    signature check's CPU; kept: a busy client signs many requests in one second)."""
    m = _AMZ_DATE.fullmatch(amz_date)
    try:
        if m is None:
            raise ValueError(amz_date)
        y, mo, d, h, mi, sec = (int(v) for v in m.groups())
        return datetime(y, mo, d, h, mi, sec, tzinfo=UTC).timestamp()
    except ValueError:
        raise denied(f"bad request time {amz_date!r}: expected YYYYMMDDTHHMMSSZ") from None


def _credential(credential: str, amz_date: str) -> tuple[str, str]:
    """``AK/DATE/REGION/s3/aws4_request`` -> (access key, scope)."""
    parts = credential.split("/")
    if len(parts) != 5 or parts[3] != "s3" or parts[4] != "aws4_request":
        raise S3Error("AuthorizationHeaderMalformed", 400, f"bad credential scope {credential!r}")
    if parts[1] != amz_date[:8]:
        raise mismatch("the credential's date is not the request's date")
    return parts[0], "/".join(parts[1:])


def _signed_headers(value: str) -> list[str]:
    names = [h.strip().lower() for h in value.split(";") if h.strip()]
    if "host" not in names:
        raise S3Error("AuthorizationHeaderMalformed", 400, "the host header must be signed")
    return names


def verify(request: Request, secret_of: SecretLookup, now: float | None = None) -> Signed:
    """Check the request's SigV4 signature (either form); raise ``S3Error`` if it fails."""
    now = time.time() if now is None else now
    if is_v2(request):
        raise S3Error(
            "InvalidRequest",
            400,
            "Signature Version 2 is not supported: sign with SigV4 (boto3: "
            "Config(signature_version='s3v4'), needed for presigned URLs)",
        )
    if "X-Amz-Algorithm" in request.query_params:
        return _verify_query(request, secret_of, now)
    return _verify_header(request, secret_of, now)


def _secret(secret_of: SecretLookup, access_key: str) -> str:
    secret = secret_of.secret(access_key)
    if secret is None:
        raise S3Error(
            "InvalidAccessKeyId",
            403,
            f"the access key {access_key!r} does not exist here "
            "(create one with `sluice s3 key create`)",
        )
    return secret


def _verify_header(request: Request, secret_of: SecretLookup, now: float) -> Signed:
    header = request.headers["authorization"]
    fields: dict[str, str] = {}
    for item in header[len(ALGORITHM) :].split(","):
        k, _, v = item.strip().partition("=")
        fields[k] = v
    if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
        raise S3Error("AuthorizationHeaderMalformed", 400, "incomplete Authorization header")
    amz_date = request.headers.get("x-amz-date", "")
    if abs(now - _parse_time(amz_date)) > MAX_SKEW_SECONDS:
        raise S3Error(
            "RequestTimeTooSkewed",
            403,
            "the difference between the request time and the server's time is too large",
        )
    access_key, scope = _credential(fields["Credential"], amz_date)
    payload = request.headers.get("x-amz-content-sha256")
    if not payload:
        raise S3Error("InvalidRequest", 400, "missing x-amz-content-sha256")
    if payload.startswith("STREAMING-") and payload not in STREAMING:
        raise S3Error("NotImplemented", 501, f"aws-chunked uploads of {payload} are not supported")
    canonical = canonical_request(request, _signed_headers(fields["SignedHeaders"]), payload, None)
    secret = _secret(secret_of, access_key)
    expected = signature(secret, amz_date, scope, canonical)
    if not auth.equal(expected, fields["Signature"]):
        raise mismatch()
    signer = None
    if payload in STREAMING[1:]:
        date, region, service, _ = scope.split("/")
        key = signing_key(secret, date, region, service)
        signer = ChunkSigner(key, amz_date, scope, expected)
    return Signed(access_key, payload, signer)


def _verify_query(request: Request, secret_of: SecretLookup, now: float) -> Signed:
    q = request.query_params
    if q.get("X-Amz-Algorithm") != ALGORITHM:
        raise S3Error("AuthorizationQueryParametersError", 400, "X-Amz-Algorithm must be SigV4")
    needed = ("X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders")
    if any(k not in q for k in (*needed, "X-Amz-Signature")):
        raise S3Error(
            "AuthorizationQueryParametersError", 400, f"a presigned URL needs {', '.join(needed)}"
        )
    amz_date, expires = q["X-Amz-Date"], q["X-Amz-Expires"]
    if (
        not (expires.isascii() and expires.isdigit())
        or not 0 <= int(expires) <= MAX_EXPIRES_SECONDS
    ):
        raise S3Error(
            "AuthorizationQueryParametersError",
            400,
            f"X-Amz-Expires must be 0..{MAX_EXPIRES_SECONDS} seconds",
        )
    signed_at = _parse_time(amz_date)
    if now > signed_at + int(expires) or int(expires) == 0:  # 0: expired when made, as in S3
        raise denied("Request has expired")
    if signed_at > now + MAX_SKEW_SECONDS:
        raise denied("Request is not valid yet")
    access_key, scope = _credential(q["X-Amz-Credential"], amz_date)
    payload = q.get("X-Amz-Content-Sha256", UNSIGNED)
    names = _signed_headers(q["X-Amz-SignedHeaders"])
    canonical = canonical_request(request, names, payload, drop="X-Amz-Signature")
    expected = signature(_secret(secret_of, access_key), amz_date, scope, canonical)
    if not auth.equal(expected, q["X-Amz-Signature"]):
        raise mismatch()
    return Signed(access_key, payload)
