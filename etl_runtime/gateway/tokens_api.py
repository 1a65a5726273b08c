"""``/v1/tokens``: access tokens scoped to buckets (``core/tokens.py``), for the user token only.

* ``POST /v1/tokens`` body ``{"buckets": [B, ...], "permission": "read"|"write",
  "ttl": seconds or "8h"}`` -> ``{"id", "token", "buckets", "permission",
  "expires"}``: the only time the token is shown;
* ``GET /v1/tokens`` -> ``{"tokens": [{"id", "buckets", "permission", "expires",
  "created", "revoked"}]}`` (tokens not expired yet);
* ``DELETE /v1/tokens/{id}`` -> ``{"id", "revoked": true}``: every gateway and
  target refuses the token from its next look at the cluster map.

A token holder cannot manage tokens (these calls name no bucket: ``core/access.py``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request

from etl_runtime.core import tokens
from etl_runtime.core.errors import InvalidRequest, NotFound
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway.context import Gateway

FIELDS = ("buckets", "permission", "ttl")


def _ttl(value: Any) -> int:
    if value is None:
        return tokens.DEFAULT_TTL_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidRequest(f"'ttl' must be seconds or a string like '8h', got {value!r}")
    try:
        return tokens.parse_ttl(str(value))
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


def _spec(body: Any) -> tuple[list[str], str, int]:
    if not isinstance(body, dict):
        raise InvalidRequest('a token is {"buckets": [...], "permission": "read"|"write"}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} in a token; known: {', '.join(FIELDS)}"
        )
    buckets = body.get("buckets")
    if not isinstance(buckets, list) or not buckets or not all(isinstance(b, str) for b in buckets):
        raise InvalidRequest("'buckets' must be a non-empty list of bucket names")
    for b in buckets:
        validate_bucket(b)
    permission = body.get("permission", "read")
    if permission not in tokens.PERMISSIONS:
        raise InvalidRequest(f"'permission' must be 'read' or 'write', got {permission!r}")
    return buckets, permission, _ttl(body.get("ttl"))


def _listing(records: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"id": k, **v} for k, v in sorted(records.items(), key=lambda kv: kv[1].get("created", 0))
    ]


def tokens_router(gw: Gateway) -> APIRouter:
    router = APIRouter()

    def usable() -> Any:
        if not gw.cluster_key:
            raise InvalidRequest("this gateway has no cluster key (SLUICE_CLUSTER_KEY) to sign")
        if gw.cmap is None:
            raise InvalidRequest(
                "this gateway has no cluster map (--cluster-map) to keep revocations in"
            )
        return gw.cmap

    @router.post("/v1/tokens")
    async def create_token(request: Request) -> dict[str, Any]:
        gw.require_write(request)  # cluster-wide: the user token only
        refuse_unknown(request, ())
        cmap = usable()
        buckets, permission, ttl = _spec(await read_json(request, "the body of POST /v1/tokens"))
        assert gw.cluster_key is not None
        token, claims = tokens.mint(gw.cluster_key, buckets, permission, ttl)
        record = claims.record()

        def keep() -> None:
            cmap.update(lambda m: replace(m, tokens={**tokens.pruned(m.tokens), claims.id: record}))

        await anyio.to_thread.run_sync(keep)
        return {"id": claims.id, "token": token, **record}

    @router.get("/v1/tokens")
    async def list_tokens(request: Request) -> dict[str, Any]:
        gw.require_write(request)
        refuse_unknown(request, ())
        return {"tokens": _listing(tokens.pruned(usable().get().tokens))}

    @router.delete("/v1/tokens/{token_id}")
    async def revoke_token(token_id: str, request: Request) -> dict[str, Any]:
        gw.require_write(request)
        refuse_unknown(request, ())
        cmap = usable()
        if token_id not in cmap.get().tokens:
            raise NotFound(f"no token {token_id!r} (or it has expired)", token=token_id)

        def revoke() -> None:
            def change(m: Any) -> Any:
                kept = tokens.pruned(m.tokens)
                if token_id in kept:
                    kept[token_id] = {**kept[token_id], "revoked": True, "revoked_at": time.time()}
                return replace(m, tokens=kept)

            cmap.update(change)

        await anyio.to_thread.run_sync(revoke)
        return {"id": token_id, "revoked": True}

    return router
