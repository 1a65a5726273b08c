"""Every exception the Sluice SDK raises, and the one place HTTP statuses map to them.

Hierarchy::

    SluiceError                      anything the SDK raises on purpose
    ├── HTTPError                    the cluster answered with an error status
    │   ├── BadRequest               400: bad bucket/object name, invalid ETL spec
    │   ├── Unauthorized             401: missing or wrong token
    │   ├── Forbidden                403: a token limited to other buckets (names the bucket)
    │   ├── NotFound                 404: no such bucket, object or ETL
    │   ├── Conflict                 409: ETL stopped, name clash, bucket exists
    │   ├── Unavailable              503/429: ETL not ready yet, target away, busy
    │   └── ServerError              other 5xx
    │       ├── InsufficientStorage  507: the target's disk is full; never retried
    │       └── TransformError       422 (or 5xx naming a sample): a transform failed
    │                                (also an EtlError)
    ├── EtlError                     an ETL went to phase Error or never became Running
    │   └── TransformError
    └── NetworkError                 could not reach the cluster / timed out
        └── StreamError              the connection broke in the middle of a body

Every error carries ``message`` (the server's own words when there are any),
``status`` (HTTP status or ``None``), ``kind`` (the server's error kind) and the
context the server or the call knew: ``bucket``, ``object``, ``etl``, ``sample``,
``detail`` (a traceback tail from a failing transform) and ``target`` (the
storage target the server named), and ``tries``: how many times the call was
sent (``Client`` retries 503/429 and connection failures, never a 507, see
``retry.py``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

CONTEXT_FIELDS = ("bucket", "object", "etl", "sample", "detail", "target")
TRANSFORM_KINDS = ("TransformError", "BadResult")


class SluiceError(Exception):
    """Base class: a message a user can act on, plus whatever context is known."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        kind: str | None = None,
        bucket: str | None = None,
        object: str | None = None,  # noqa: A002 - the domain word, as in the JSON
        etl: str | None = None,
        sample: str | None = None,
        detail: str | None = None,
        phase: str | None = None,
        target: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.bucket = bucket
        self.object = object
        self.etl = etl
        self.sample = sample
        self.detail = detail
        self.phase = phase
        self.target = target
        self.tries = 1

    def __str__(self) -> str:
        return self.message if self.status is None else f"{self.message} (HTTP {self.status})"


class HTTPError(SluiceError):
    """The cluster answered with a 4xx/5xx status."""


class BadRequest(HTTPError):
    """400: the request names something invalid (the message says what)."""


class Unauthorized(HTTPError):
    """401: the cluster has a token and the request did not carry it."""


class Forbidden(HTTPError):
    """403: the token is valid but limited to other buckets (``bucket`` names the one
    refused), or may only read; or the call is not about one bucket."""


class NotFound(HTTPError):
    """404: no such bucket, object or ETL."""


class Conflict(HTTPError):
    """409: the thing exists in a state that forbids the call (e.g. ETL stopped)."""


class Unavailable(HTTPError):
    """503 or 429: try again later (ETL initializing, owner target away, busy).

    ``Client`` already retried it (``retries``) before raising it.
    """


class ServerError(HTTPError):
    """A 5xx other than 503."""


class InsufficientStorage(ServerError):
    """507: the target that owns the object has no space left (or its quota is spent).

    Nothing of the write was stored. ``Client`` never retries it (trying again
    cannot help until space is freed); ``target``, ``bucket`` and ``object``
    name where it happened.
    """


class EtlError(SluiceError):
    """An ETL is in phase Error, did not become Running in time, or failed a transform."""


class TransformError(ServerError, EtlError):
    """The user's transform raised while serving an object (names the sample if any).

    Transformers answer it with 422, so that clients that retry 5xx (curl in
    webdataset's ``--retry``) do not retry a deterministic failure; it stays a
    ``ServerError`` subclass so existing ``except ServerError`` code still
    catches it, and a 5xx naming a sample (older transformers) maps here too.
    """


class NetworkError(SluiceError):
    """The cluster could not be reached, or did not answer in time."""


class StreamError(NetworkError):
    """A body stopped before its end: the data received so far is incomplete."""


_BY_STATUS: dict[int, type[HTTPError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: Unavailable,
    503: Unavailable,
    507: InsufficientStorage,
}


def error_class(status: int, body: dict[str, Any]) -> type[HTTPError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status == 422 and (body.get("etl") or body.get("kind") in TRANSFORM_KINDS):
        return TransformError
    if status >= 500:
        # A transformer's failure comes back with the ETL (and maybe sample) named.
        if body.get("etl") and ("sample" in body or "detail" in body):
            return TransformError
        return ServerError
    return HTTPError


def _body_of(response: httpx.Response) -> dict[str, Any]:
    try:
        data = json.loads(response.content) if response.content else {}
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data
    text = response.content.decode(errors="replace").strip()
    return {"error": text[:500]} if text else {}


def from_response(response: httpx.Response, **context: str | None) -> HTTPError:
    """Build the typed error for an error response (its body must have been read).

    ``context`` is what the caller knows (bucket, object, etl); the server's JSON
    wins where it says more.
    """
    body = _body_of(response)
    fields: dict[str, Any] = {k: v for k, v in context.items() if v is not None}
    for key in CONTEXT_FIELDS:
        if body.get(key) is not None:
            fields[key] = str(body[key])
    message = body.get("error") or body.get("message") or body.get("detail")
    if not isinstance(message, str) or not message:
        message = _default_message(response.status_code, fields)
    cls = error_class(response.status_code, body)
    return cls(message, status=response.status_code, kind=body.get("kind"), **fields)


def _default_message(status: int, fields: dict[str, Any]) -> str:
    """A message for bodiless answers (HEAD, proxies): name what was asked for."""
    what = ""
    if fields.get("etl"):
        what = f"ETL {fields['etl']!r}"
    if fields.get("bucket"):
        name = fields["bucket"] + (f"/{fields['object']}" if fields.get("object") else "")
        what = f"{'object' if fields.get('object') else 'bucket'} {name!r}" + (
            f" via {what}" if what else ""
        )
    reason = httpx.codes.get_reason_phrase(status) or "error"
    if status == 404 and what:
        return f"{what} not found"
    return f"{reason}: {what}" if what else f"HTTP {status} {reason}"


def from_transport(exc: httpx.TransportError, what: str) -> NetworkError:
    """Wrap httpx's connection/timeout/protocol errors; ``what`` names the call."""
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return StreamError(f"{what}: connection broke before the whole body arrived ({exc})")
    if isinstance(exc, httpx.TimeoutException):
        return NetworkError(f"{what}: timed out ({type(exc).__name__})")
    return NetworkError(f"{what}: {exc or type(exc).__name__}")
