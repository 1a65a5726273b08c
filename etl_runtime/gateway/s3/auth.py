"""Who may make an S3 call: a SigV4-signed request with a cluster key, or nobody at all.

* A signed request (header or presigned URL) must verify (``sigv4.verify``;
  a Signature Version 2 presigned URL: ``sigv2.verify``)
  against a key of ``keys.KeyStore``; a ``read`` key may GET, HEAD and list,
  a ``write`` key may do everything.
* An unsigned request is anonymous: allowed for reads only, and only where
  the cluster lets reads go without a token (no ``SLUICE_READ_TOKEN``).
  Anonymous writes are refused even on a cluster without ``SLUICE_TOKEN``:
  S3 clients always sign when they hold credentials, so an unsigned write is
  a misconfigured client rather than a wish.

Refusals are 403 ``AccessDenied`` (``SignatureDoesNotMatch`` for a bad
signature, ``InvalidAccessKeyId`` for an unknown key), never a 401.
"""

from __future__ import annotations

from fastapi import Request

from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.s3 import sigv2, sigv4
from etl_runtime.gateway.s3.keys import KeyStore


async def authorize(
    gw: Gateway, keys: KeyStore, request: Request, write: bool
) -> sigv4.Signed | None:
    """The verified signature (None: anonymous); raises ``S3Error`` 403 when not allowed."""
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
        return signed
    if write:
        raise sigv4.denied("anonymous writes are not allowed: sign the request with an S3 key")
    if gw.read_token:
        raise sigv4.denied(
            "this cluster needs credentials for reads: sign the request with an S3 key "
            "(`sluice s3 key create --read`)"
        )
    return None
