"""Who may change data on a target.

With a user token configured, a mutating call must carry ``Authorization:
Bearer <token>`` — or, for object calls redirected by the gateway, the
``sluice_exp``/``sluice_sig`` query parameters the gateway signed with the
cluster key (HTTP clients drop ``Authorization`` when a redirect changes the
port, so the signature travels in the URL). With a read token configured,
reads need the read token or the user token, or a signed redirect likewise.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request

from etl_runtime.core import auth
from etl_runtime.core.errors import Unauthorized

SIGNATURE_PARAMS = ("sluice_exp", "sluice_sig")
# Set by a target that redirects a read it does not own to the owner (once: see
# storage/copies.py, Placement.read_owner).
REDIRECTED_FROM = "sluice_from"


def object_path(bucket: str, name: str) -> str:
    """The canonical path of an object call: what the gateway signs and targets check."""
    return f"/v1/objects/{bucket}/{name}"


def object_url(base: str, bucket: str, name: str) -> str:
    return f"{base.rstrip('/')}/v1/objects/{quote(bucket, safe='')}/{quote(name, safe='/')}"


def _signed(request: Request, cluster_key: str | None, signed_path: str | None) -> bool:
    if not (cluster_key and signed_path is not None):
        return False
    q = request.query_params
    return auth.verify_redirect(
        cluster_key, request.method, signed_path, q.get("sluice_exp"), q.get("sluice_sig")
    )


def require_read(
    request: Request,
    read_token: str | None,
    token: str | None,
    cluster_key: str | None,
    signed_path: str | None = None,
) -> None:
    """Raise ``Unauthorized`` unless the caller may read; no-op without a read token."""
    if auth.read_ok(request.headers.get("authorization"), read_token, token):
        return
    if _signed(request, cluster_key, signed_path):
        return
    raise Unauthorized(
        "this call reads data: send 'Authorization: Bearer <SLUICE_READ_TOKEN or SLUICE_TOKEN>'"
    )


def require_write(
    request: Request,
    token: str | None,
    cluster_key: str | None,
    signed_path: str | None = None,
) -> None:
    """Raise ``Unauthorized`` unless the caller may mutate; no-op without a token."""
    if auth.bearer_ok(request.headers.get("authorization"), token):
        return
    if cluster_key and signed_path is not None:
        q = request.query_params
        if auth.verify_redirect(
            cluster_key, request.method, signed_path, q.get("sluice_exp"), q.get("sluice_sig")
        ):
            return
    raise Unauthorized()
