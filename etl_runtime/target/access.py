"""Who may change data on a target.

With a user token configured, a mutating call must carry ``Authorization:
Bearer <token>`` — or, for object calls redirected by the gateway, the
``sluice_exp``/``sluice_sig`` query parameters the gateway signed with the
cluster key (HTTP clients drop ``Authorization`` when a redirect changes the
port, so the signature travels in the URL).
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request

from etl_runtime import auth
from etl_runtime.target.errors import Unauthorized

SIGNATURE_PARAMS = ("sluice_exp", "sluice_sig")


def object_path(bucket: str, name: str) -> str:
    """The canonical path of an object call: what the gateway signs and targets check."""
    return f"/v1/objects/{bucket}/{name}"


def object_url(base: str, bucket: str, name: str) -> str:
    return f"{base.rstrip('/')}/v1/objects/{quote(bucket, safe='')}/{quote(name, safe='/')}"


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
