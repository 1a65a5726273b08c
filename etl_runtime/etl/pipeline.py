"""ETL pipelines: ``?etl_name=a&etl_pipeline=b,c`` applies a, then b, then c.

On the target that owns the object, the first ETL transforms it as a plain
``?etl_name=a`` GET would (``EtlForwarder.transform``); its answer streams as
the body of the next transformer's request, and so on: intermediate results
go transformer to transformer through this target's memory a chunk at a time
and are never stored. ``etl_args`` goes to every step.

The whole chain is checked before anything runs (``check_chain``): an ETL
that does not exist is a 404 naming it; an ETL whose mode (``object`` or
``wds``) differs from the first's is a 400 naming both; an ETL reading files
by path (``argType: fqn``) can only be first (there is no file after step 1).
The gateway runs the same check before it redirects (``check_chain_async``).

A break anywhere in the chain after streaming began drops the client's
connection (the response is incomplete, never mistaken for a whole result),
as for a single ETL. In wds mode every step is relayed through a
``tarbreak.TarCursor``: a break in step 1 cuts step 2's stream wherever the
target stopped feeding it, often on a member boundary, so the last step's
relay adds an error member there before the abort (``forward._relay``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi.responses import Response, StreamingResponse

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.errors import EtlNotFound, InvalidRequest
from etl_runtime.etl import aisimage
from etl_runtime.etl.forward import EtlForwarder
from etl_runtime.etl.streambreak import TransformerStreamBroken, upstream_error

MAX_STEPS = 16


def parse_chain(etl_name: str | None, etl_pipeline: str | None) -> list[str]:
    """``etl_name`` then the comma-separated ``etl_pipeline``; [] without an ETL."""
    if not etl_name:
        if etl_pipeline:
            raise InvalidRequest("etl_pipeline needs etl_name (the first ETL of the chain)")
        return []
    chain = [etl_name, *[n.strip() for n in (etl_pipeline or "").split(",") if n.strip()]]
    if len(chain) > MAX_STEPS:
        raise InvalidRequest(f"an ETL pipeline has at most {MAX_STEPS} steps, got {len(chain)}")
    return chain


def check_records(chain: Sequence[str], records: Sequence[EtlRecord | None]) -> None:
    """404 for an unknown ETL, 400 for a mode mismatch or a non-first ``fqn`` ETL."""
    for name, record in zip(chain, records, strict=True):
        if record is None:
            raise EtlNotFound(
                f"ETL {name!r} of the pipeline {','.join(chain)} does not exist; list ETLs "
                "with GET /v1/etl",
                etl=name,
            )
    first = records[0]
    assert first is not None
    for name, record in zip(chain[1:], records[1:], strict=True):
        assert record is not None
        if record.spec.mode != first.spec.mode:
            raise InvalidRequest(
                f"ETL {name!r} is a {record.spec.mode!r} ETL but the pipeline starts with "
                f"{chain[0]!r}, a {first.spec.mode!r} ETL: every step must have the same mode",
                etl=name,
            )
        if record.spec.arg_type == "fqn":
            raise InvalidRequest(
                f"ETL {name!r} reads objects by file path (argType 'fqn'), so it can only be "
                "the first step of a pipeline",
                etl=name,
            )


def check_chain(fwd: EtlForwarder, chain: Sequence[str]) -> list[EtlRecord]:
    records = [fwd.registry.get(n) for n in chain]
    check_records(chain, records)
    return [r for r in records if r is not None]


async def check_chain_async(
    get: Callable[[str], Awaitable[EtlRecord | None]], chain: Sequence[str]
) -> list[EtlRecord]:
    records = [await get(n) for n in chain]
    check_records(chain, records)
    return [r for r in records if r is not None]


def body_of(response: Response) -> AsyncIterator[bytes]:
    """The bytes of a ``Response`` or ``StreamingResponse`` as one async iterator."""
    if isinstance(response, StreamingResponse):
        return _bytes(response.body_iterator)  # type: ignore[arg-type]
    return _one(bytes(response.body))


async def _bytes(it: AsyncIterator[bytes | memoryview | str]) -> AsyncIterator[bytes]:
    try:
        async for chunk in it:
            yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
    finally:
        await it.aclose()  # type: ignore[attr-defined]


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _step(
    fwd: EtlForwarder,
    body: AsyncIterator[bytes],
    bucket: str,
    name: str,
    etl_name: str,
    etl_args: str | None,
) -> AsyncIterator[bytes]:
    """Send ``body`` (the previous step's output) through ETL ``etl_name``."""
    record = fwd.record(etl_name)
    params = {"etl_args": etl_args} if etl_args is not None else {}
    content: bytes | AsyncIterator[bytes] = body
    if record.spec.foreign:  # an ETL image reads a body of known length (aisimage.py)
        try:
            content = await aisimage.whole(body)
        except TransformerStreamBroken as e:  # the step before broke: its error
            raise upstream_error(e, fwd.target_id, bucket, name) or e from None
    response = await fwd.send(record, fwd.transformer(record), bucket, name, params, content)
    if response.status_code != 200:
        await body.aclose()  # type: ignore[attr-defined]
        raise await fwd._transformer_error(response, etl_name, bucket, name)
    wds = record.spec.mode == "wds"
    return _bytes(fwd._relay(response, etl_name, f"{bucket}/{name}", tar=wds))


async def transform_chain(
    fwd: EtlForwarder, bucket: str, name: str, chain: Sequence[str], etl_args: str | None
) -> AsyncIterator[bytes]:
    """The object through every ETL of ``chain``, as a stream (errors before it starts)."""
    check_chain(fwd, chain)
    for etl in chain:
        fwd.transformer(fwd.record(etl))  # 503 for a step without a ready transformer
    body = body_of(await fwd.transform(bucket, name, chain[0], etl_args))
    for etl in chain[1:]:
        body = await _step(fwd, body, bucket, name, etl, etl_args)
    return body


async def pipeline_response(
    fwd: EtlForwarder, bucket: str, name: str, chain: Sequence[str], etl_args: str | None
) -> Response:
    """The HTTP answer of a GET with ``etl_pipeline`` (one ETL: the plain transform)."""
    if len(chain) == 1:
        return await fwd.transform(bucket, name, chain[0], etl_args)
    body = await transform_chain(fwd, bucket, name, chain, etl_args)
    return StreamingResponse(
        body, media_type="application/octet-stream", headers={"X-Sluice-Etl": ",".join(chain)}
    )
