"""The one error tree of every Sluice server, each class mapped to one HTTP status here.

Every failure a user can cause or observe is a ``SluiceError``; the class says
the HTTP status and the ``kind`` that appears in the JSON body (its class
name), and the instance carries the context (bucket, object, ETL, sample, ...)
so the message can name the thing that went wrong. The gateway, the storage
targets and the transformer runtime all raise these classes; the SDK keeps its
own public exceptions, mapped from the wire shape in ``etl_runtime.sdk.errors``::

    SluiceError (500, kind InternalError)
    ├── BadRequest (400)            InvalidName, InvalidRequest, InvalidSpec,
    │                               InvalidDsortSpec, NotATar, DecodeError,
    │                               EtlInitFailed (AIStore's synchronous init)
    ├── Unauthorized (401)          missing or wrong bearer token
    ├── Forbidden (403)             a token whose bucket scope does not cover the call
    ├── FileRefused (403)           a target's file broker refused a transformer an
    │                               object's file (``etl/grants.py``): names the object
    ├── BackendUnauthorized (401)   remote bucket: no credentials, or rejected
    ├── BackendForbidden (403)      remote bucket: the credentials may not do this
    ├── NotFound (404)              BucketNotFound, ObjectNotFound, EtlNotFound, JobNotFound
    ├── Conflict (409)              ObjectConflict, BucketExists, EtlStopped
    ├── PreconditionFailed (412)    ``If-Match`` names another version
    ├── PayloadTooLarge (413)       a JSON or action body over ``core/jsonbody.py``'s bound
    ├── RangeNotSatisfiable (416)   ``Range`` starts past the end of the object
    ├── TransformError (422)        the user's function raised on this object/sample
    ├── BadResult (422)             the user's function returned something unusable
    ├── TransformTimeout (422)      longer than ``spec.timeouts.requestSeconds`` (AIStore's
    │                               ``obj_timeout``) on this object
    ├── UnsafeShard (422)           wds/GetBatch: a tar member name that is absolute, has
    │                               ``..`` or passes a symlink, or a header over its bound
    ├── BackendError (502)          a remote backend answered something unmappable
    ├── Unavailable (503)           EtlNotReady, NoTargets, BackendUnavailable,
    │                               WorkerDied (a transformer's worker process died on
    │                               the call: it is replaced); each with ``Retry-After``
    ├── NotReady (503)              a transformer's code is still loading
    ├── InsufficientStorage (507)   a target's disk is full (ENOSPC) or its quota spent
    │                               (EDQUOT); names the target, bucket and object
    ├── TransformerFailed           a target relays its transformer's status and body
    └── S3Error                     the gateway's S3 API (``/s3``): S3's own error code
                                    (``NoSuchKey``, ``SignatureDoesNotMatch``, ...) and
                                    status, answered as S3's XML (``gateway/s3/errors.py``)

    StartupError                    permanent transformer start-up failure: exit code 2,
    ├── CodeLoadError               never an HTTP answer (user code does not load,
    ├── PythonVersionMismatch       pickled with another Python major.minor,
    └── DependencyError             ``spec.dependencies`` failed to install)

    DsortFailed                     what a dSort job records as its error; never
                                    raised through a request handler

    DuplexError                     a target's exchange with its transformer failed
    ├── ConnectError                (``etl_runtime.wire.clients.duplex``; the forwarder turns it
    ├── Timeout                     into one of the answers above or an aborted
    └── StreamBroken                stream, never shown as it is)

Two JSON shapes carry them: a gateway's or target's ``body()``
(``{"error", "kind", **context}``), and the transformer's hpush error body
``hpush_body(etl, object)`` (``{"error", "kind", "etl", "object", "sample",
"detail"}``). ``etl_runtime.wire.http.errors`` installs the FastAPI handlers.

Why 422 and not 500 for a failing user function: such a failure is
deterministic (the same function on the same object fails the same way), so
it must not look retryable. ``webdataset`` opens URLs with ``curl -f -s -L
--retry 30 --retry-delay 2``, and curl retries 408, 429, 500, 502, 503 and
504: a 500 made every DataLoader worker re-fetch a broken shard for a minute
before failing. 422 fails at once and still names the ETL, object and sample.

Why 507 and not 500 or 503 for a full disk: trying again cannot help until
space is freed, so it must not look retryable either; 507 is no status that
curl, the SDK or the gateway retries, and the gateway passes it on as the
target answered it (never as ``NoTargets``).

Errors raised inside a transformer worker process travel to its server as a
plain dict (``to_wire`` / ``from_wire``) and become the same classes again there.
"""

from __future__ import annotations

import json
import re
import traceback
from typing import Any

EXIT_CONFIG_ERROR = 2  # same meaning as etl_runtime.cluster.reconcile.EXIT_CONFIG_ERROR
DETAIL_LINES = 12


_FRAME_FILE = re.compile(r'^(\s*File ")(/[^"]*)(")', re.MULTILINE)


def _frame_file(path: str) -> str:
    """A traceback frame's file without the directories it lives in (no error body names
    a filesystem path): from the package on, or its folder and name."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    at = path.rfind("/etl_runtime/")
    return path[at + 1 :] if at >= 0 else "/".join(path.split("/")[-2:])


def traceback_tail(exc: BaseException, max_lines: int = DETAIL_LINES) -> str:
    """The ``detail`` of an error body: the last lines of ``exc``'s traceback, each
    frame's file named without its directories."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    text = _FRAME_FILE.sub(lambda m: m[1] + _frame_file(m[2]) + m[3], text)
    return "\n".join(text.splitlines()[-max_lines:])


class SluiceError(Exception):
    status = 500
    kind = "InternalError"  # subclasses: their class name (see __init_subclass__)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__

    def __init__(
        self,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        sample: str | None = None,
        detail: str | None = None,
        **context: Any,
    ):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.sample = sample
        self.detail = detail
        self.context = {k: v for k, v in context.items() if v is not None}

    def body(self) -> dict[str, Any]:
        """The JSON error body of the gateway and the targets."""
        return {"error": self.message, "kind": self.kind, **self.context}

    def hpush_body(self, etl: str, obj: str | None) -> dict[str, Any]:
        """The JSON error body of the transformer's hpush protocol."""
        return {
            "error": self.message,
            "kind": self.kind,
            "etl": etl,
            "object": obj,
            "sample": self.sample,
            "detail": self.detail,
        }

    def to_wire(self) -> dict[str, Any]:
        """What a transformer worker sends its server (``from_wire`` reads it)."""
        return {
            "kind": self.kind,
            "message": self.message,
            "sample": self.sample,
            "detail": self.detail,
        }


class BadRequest(SluiceError):
    status = 400


class InvalidName(BadRequest):
    pass


class InvalidRequest(BadRequest):
    pass


class InvalidSpec(BadRequest, ValueError):
    """A bad ETL spec (``etl_runtime.core.spec`` raises it; also a ``ValueError``)."""


class InvalidDsortSpec(BadRequest):
    """A dSort spec field is missing, of the wrong type or unsupported (``field`` names it)."""

    def __init__(self, field: str, message: str, **context: Any) -> None:
        super().__init__(f"dsort spec: {field}: {message}", field=field, **context)
        self.field = field


class EtlInitFailed(BadRequest):
    """An ETL created with AIStore's init message (which waits, as AIStore's does)
    went to phase Error (its class does not load, another Python, a dependency
    that does not install) or was not running in time; names the ETL. Not a
    503/504: the official SDK retries those, and each retry would wait again."""


class NotATar(BadRequest):
    """wds mode: the object is not a tar shard."""


class DecodeError(BadRequest):
    """wds mode: a sample field does not decode."""


class Unauthorized(SluiceError):
    status = 401

    def __init__(self, message: str = "", **context: Any):
        super().__init__(
            message or "this call changes data: send 'Authorization: Bearer <SLUICE_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
            **context,
        )


class Forbidden(SluiceError):
    """A valid access token (``core/tokens.py``) whose scope does not cover the call."""

    status = 403


class FileRefused(SluiceError):
    """A target's file broker refused its transformer an object's file (``etl_fqn``):
    no grant, a grant not the target's or expired, or one for another ETL's uid."""

    status = 403


class BackendUnauthorized(SluiceError):
    status = 401


class BackendForbidden(SluiceError):
    status = 403


class NotFound(SluiceError):
    status = 404


class BucketNotFound(NotFound):
    pass


class ObjectNotFound(NotFound):
    pass


class EtlNotFound(NotFound):
    pass


class JobNotFound(NotFound):
    pass


class Conflict(SluiceError):
    status = 409


class ObjectConflict(Conflict):
    pass


class EtlStopped(Conflict):
    pass


class BucketExists(Conflict):
    pass


class ViewReadOnly(SluiceError):
    """A write to an ETL view (``etl_runtime.gateway.views``): views store nothing."""

    status = 405


class PreconditionFailed(SluiceError):
    status = 412


class PayloadTooLarge(SluiceError):
    """A request body over the route's bound (``core/jsonbody.py``: JSON and action bodies)."""

    status = 413


class RangeNotSatisfiable(SluiceError):
    status = 416


def bucket_not_found(bucket: str) -> BucketNotFound:
    """The one message for a missing bucket.

    ``ais://<bucket>`` in the text is what the aistore SDK parses to raise
    ``ErrBckNotFound`` (and ``ais://<bucket>/<object>`` ``ErrObjNotFound``).
    """
    return BucketNotFound(
        f"bucket ais://{bucket} does not exist; create it with POST /v1/buckets/{bucket}",
        bucket=bucket,
    )


class TransformError(SluiceError):
    status = 422  # deterministic: must not be retried (see the module docstring)


class BadResult(SluiceError):
    status = 422


class UnsafeShard(SluiceError):
    """A shard refused for safety: an unsafe member name (absolute, ``..``, through a
    symlink member) or a pax/long-name header over its bound
    (``wire/formats/targuard.py``). Deterministic, so 422 as ``TransformError``."""

    status = 422


class WorkerDied(SluiceError):
    """A transformer's worker process died on this call: the user's code exited,
    crashed or was killed (out of memory, say). The pool replaces the worker, so a
    retry may pass: 503 + ``Retry-After``, as when an inline transformer's server
    process dies (the target then answers ``EtlNotReady``). Not a 500: nothing in
    Sluice failed."""

    status = 503

    def __init__(self, message: str, retry_after: int = 2, **context: Any):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, **context)


class BackendError(SluiceError):
    """A remote backend answered something we cannot map more precisely (502)."""

    status = 502


class Unavailable(SluiceError):
    status = 503

    def __init__(self, message: str, retry_after: int = 5, **context: Any):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, **context)


class ObjectCorrupted(SluiceError):
    """An object's bytes on a target do not match the checksum stored at write time.

    503 naming bucket, object and target; ``Retry-After`` only while a copy that
    may be good could not be reached (a repair may still succeed), else none:
    retrying cannot help until the object is rewritten. Never served."""

    status = 503

    def __init__(self, message: str, retry_after: int | None = None, **context: Any):
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        super().__init__(message, headers=headers, **context)


class EtlNotReady(Unavailable):
    pass


class NoTargets(Unavailable):
    pass


BACKEND_RETRY_AFTER_SECONDS = 5


class BackendUnavailable(Unavailable):
    """A remote backend does not answer."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message, retry_after=BACKEND_RETRY_AFTER_SECONDS, **context)


class NotReady(SluiceError):
    """A transformer's code is still loading, or its pool starting: retry shortly."""

    status = 503

    def __init__(self, message: str, retry_after: int = 2, **context: Any):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, **context)


class RegistryUnreadable(SluiceError):
    """An ETL's record exists but cannot be read or parsed (permissions, a torn file):
    the operator's to fix, so no ``Retry-After``; never answered as "no such ETL"."""

    status = 503


class TransformTimeout(SluiceError):
    """A transform ran past ``spec.timeouts.requestSeconds`` (AIStore's ``obj_timeout``).

    422, not 504: the official SDK, boto3 and curl retry a 504, and each retry
    waits the whole timeout again (the SDK's six tries took 100 s for a 2 s
    timeout); the object fails once, at once, as AIStore fails it (which
    answers such an object with a 400)."""

    status = 422


class InsufficientStorage(SluiceError):
    """A target has no space left (``ENOSPC``) or its disk quota is spent (``EDQUOT``).

    Nothing of the write was kept (no partial object, no temp file); the
    context names the ``target``, ``bucket`` and ``object``.
    """

    status = 507


class TransformerFailed(SluiceError):
    """A transformer answered an error: its status and JSON body are passed on."""

    def __init__(
        self,
        status: int,
        payload: dict[str, Any],
        retry_after: str | None = None,
        **context: Any,
    ):
        # a 503 is passed on as one a client may retry: with the transformer's
        # Retry-After, or one of ours
        headers = {"Retry-After": retry_after or "2"} if status == 503 else None
        message = str(payload.get("error") or f"transformer answered {status}")
        super().__init__(message, headers, **context)
        self.status = status
        self.payload = payload

    def body(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.payload, **self.context, "error": self.message}

    @classmethod
    def answered(
        cls,
        status: int,
        body: bytes | bytearray,
        etl: str,
        retry_after: str | None = None,
        **context: Any,
    ) -> TransformerFailed:
        """A Sluice transformer's error answer: ``status`` and its JSON (or text) ``body``
        (``retry_after``: its ``Retry-After`` header, if any)."""
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            text = body.decode(errors="replace").strip()[:500]
            payload = {"error": f"transformer answered {status}: {text}"}
        payload.setdefault("etl", etl)
        return cls(status, payload, retry_after, **context)


class S3Error(SluiceError):
    """An S3 API error: S3's ``code`` and its status (the ``/s3`` routes answer XML).

    Other ``SluiceError``s raised under ``/s3`` are mapped to an S3 code by
    their ``kind`` (``etl_runtime.gateway.s3.errors``); this class carries the
    codes that have no Sluice counterpart (``SignatureDoesNotMatch``,
    ``BucketNotEmpty``, ``NoSuchUpload``, ...).
    """

    def __init__(self, code: str, status: int, message: str, **context: Any):
        super().__init__(message, **context)
        self.code = code
        self.status = status


_WIRE_KINDS: dict[str, type[SluiceError]] = {
    cls.kind: cls
    for cls in (
        SluiceError,
        BadRequest,
        NotATar,
        DecodeError,
        ObjectNotFound,
        TransformError,
        BadResult,
        WorkerDied,
    )
}


def from_wire(d: dict[str, Any]) -> SluiceError:
    cls = _WIRE_KINDS.get(str(d.get("kind")), SluiceError)
    return cls(str(d.get("message")), sample=d.get("sample"), detail=d.get("detail"))


class StartupError(Exception):
    """A permanent configuration error: restarting the transformer cannot help."""

    exit_code = EXIT_CONFIG_ERROR


class CodeLoadError(StartupError):
    pass


class PythonVersionMismatch(StartupError):
    pass


class DependencyError(StartupError):
    pass


class DsortFailed(Exception):
    """A dSort job cannot go on; the message names the shard, record or target."""


class DuplexError(Exception):
    """Base: the exchange with the server failed."""


class ConnectError(DuplexError):
    """The server could not be reached."""


class Timeout(DuplexError):
    """No progress for longer than the timeout."""


class StreamBroken(DuplexError):
    """The connection broke or the server broke the protocol mid-exchange."""
