"""Forwarding an object to this target's transformer and streaming the answer back.

``GET /v1/objects/B/O?etl_name=X`` on a target ends up here: find the
transformer of ETL ``X`` that runs beside this target (``EtlRegistry``), send
it the object with the hpush protocol (``PUT {endpoint}/B/O``, the object as
body or ``etl_fqn=<path>`` for direct file access) and relay its answer.

The one rule that matters: a client must never mistake a truncated result for
a complete one. A transformer error *before* the first byte is passed on with
its status and JSON body; a break *after* streaming began is re-raised in the
response generator, so uvicorn drops the connection without the final chunk. A
wds answer (a tar) is also marked (``wire/formats/tarbreak.py``): the transformer's own
error marker passes through, a break on a member boundary gets one from here.

When the transformer reads the object's file itself (``etl_fqn``), the client's
GET is answered with a 307 to the transformer, signed for that one object
(``webserver/direct.py``; docs/transformer.md, "Transformer data path").
``SLUICE_ETL_REDIRECT_BYTES=N`` relays objects under N bytes, ``off`` all. An
ETL with ``cache: true`` goes to ``self.cache`` (``outcache.py``) instead.

The PUT goes through ``duplex.DuplexClient``, which reads the answer while it
still sends the object (a wds transformer streams its output while it reads the
shard: a client that sends the whole body first deadlocks); ``/stats`` and
``/logs`` use httpx. A user's own ETL image (``spec.commType``): ``aisimage.py``.

Failures only the target sees (transformer unreachable, stream broken) are
counted here; ``stats()`` reports them beside the transformer's own counts."""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlencode

import anyio.to_thread
import httpx
from fastapi.responses import Response, StreamingResponse

from etl_runtime.cluster.records import EtlRecord, EtlRegistry, TransformerStatus
from etl_runtime.core import auth, tls
from etl_runtime.core.errors import (
    DuplexError,
    EtlNotFound,
    EtlNotReady,
    EtlStopped,
    InvalidRequest,
    SluiceError,
    Timeout,
    TransformerFailed,
    TransformTimeout,
)
from etl_runtime.core.params import ETL_SKIP
from etl_runtime.core.spec import SKIPPED_HEADERS, SPEC_HASH_HEADER
from etl_runtime.etl import aisimage, grants
from etl_runtime.etl.outcache import OutputCache, file_chunks
from etl_runtime.etl.streambreak import TransformerStreamBroken, upstream_error
from etl_runtime.storage.store import ObjectStore
from etl_runtime.wire.clients.duplex import DuplexClient, DuplexResponse
from etl_runtime.wire.formats import tarbreak

log = logging.getLogger(__name__)

WHOLE_BODY_MAX = 4 << 20  # smaller objects go to the transformer in one piece
ERROR_BODY_MAX = 64 << 10
# Seconds past ``requestSeconds`` this side waits, so that a Sluice transformer's
# own ``TransformTimeout`` (which says its worker was replaced) comes first.
TIMEOUT_SLACK = 2.0
LAST_ERRORS = 20
FQN_ENV = "SLUICE_ETL_FQN"
REDIRECT_ENV = "SLUICE_ETL_REDIRECT_BYTES"
REDIRECT_BYTES = 0  # on 16 cores the 307 won at 16 KiB too (docs/benchmarks.md)
STAT_FIELDS = ("objects", "samples", "skipped", "errors", "bytes_in", "bytes_out")


def redirect_bytes_from_env(value: str | None = None) -> int | None:
    """``$SLUICE_ETL_REDIRECT_BYTES``: the smallest object answered by a 307 to the
    transformer; ``off`` (or ``never``) relays every answer. ``ValueError`` if bad."""
    raw = (os.environ.get(REDIRECT_ENV, "") if value is None else value).strip().lower()
    if not raw:
        return REDIRECT_BYTES
    if raw in ("off", "never"):
        return None
    if not raw.isdigit():
        raise ValueError(f"{REDIRECT_ENV}={raw!r}: give a number of bytes, or 'off'")
    return int(raw)


class EtlForwarder:
    def __init__(
        self,
        target_id: str,
        registry: EtlRegistry,
        store: ObjectStore,
        cluster_key: str | None,
        fqn_always: bool | None = None,
    ) -> None:
        """``fqn_always``: send every ETL ``etl_fqn`` (its transformers can read this
        target's data dir), not only ETLs of ``argType: fqn``; default
        ``$SLUICE_ETL_FQN == "always"`` (``sluice up`` sets it). ``redirect_bytes``:
        ``$SLUICE_ETL_REDIRECT_BYTES`` (``redirect_bytes_from_env``; None: always relay)."""
        always = os.environ.get(FQN_ENV, "").strip().lower() == "always"
        self.fqn_always = always if fqn_always is None else fqn_always
        self.redirect_bytes = redirect_bytes_from_env()
        self.target_id = target_id
        self.registry = registry
        self.store = store
        self.cluster_key = cluster_key or ""
        self._http: httpx.AsyncClient | None = None
        self._duplex: DuplexClient | None = None
        self._failures: dict[str, int] = collections.Counter()
        self._last_errors: dict[str, collections.deque[dict[str, Any]]] = {}
        self.cache: OutputCache | None = None  # set by the app when it has a budget
        # set while this target's file broker runs (storage_target/fdbroker.py): every
        # etl_fqn then goes with a grant of its file to the ETL (etl/grants.py)
        self.grant_key: str | None = None

    async def start(self) -> None:
        self._http = httpx.AsyncClient(
            trust_env=False,
            verify=tls.client_context(),  # SLUICE_CA (core/tls.py)
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            timeout=httpx.Timeout(600.0, connect=10.0),
        )
        self._duplex = DuplexClient(connect_timeout=10.0)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._duplex is not None:
            await self._duplex.aclose()
            self._duplex = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("EtlForwarder.start() was not called")
        return self._http

    @property
    def duplex(self) -> DuplexClient:
        if self._duplex is None:
            raise RuntimeError("EtlForwarder.start() was not called")
        return self._duplex

    # -- finding the transformer ----------------------------------------------

    def record(self, name: str) -> EtlRecord:
        record = self.registry.get(name)
        if record is None:
            raise EtlNotFound(
                f"ETL {name!r} does not exist; create it with PUT /v1/etl "
                "(or `sluice etl init`), list ETLs with GET /v1/etl",
                etl=name,
            )
        return record

    def transformer(self, record: EtlRecord) -> TransformerStatus:
        name = record.name
        if record.spec.stopped or record.phase == "Stopped":
            raise EtlStopped(
                f"ETL {name!r} is stopped; start it with POST /v1/etl/{name}/start "
                f"(or `sluice etl start {name}`)",
                etl=name,
            )
        tf = record.transformer_for(self.target_id)
        if tf is None or not tf.ready or not tf.endpoint:
            why = (tf.message if tf else None) or record.message or f"phase {record.phase}"
            raise EtlNotReady(
                f"ETL {name!r} has no ready transformer on target {self.target_id!r} yet "
                f"({why}); retry shortly",
                etl=name,
                target=self.target_id,
            )
        return tf

    def _headers(self, record: EtlRecord, size: int | None = None) -> dict[str, str]:
        if record.spec.foreign:  # the user's own image: AIStore's hpush (aisimage.py)
            return aisimage.request_headers(size)
        token = auth.transformer_token(self.cluster_key, record.name, record.uid)
        return {"Authorization": f"Bearer {token}"}

    def _fail(self, etl: str, obj: str | None, error: str) -> None:
        self._failures[etl] += 1
        errors = self._last_errors.setdefault(etl, collections.deque(maxlen=LAST_ERRORS))
        errors.append({"time": time.time(), "object": obj, "sample": None, "error": error})
        log.warning("ETL %r, object %r: %s", etl, obj, error)

    # -- the data path ---------------------------------------------------------

    async def send(
        self,
        record: EtlRecord,
        tf: TransformerStatus,
        bucket: str,
        name: str,
        params: dict[str, str],
        body: bytes | AsyncIterator[bytes],
        size: int | None = None,
    ) -> DuplexResponse:
        """PUT ``body`` to ``tf`` (hpush) and return its answer, whatever its status.

        The one place a request reaches a transformer: ``transform`` and every step
        of a pipeline (``etl/pipeline.py``). A transformer that does not answer
        is counted and is a 503 naming the ETL, target, bucket and object; one silent
        past ``requestSeconds`` (AIStore's ``obj_timeout``) is a ``TransformTimeout``
        (422: no client retries it, as AIStore fails such an object once).
        """
        assert tf.endpoint is not None
        url = f"{tf.endpoint.rstrip('/')}/{quote(bucket, safe='')}/{quote(name, safe='/')}"
        limit = record.spec.request_timeout_seconds
        try:
            return await self.duplex.request(
                "PUT",
                url,
                params=params,
                body=body,
                headers=self._headers(record, size),
                timeout=limit + TIMEOUT_SLACK,
            )
        except DuplexError as e:
            if isinstance(body, AsyncIterator):
                await body.aclose()  # type: ignore[attr-defined]
            if (upstream := upstream_error(e, self.target_id, bucket, name)) is not None:
                raise upstream from None  # the step before broke, not this transformer
            if isinstance(e, Timeout):
                self._fail(record.name, f"{bucket}/{name}", f"transformer timed out: {e}")
                raise TransformTimeout(
                    f"ETL {record.name!r} did not transform {bucket}/{name} within its "
                    f"per-object timeout of {limit:g}s (obj_timeout, timeouts.requestSeconds) "
                    f"on target {self.target_id!r}",
                    etl=record.name,
                    bucket=bucket,
                    object=name,
                ) from None
            self._fail(record.name, f"{bucket}/{name}", f"transformer unreachable: {e}")
            raise EtlNotReady(
                f"the transformer of ETL {record.name!r} on target {self.target_id!r} "
                f"did not answer ({type(e).__name__}: {e}); retry shortly",
                etl=record.name,
                bucket=bucket,
                object=name,
            ) from None

    async def transform(
        self,
        bucket: str,
        name: str,
        etl_name: str,
        etl_args: str | None,
        source: AsyncIterator[bytes] | None = None,
        client: bool = False,
        zerocopy: bool = False,
        cached: bool = True,
        skip: int = 0,
    ) -> Response:
        """``source``: the object's bytes as they arrive (a remote bucket's cold object)
        instead of the stored file; not for ``fqn`` ETLs. ``client``: the caller is an
        HTTP client that follows redirects (a GET), so a big object may get the 307.
        ``zerocopy``: its server sends files (a cache hit); ``cached=False``: skip the cache.
        ``skip``: a wds ETL leaves out the shard's first ``skip`` samples untransformed
        (``etl_skip``); such an answer is never looked up in the cache nor stored there."""
        # Refuse unknown/stopped/not-ready ETLs before touching the disk.
        record = self.record(etl_name)
        if skip and (record.spec.mode != "wds" or record.spec.foreign):
            raise InvalidRequest(
                f"etl_skip={skip}: ETL {etl_name!r} is not a wds ETL of Sluice's runtime "
                f"(mode {record.spec.mode!r}), so it has no samples to skip; drop etl_skip",
                etl=etl_name,
                bucket=bucket,
                object=name,
            )
        tf = self.transformer(record)
        cached = cached and not skip  # a part of a shard is never its whole output
        if cached and record.spec.cache and source is None and self.cache is not None:
            relay = lambda: self.transform(bucket, name, etl_name, etl_args, cached=False)  # noqa: E731
            return await self.cache.answer(record, bucket, name, etl_args, zerocopy, relay)
        # By path when the transformer can read our files: no object bytes travel
        # to it; its worker reads the file itself. Not for a cold remote object that
        # is still arriving (``source``): its file is not complete yet.
        fqn = record.spec.arg_type == "fqn" or (self.fqn_always and source is None)
        fqn = fqn and not record.spec.foreign  # an ETL image gets the bytes (aisimage.py)
        obj = f"{bucket}/{name}"
        if client and fqn and source is None and self.redirect_bytes == 0:
            # Every size goes to the transformer: only the path is needed, no thread
            # hop to open the file (a stat and a realpath on the loop, as for a 404).
            path = str(self.store.object_file(bucket, name))  # ObjectNotFound: 404
            return self._redirect(record, tf, bucket, name, path, etl_args, skip)
        if source is not None and not fqn:
            f, inline = None, None
        else:
            # One thread hop opens the object and, when small, reads it too.
            f, info, inline = await anyio.to_thread.run_sync(self._open, bucket, name, fqn)
            if client and fqn and self.redirect_bytes is not None:
                if info.size >= self.redirect_bytes:
                    f.close()
                    path = str(Path(f.name).resolve())
                    return self._redirect(record, tf, bucket, name, path, etl_args, skip)
        size: int | None = None
        try:
            params: dict[str, str] = {}
            if etl_args is not None:
                params["etl_args"] = etl_args
            if skip:
                params[ETL_SKIP] = str(skip)
            content: bytes | AsyncIterator[bytes]
            if f is None:
                assert source is not None
                content = source
            elif fqn:
                params.update(self.fqn_params(record.name, str(Path(f.name).resolve())))
                content = b""
                f.close()
            elif inline is not None:
                content = inline
            else:
                content, size = file_chunks(f), info.size  # closes f
        except BaseException:
            if f is not None:
                f.close()
            raise
        response = await self.send(record, tf, bucket, name, params, content, size)
        if response.status_code != 200:
            raise await self._transformer_error(response, etl_name, bucket, name)
        media_type = response.headers.get("content-type", "application/octet-stream")
        headers = {"X-Sluice-Etl": etl_name}
        if generation := response.headers.get(SPEC_HASH_HEADER.lower()):
            headers[SPEC_HASH_HEADER] = generation  # what a cache keys on (outcache.py)
        if skip:  # what the transformer skipped, for the reader to check (webserver/shards.py)
            for header in SKIPPED_HEADERS:
                if value := response.headers.get(header.lower()):
                    headers[header] = value
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) <= WHOLE_BODY_MAX:
            # Known, small: read it whole and answer with Content-Length, one write.
            try:
                body = await response.read(int(length))
            except DuplexError as e:
                self._fail(etl_name, obj, f"transformer answer broke off: {e}")
                raise TransformerFailed(
                    502,
                    {"error": f"the answer of ETL {etl_name!r} broke off: {e}", "etl": etl_name},
                    bucket=bucket,
                    object=name,
                ) from None
            # memoryview: uvicorn's transport then buffers what the socket does not
            # take at once without slicing a copy of it first.
            return Response(memoryview(body), media_type=media_type, headers=headers)
        return StreamingResponse(
            self._relay(response, etl_name, obj, tar=record.spec.mode == "wds"),
            media_type=media_type,
            headers=headers,
        )

    def _redirect(
        self,
        record: EtlRecord,
        tf: TransformerStatus,
        bucket: str,
        name: str,
        fqn: str,
        etl_args: str | None,
        skip: int = 0,
    ) -> Response:
        """307 to ``GET {transformer}/B/O?etl_fqn=<fqn>``, signed for this object only
        (``etl_skip`` beside the signature: it can only make the answer shorter)."""
        assert tf.endpoint is not None
        token = auth.transformer_token(self.cluster_key, record.name, record.uid)
        query = self.fqn_params(record.name, fqn)
        if etl_args is not None:
            query["etl_args"] = etl_args
        if skip:
            query[ETL_SKIP] = str(skip)
        query.update(auth.sign_direct(token, f"{bucket}/{name}", fqn, etl_args))
        url = f"{tf.endpoint.rstrip('/')}/{quote(bucket, safe='')}/{quote(name, safe='/')}"
        return Response(
            status_code=307,
            headers={"Location": f"{url}?{urlencode(query)}", "X-Sluice-Etl": record.name},
        )

    def fqn_params(self, etl: str, path: str) -> dict[str, str]:
        """``etl_fqn`` for ETL ``etl``'s transformer, with its grant while the broker runs."""
        if self.grant_key is None:
            return {"etl_fqn": path}
        return {"etl_fqn": path, grants.PARAM: grants.sign(self.grant_key, etl, path)}

    async def _transformer_error(
        self, response: DuplexResponse, etl: str, bucket: str, name: str
    ) -> SluiceError:
        if (rec := self.registry.get(etl)) is not None and rec.spec.foreign:
            return await aisimage.error(response, rec, bucket, name, self.target_id)
        try:
            body = await response.read(ERROR_BODY_MAX)
        except DuplexError:
            body = b""
        return TransformerFailed.answered(
            response.status_code,
            body,
            etl,
            response.headers.get("retry-after"),
            bucket=bucket,
            object=name,
        )

    async def _relay(
        self, response: DuplexResponse, etl: str, obj: str, tar: bool = False
    ) -> AsyncIterator[bytes | memoryview]:
        """``tar``: a wds answer, followed so that a break is marked (``wire/tarbreak``)."""
        cursor = tarbreak.TarCursor() if tar else None
        try:
            async for chunk in response.aiter_bytes():
                # Starlette sends bytes and memoryviews as they are (a bytearray it
                # would try to encode); a view is also sliced by the transport uncopied.
                for piece in [chunk] if cursor is None else cursor.feed(chunk):
                    yield memoryview(piece)
            if cursor is not None and (held := cursor.flush()):
                yield held
        except DuplexError as e:
            self._fail(etl, obj, f"transformer stream broke off: {e!r}")
            if cursor is not None and (marker := cursor.broken(f"ETL {etl!r}, {obj!r}: {e}")):
                yield marker  # on a member boundary: no reader takes the tar for whole
            # Raising after the headers went out makes uvicorn drop the connection.
            marked = cursor.marked() if cursor is not None else None
            raise TransformerStreamBroken(f"ETL {etl!r}, object {obj!r}: {e!r}", etl, marked) from e
        finally:
            await response.aclose()

    def _open(self, bucket: str, name: str, fqn: bool) -> tuple[IO[bytes], Any, bytes | None]:
        """Open the object; read it whole (and close it) if it goes inline."""
        f, info = self.store.open_object(bucket, name)
        if fqn or info.size > WHOLE_BODY_MAX:
            return f, info, None
        with f:
            return f, info, f.read()

    # -- internal observability API --------------------------------------------

    async def stats(self, etl_name: str) -> dict[str, Any]:
        """The transformer's ``/stats`` plus this target's own forwarding failures."""
        record = self.record(etl_name)
        out: dict[str, Any] = {f: 0 for f in STAT_FIELDS}
        out.update(target=self.target_id, etl=etl_name, reachable=False, message=None)
        last: list[dict[str, Any]] = []
        tf = record.transformer_for(self.target_id)
        if record.spec.foreign:
            out["message"] = aisimage.STATS_MESSAGE.format(comm=record.spec.comm_type)
        elif tf is not None and tf.endpoint:
            try:
                r = await self.http.get(
                    f"{tf.endpoint.rstrip('/')}/stats", headers=self._headers(record), timeout=5.0
                )
                r.raise_for_status()
                theirs = r.json()
                for f in STAT_FIELDS:
                    out[f] = int(theirs.get(f) or 0)
                last.extend(theirs.get("last_errors") or [])
                out["reachable"] = True
            except (httpx.HTTPError, ValueError) as e:
                out["message"] = f"transformer stats unavailable: {e!r}"
        else:
            out["message"] = f"no transformer on target {self.target_id!r}"
        out["forward_errors"] = self._failures[etl_name]
        out["errors"] += self._failures[etl_name]
        if self.cache is not None and record.spec.cache:
            out.update(self.cache.stats(etl_name))
        last.extend(self._last_errors.get(etl_name, ()))
        out["last_errors"] = last[-LAST_ERRORS:]
        return out

    async def logs(self, etl_name: str, tail: int) -> str:
        record = self.record(etl_name)
        tf = record.transformer_for(self.target_id)
        if record.spec.foreign:
            raise aisimage.no_logs(record, self.target_id)
        if tf is None or not tf.endpoint:
            raise EtlNotReady(
                f"ETL {etl_name!r} has no transformer on target {self.target_id!r}",
                etl=etl_name,
                target=self.target_id,
            )
        try:
            r = await self.http.get(
                f"{tf.endpoint.rstrip('/')}/logs",
                params={"tail": tail},
                headers=self._headers(record),
                timeout=5.0,
            )
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise EtlNotReady(
                f"logs of ETL {etl_name!r} on target {self.target_id!r} unavailable: {e!r}",
                etl=etl_name,
                target=self.target_id,
            ) from None
        return r.text
