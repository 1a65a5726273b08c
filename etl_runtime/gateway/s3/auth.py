"""Who may make an S3 call: a SigV4-signed request with a cluster key, or nobody at all.

* A signed request (header or presigned URL) must verify (``sigv4.verify``;
  a Signature Version 2 presigned URL: ``sigv2.verify``)
  against a key of ``keys.KeyStore``; a ``read`` key may GET, HEAD and list,
  a ``write`` key may do everything. A key limited to buckets may touch
  those only: the call's bucket, a view's source and a copy's source
  (``x-amz-copy-source``) must each be one of them; a call about no bucket
  (ListBuckets) is refused. 403 ``AccessDenied`` naming the bucket.
* An unsigned request is anonymous: allowed for reads only, and only where
  the cluster lets reads go without a token (no ``SLUICE_READ_TOKEN``).
  Anonymous writes are refused even on a cluster without ``SLUICE_TOKEN``:
  S3 clients always sign when they hold credentials, so an unsigned write is
  a misconfigured client rather than a wish.

Refusals are 403 ``AccessDenied`` (``SignatureDoesNotMatch`` for a bad
signature, ``InvalidAccessKeyId`` for an unknown key), never a 401.
"""

from __future__ import annotations

from urllib.parse import unquote

from fastapi import Request

from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3 import sigv2, sigv4
from etl_runtime.gateway.s3.keys import KeyStore


def _in_scope(
    gw: Gateway, keys: KeyStore, access_key: str, request: Request, bucket: str | None
) -> None:
    scope = keys.buckets(access_key)
    if scope is None:
        return
    wanted = [bucket] if bucket else []
    source = request.headers.get("x-amz-copy-source")
    if source:
        wanted.append(unquote(source).split("?", 1)[0].lstrip("/").partition("/")[0])
    wanted += gw.view_sources(tuple(wanted))
    if not wanted:
        raise sigv4.denied(
            f"the key {access_key} is limited to bucket(s) {', '.join(scope)}: "
            "this call is not about one bucket"
        )
    for b in wanted:
        if b not in scope:
            raise sigv4.denied(
                f"the key {access_key} may not access bucket {b!r} "
                f"(its buckets: {', '.join(scope)})"
            )


async def authorize(
    gw: Gateway, keys: KeyStore, request: Request, write: bool, bucket: str | None = None
) -> sigv4.Signed | None:
    """The verified signature (None: anonymous); raises ``S3Error`` 403 when not allowed.
    ``bucket``: the call's (None: ListBuckets), checked against a key's buckets."""
    if sigv4.is_signed(request):
        if sigv4.is_v2(request):  # boto3's default presigned URLs
            signed = sigv2.verify(request, keys)
        else:
            signed = sigv4.verify(request, keys)  # a few HMACs: cheaper than a thread hop
        permission = keys.permission(signed.access_key)
        if write and permission != "write":
            raise sigv4.denied(
                f"the key {signed.access_key} may only read (permission {permission!r})"
            )
        _in_scope(gw, keys, signed.access_key, request, bucket)
        return signed
    if write:
        raise sigv4.denied("anonymous writes are not allowed: sign the request with an S3 key")
    if gw.read_token:
        raise sigv4.denied(
            "this cluster needs credentials for reads: sign the request with an S3 key "
            "(`sluice s3 key create --read`)"
        )
    return None
