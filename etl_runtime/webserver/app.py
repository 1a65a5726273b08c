"""The FastAPI app of a transformer: the hpush protocol plus health, stats, logs.

``create_app(name, spec, workers, token)`` builds it; the app's lifespan starts
the ``Transformer`` in the background and stops its workers on shutdown. Routes
stay thin: object mode lives in ``objects``, WebDataset mode in ``shards``, and
every ``SluiceError`` becomes its JSON body and status in one handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from etl_runtime.core.auth import bearer_ok
from etl_runtime.core.errors import InvalidRequest, NotReady, SluiceError, Unauthorized
from etl_runtime.core.metrics import EtlStatsCollector, install_metrics
from etl_runtime.core.params import ETL_SKIP, refuse_repeated
from etl_runtime.core.spec import SPEC_HASH_HEADER, EtlSpec
from etl_runtime.etl import grants
from etl_runtime.webserver.bulk import batch_answer
from etl_runtime.webserver.direct import direct_answer, transform_one
from etl_runtime.webserver.fqn import FqnAccess
from etl_runtime.webserver.shards import skip_of
from etl_runtime.webserver.stats import Board, Stats
from etl_runtime.webserver.transformer import Transformer
from etl_runtime.wire.formats import bulk
from etl_runtime.wire.http import names
from etl_runtime.wire.http.fastpath import FastPathApp

LOGGERS = ("sluice", names.ERROR_LOGGER)
HPUSH_PARAMS = frozenset({"etl_args", "etl_fqn", grants.PARAM, ETL_SKIP})


class _Totals:
    """What ``/metrics`` reads: the counters of all server processes added up."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stats.totals(), name)


def create_app(
    name: str,
    spec: EtlSpec,
    workers: int | None = None,
    token: str | None = None,
    deps_dir: str | None = None,
    roots: tuple[str, ...] | None = None,
    board: Board | None = None,
    slot: int = 0,
    inline: bool = False,
    ready_before_serving: bool = False,
) -> FastAPI:
    """The transformer app; ``app.state.transformer`` is its ``Transformer``.

    ``roots``: where ``etl_fqn`` files may lie (default ``$SLUICE_DATA_ROOTS``, see fqn);
    under ``$SLUICE_FD_BROKER`` the target hands them instead (``fqn.FqnAccess``).
    ``board``/``slot``: this app is server ``slot`` of several (see ``servers``).
    ``inline``: object-mode code runs in this process's threads (see ``inprocess``).
    ``ready_before_serving``: start up before taking connections (a server that
    replaces another: the others answer ``/health`` meanwhile).
    """
    access = FqnAccess.from_env(roots)
    transformer = Transformer(
        name,
        spec,
        workers=workers,
        token=token,
        deps_dir=deps_dir,
        board=board,
        slot=slot,
        inline=inline,
    )
    generation = spec.content_hash()  # on every answer: what a target's cache keys on
    spec_hash = (SPEC_HASH_HEADER, generation)
    # The pid of the process that was started: the supervisor's with several servers.
    main_pid = os.getpid() if board is None else os.getppid()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for logger in LOGGERS:
            logging.getLogger(logger).addHandler(transformer.logs)
        starting = asyncio.create_task(transformer.start())
        if ready_before_serving:
            await asyncio.shield(starting)  # uvicorn listens once the lifespan started
        try:
            yield
        finally:
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            await transformer.stop()
            for logger in LOGGERS:
                logging.getLogger(logger).removeHandler(transformer.logs)

    # FastPathApp: the per-object routes skip FastAPI's routing (see fastpath).
    app = FastPathApp(title=f"sluice transformer {name}", lifespan=lifespan)
    app.state.transformer = transformer
    install_metrics(app, "transformer", EtlStatsCollector(name, _Totals(transformer.stats)))

    async def authorized(request: Request) -> None:  # async: no threadpool hop
        if not bearer_ok(request.headers.get("authorization"), transformer.token):
            raise Unauthorized(
                "missing or wrong bearer token: send 'Authorization: Bearer <ETL token>'"
            )

    @app.exception_handler(SluiceError)
    async def transformer_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SluiceError)
        obj = request.path_params.get("bucket"), request.path_params.get("object")
        body = exc.hpush_body(name, "/".join(obj) if all(obj) else None)  # type: ignore[arg-type]
        return JSONResponse(body, status_code=exc.status, headers=exc.headers or None)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = transformer.all_ready
        servers = 1 if board is None else board.servers
        body: dict[str, Any] = {
            "status": "ok" if ready else "starting",
            "etl": name,
            "mode": spec.mode,
            "workers": transformer.workers * servers,
            "servers": servers,
            "pid": main_pid,  # lets a supervisor check who answers on its port
        }
        if transformer.fatal:
            body.update(status="error", error=transformer.fatal)
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/stats", dependencies=[Depends(authorized)])
    async def stats() -> dict[str, Any]:
        return transformer.stats.to_dict()

    @app.get("/logs", dependencies=[Depends(authorized)])
    async def logs(tail: int = 200) -> PlainTextResponse:
        return PlainTextResponse(transformer.logs.tail(tail))

    async def hpush(request: Request, bucket: str, object: str) -> Response:
        await authorized(request)  # called, not a dependency: less work per object
        if not transformer.ready:
            raise NotReady(transformer.fatal or f"ETL {name!r} is still starting; retry shortly")
        obj = f"{bucket}/{object}"
        q = request.query_params
        if len(q) > 4 or not HPUSH_PARAMS.issuperset(q) or len(q.multi_items()) > len(q):
            refuse_hpush_params(request, obj)
        args = q.get("etl_args")
        skip = skip_of(transformer, q.get(ETL_SKIP), obj)
        fqn = q.get("etl_fqn") or None
        grant = q.get(grants.PARAM)
        return await transform_one(
            transformer, request, obj, args, fqn, grant, skip, access, spec_hash
        )

    async def direct(request: Request, bucket: str, object: str) -> Response:
        """A client sent here by its target's 307 (see ``direct``); signed, not bearer."""
        return await direct_answer(transformer, request, bucket, object, access)

    async def batch(request: Request) -> Response:
        """Many objects by path, their outputs framed in one answer (see ``bulk``)."""
        await authorized(request)
        return await batch_answer(transformer, request, access)

    app.add_fast_route("PUT", hpush)
    app.add_fast_route("GET", direct)
    app.add_fast_route("POST", batch, bulk.PATH)
    return app


def refuse_hpush_params(request: Request, obj: str) -> None:
    """400 naming a query parameter of an hpush ``PUT`` that is unknown or repeated:
    dropping it (or all but one value) would transform with other arguments."""
    unknown = sorted(set(request.query_params) - HPUSH_PARAMS)
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter(s) {', '.join(unknown)} on the hpush PUT of {obj!r}; "
            f"known: {', '.join(sorted(HPUSH_PARAMS))}"
        )
    refuse_repeated(request)
