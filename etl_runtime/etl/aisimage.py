"""A target speaking AIStore's hpush protocol to a user's own ETL image.

An ETL created with the official aistore SDK's ``init(image=...)`` (or a Sluice
spec with ``commType: hpush://``) has the user's container as its transformer,
not Sluice's runtime. Such an image serves AIStore's ETL protocol, as AIStore's
targets speak it (``ext/etl/communicator.go``, "hpush"):

* ``GET /health``: 200 once it serves (the readiness probe; AIStore's pods are
  probed on their port ``8000``);
* ``PUT /<bucket>/<object>`` with the object as the body (``Content-Length``
  set) and ``?etl_args=...`` when the GET had them; the answer is the
  transformed object (200), or an error status with a text body.

``EtlForwarder`` (``forward.py``) sends the PUT as for Sluice's own transformer,
with what differs decided here:

* the body always, never ``etl_fqn`` nor a 307 to the transformer: the image
  cannot be assumed to see the target's disk (its server reads the body when no
  ``etl_fqn`` is given, as the SDK's servers do), and it verifies no signed GETs;
* no ``Authorization``: the image knows no Sluice token; nor ``Ais-Node-Url``
  (direct put): the target writes what it gets back;
* a known ``Content-Length`` on a streamed body (AIStore always sends one; a
  stdlib ``http.server`` reads no chunked body); as a later step of a pipeline
  it gets the previous step's output whole (``whole``: held in memory); only a
  cold remote object still arriving goes chunked;
* an error the user's server answers is never passed on as data nor with its
  own status: it becomes a 422 ``TransformerFailed`` naming the ETL, image,
  bucket and object with the server's status and text (a 503 from it stays a
  503 with ``Retry-After``: it is busy, a retry helps); a 204 (AIStore's
  "delivered by direct put", which was not asked for) is a 502.

The image has no ``/stats`` nor ``/logs``: a target's stats of such an ETL are
its own counts; logs are the container's (``podman logs`` / ``kubectl logs``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.errors import (
    DuplexError,
    EtlNotReady,
    InvalidRequest,
    SluiceError,
    TransformerFailed,
)
from etl_runtime.wire.clients.duplex import DuplexResponse

ERROR_TEXT_MAX = 2000
ERROR_BODY_MAX = 64 << 10
HEALTH_PATH = "/health"
PORT = 8000  # AIStore's DefaultContainerPort: what its images listen on
STATS_MESSAGE = (
    "an ETL image (commType {comm}) serves no /stats: these are this target's own counts"
)


async def whole(body: AsyncIterator[bytes]) -> bytes:
    """A pipeline step's input (the previous ETL's output, of unknown length) in one
    piece: a user's server may read only a body with ``Content-Length``. In memory."""
    out = bytearray()
    async for chunk in body:
        out += chunk
    return bytes(out)


def request_headers(size: int | None) -> dict[str, str]:
    """Headers of the hpush PUT: only the body's length when it is streamed."""
    return {} if size is None else {"Content-Length": str(size)}


def describe(record: EtlRecord) -> str:
    return f"ETL {record.name!r} (image {record.spec.image!r})"


async def error(
    response: DuplexResponse, record: EtlRecord, bucket: str, name: str, target: str
) -> SluiceError:
    """What a non-200 answer of the user's server becomes (read, then closed)."""
    status = response.status_code
    try:
        raw = await response.read(ERROR_BODY_MAX)
    except DuplexError:
        raw = b""
    finally:
        await response.aclose()
    text = raw.decode(errors="replace").strip()[:ERROR_TEXT_MAX]
    obj = f"{bucket}/{name}"
    said = f": {text}" if text else " (no text)"
    if status == 503:
        return EtlNotReady(
            f"{describe(record)} on target {target!r} is busy for {obj!r} "
            f"(its server answered 503{said}); retry shortly",
            etl=record.name,
            bucket=bucket,
            object=name,
        )
    if status == 204:
        return TransformerFailed(
            502,
            {
                "error": f"{describe(record)} answered 204 for {obj!r} (AIStore's 'delivered "
                "by direct put'), which Sluice does not ask for: it sends no Ais-Node-Url; "
                "the image must answer the transformed object",
                "etl": record.name,
                "transformer_status": status,
            },
            bucket=bucket,
            object=name,
        )
    return TransformerFailed(
        422,
        {
            "error": f"{describe(record)} failed to transform {obj!r}: its server answered "
            f"{status}{said}",
            "etl": record.name,
            "transformer_status": status,
        },
        bucket=bucket,
        object=name,
    )


def no_logs(record: EtlRecord, target: str) -> SluiceError:
    where = (
        f"read the container's: `podman logs` of the one named after {record.name!r} and "
        f"target {target!r} (sluice up), or `kubectl logs` of its transformer pod"
    )
    return InvalidRequest(
        f"{describe(record)} serves no /logs (an AIStore-style image): {where}",
        etl=record.name,
        target=target,
    )
