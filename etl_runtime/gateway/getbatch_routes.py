"""The gateway's GetBatch route: ``GET /v1/ml/moss[/{bucket}]`` with a JSON ``MossReq`` body.

What the official SDK sends (``client.batch(...).get()``,
``aistore.pytorch.AISBatchIterDataset``): the default bucket in the path with
``?provider=``, an optional ``?coloc=`` hint (taken and not needed), and the
body. Beyond AIStore, ``?etl_name=`` (with ``etl_args``, ``etl_pipeline``, as
for an object GET) transforms every item on its own target before it joins
the archive.

The gateway checks the query, the caller's right to read and the ETLs named,
then, as AIStore's proxy does, redirects (307, which keeps the method and the
body) to a **designated target** chosen at random among the members; that
target (``storage_target/getbatch_routes.py``) assembles the answer: it asks every other
target for its share and reads its own, so the gateway handles one small
request per batch and no item's bytes. A small batch request that needs no ETL gets this
redirect inside the HTTP protocol (``gateway/inprotocol.py``), the same answer
without the ASGI task. Where reads need a token the redirect
is signed for that route, query and body (``getbatch/serve.py``,
``signed_path``). The gateway assembles the batch itself (``getbatch/``, the
same code) when any member is down, slow to answer its probe or has no
address, when there is no cluster map, when reads need a token and no cluster
key is set to sign with, or with ``--batch-assembly gateway``.

The answer is the archive itself (``strm``: true, ``Content-Type:
application/x-tar``, or ``application/gzip`` for ``.tgz``) or, with ``strm``
false, ``multipart/mixed``: a ``metadata`` part (``{"uuid", "out":
[MossOut]}``) then an ``archive`` part.
"""

from __future__ import annotations

import random
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import Response

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core import auth
from etl_runtime.core.access import IN_BODY, SIGNATURE_PARAMS, batch_buckets, token_id
from etl_runtime.core.jsonbody import parse_json
from etl_runtime.core.names import validate_bucket
from etl_runtime.core.params import refuse_unknown
from etl_runtime.etl.pipeline import check_chain_async, parse_chain
from etl_runtime.gateway.context import Gateway
from etl_runtime.getbatch.serve import MAP_PARAM, QUERY, answer, batch_path, signed_path
from etl_runtime.wire.clients.duplex import DuplexClient
from etl_runtime.wire.http.fastpath import FastRouter

ASSEMBLERS = ("target", "gateway")


def designate(gw: Gateway) -> tuple[TargetInfo, int] | None:
    """(the target to assemble a batch, the map version), or None: the gateway does."""
    if gw.cmap is None:
        return None
    if gw.read_token and not gw.cluster_key:
        return None  # the redirect could not be signed; the client's token stays here
    cmap = gw.cmap.get()
    members = cmap.members
    if not members:
        return None
    alive, suspect = gw.alive_ids(), gw.suspect_ids()
    if any(m not in alive or m in suspect for m in members):
        return None  # a membership in flux: one process sees it all
    info = gw.target_info(random.choice(members), cmap)
    return (info, cmap.version) if info is not None else None


def redirect_location(
    gw: Gateway,
    bucket: str | None,
    query: list[tuple[str, str]],
    body: bytes,
    dt: TargetInfo,
    version: int,
    tid: str | None = None,
) -> str:
    """Where a batch is redirected: the designated target's route with the caller's
    ``query`` (less any signature), the map version and, where reads need a token, the
    signature over the route, query and body (and ``tid``, the access token it was
    checked for: ``core/access.py``). Also ``gateway/inprotocol.py``'s."""
    kept = [(k, v) for k, v in query if k not in SIGNATURE_PARAMS]
    kept.append((MAP_PARAM, str(version)))
    if gw.read_token and gw.cluster_key:
        signed = signed_path(bucket, kept, body)
        kept += auth.sign_redirect(gw.cluster_key, "GET", signed, tid=tid).items()
    return f"{dt.url.rstrip('/')}{batch_path(bucket)}?{urlencode(kept)}"


async def get_batch(
    gw: Gateway, http: DuplexClient, request: Request, bucket: str | None, assembler: str
) -> Response:
    gw.require_read(request, IN_BODY)  # the credentials before anything
    body = await request.body()  # (at most 16 MiB: core/jsonbody.py)
    gw.require_read(request, *batch_buckets(request, body, bucket))  # every bucket named
    refuse_unknown(request, QUERY, bucket=bucket)  # and only then any 400
    if bucket is not None:
        validate_bucket(bucket)
    q = request.query_params
    chain = parse_chain(q.get("etl_name"), q.get("etl_pipeline"))
    if chain:
        await check_chain_async(gw.backend.get, chain)
    dt = designate(gw) if assembler == "target" else None
    if dt is not None:
        query, tid = request.query_params.multi_items(), token_id(request)
        location = redirect_location(gw, bucket, query, body, *dt, tid=tid)
        return Response(status_code=307, headers={"Location": location})
    cmap = gw.cmap.get() if gw.cmap is not None else None
    return await answer(gw, http, request, bucket, parse_json(body, "the GetBatch request"), cmap)


def batch_router(gw: Gateway, http: DuplexClient, assembler: str = "target") -> FastRouter:
    """``http``: the client items are read with (the app closes it at shutdown);
    ``assembler``: ``target`` (designate one) or ``gateway`` (always here)."""
    if assembler not in ASSEMBLERS:
        raise ValueError(f"batch assembler must be one of {ASSEMBLERS}, not {assembler!r}")
    router = FastRouter()

    @router.get("/v1/ml/moss")
    async def get_batch_any(request: Request) -> Response:
        return await get_batch(gw, http, request, None, assembler)

    @router.get("/v1/ml/moss/{bucket}")
    async def get_batch_bucket(bucket: str, request: Request) -> Response:
        return await get_batch(gw, http, request, bucket, assembler)

    router.fast("/v1/ml/moss", ["GET"])  # wire/http/fastpath.py
    router.fast("/v1/ml/moss/{bucket}", ["GET"])
    return router
