"""AWS Signature Version 2 presigned URLs: what boto3's ``generate_presigned_url`` makes
at its default settings (``?AWSAccessKeyId=...&Signature=...&Expires=...``).

The string to sign (AWS "Query String Request Authentication Alternative"):
``METHOD\\nContent-MD5\\nContent-Type\\nEXPIRES\\n`` then the ``x-amz-*`` headers
(lower-cased, sorted, ``name:value`` lines; those moved into the query count
as headers) and the resource: the path exactly as sent, bucket and key and any
prefix (botocore leaves out the endpoint's ``/s3``: either is accepted), plus
the sub-resources S3 signs (``?uploadId=...&partNumber=...``,
``response-*``...) sorted by name. The signature is the base64 HMAC-SHA1 of
it with the key's secret, compared in constant time.

As strict as SigV4's presigned form: a URL past ``Expires`` is ``AccessDenied``
and never served; one that expires more than 7 days ahead is refused; the
method, bucket, key and sub-resources are all signed, so the URL is good for
that one call on that one object. The header form (``Authorization: AWS
...``) is refused: SDKs sign requests with SigV4.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import unquote

from fastapi import Request

from etl_runtime.core import auth
from etl_runtime.core.errors import S3Error
from etl_runtime.gateway.s3.root import VHOST_KEY
from etl_runtime.gateway.s3.sigv4 import MAX_EXPIRES_SECONDS, UNSIGNED, SecretLookup, Signed, denied

SUBRESOURCES = frozenset(
    (
        "accelerate acl cors defaultObjectAcl location logging partNumber policy "
        "requestPayment torrent versioning versionId versions website uploads uploadId "
        "response-content-type response-content-language response-expires "
        "response-cache-control response-content-disposition response-content-encoding "
        "delete lifecycle tagging restore storageClass notification replication "
        "analytics metrics inventory select select-type object-lock"
    ).split()
)
_AUTH = ("AWSAccessKeyId", "Signature", "Expires")


def string_to_sign(request: Request, expires: str, prefix: bool = False) -> str:
    """``prefix``: the resource with the endpoint's path (``/s3``) kept; botocore signs
    the bucket and key alone (its ``auth_path``), other clients the path as sent."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    pairs = [p.split("=", 1) for p in raw.split("&") if p]
    query = {unquote(p[0]): unquote(p[1]) if len(p) > 1 else None for p in pairs}
    headers = request.headers

    def standard(name: str) -> str:
        value = query.get(name) or headers.get(name) or ""
        return value.strip()

    amz: dict[str, list[str]] = {}
    for name, value in headers.items():
        if name.startswith("x-amz-"):
            amz.setdefault(name, []).append(value.strip())
    for name, given in query.items():
        if name.lower().startswith("x-amz-") and given is not None:
            amz.setdefault(name.lower(), []).append(given.strip())
    lines = [request.method, standard("content-md5"), standard("content-type"), expires]
    lines += [f"{k}:{','.join(v)}" for k, v in sorted(amz.items())]
    path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    resource = path.split("?", 1)[0]
    vhost = request.scope.get(VHOST_KEY)
    if vhost is not None:  # signed as S3 signs it: the bucket, then the path
        resource = f"/{vhost}{resource}"
    elif not prefix and (resource == "/s3" or resource.startswith("/s3/")):
        resource = resource[3:] or "/"
    subs = sorted(
        (p[0], unquote(p[1]) if len(p) > 1 else None) for p in pairs if p[0] in SUBRESOURCES
    )
    if subs:
        resource += "?" + "&".join(k if v is None else f"{k}={v}" for k, v in subs)
    return "\n".join([*lines, resource])


def verify(request: Request, secret_of: SecretLookup, now: float | None = None) -> Signed:
    """Check a V2 presigned URL; raise ``S3Error`` if it fails."""
    now = time.time() if now is None else now
    q = request.query_params
    if "AWSAccessKeyId" not in q:
        raise S3Error(
            "InvalidRequest",
            400,
            "Signature Version 2 is accepted only in presigned URLs: sign requests with "
            "SigV4 (the default of every AWS SDK)",
        )
    missing = [k for k in _AUTH if k not in q]
    if missing:
        raise S3Error(
            "AuthorizationQueryParametersError", 400, f"a V2 presigned URL needs {missing}"
        )
    expires = q["Expires"]
    if not (expires.isascii() and expires.isdigit()):
        raise S3Error("AuthorizationQueryParametersError", 400, "Expires must be a POSIX time")
    if now > int(expires):
        raise denied("Request has expired")
    if int(expires) > now + MAX_EXPIRES_SECONDS:
        raise S3Error(
            "AuthorizationQueryParametersError",
            400,
            f"Expires must be at most {MAX_EXPIRES_SECONDS} seconds ahead",
        )
    access_key = q["AWSAccessKeyId"]
    secret = secret_of.secret(access_key)
    if secret is None:
        raise S3Error(
            "InvalidAccessKeyId", 403, f"the access key {access_key!r} does not exist here"
        )
    sent = q["Signature"]
    matched = False
    for prefix in (False, True):
        text = string_to_sign(request, expires, prefix).encode()
        expected = base64.b64encode(hmac.new(secret.encode(), text, hashlib.sha1).digest())
        matched = matched or auth.equal(expected.decode(), sent)
    if not matched:
        raise S3Error(
            "SignatureDoesNotMatch",
            403,
            "the request signature we calculated does not match the signature you provided",
        )
    return Signed(access_key, UNSIGNED)
