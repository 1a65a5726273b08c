"""Every error the transformer runtime reports, and the HTTP status of each.

The hierarchy, with the status each maps to (``TransformerError.status``; this
module is the only place a status is chosen)::

    TransformerError                 500  base: something failed on an object
    ├── BadRequest                   400  the request itself is unusable
    │   ├── NotATar                  400  wds mode: the object is not a tar shard
    │   └── DecodeError              400  wds mode: a sample field does not decode
    ├── Unauthorized                 401  missing or wrong bearer token
    ├── ObjectNotFound               404  ``etl_fqn`` names no readable file
    ├── TransformError               422  the user's function raised on this object/sample
    ├── BadResult                    422  the user's function returned something unusable
    ├── WorkerDied                   500  a worker process died while transforming
    ├── TransformTimeout             504  longer than ``spec.timeouts.requestSeconds``
    └── NotReady                     503  code still loading / pool still starting

    StartupError                          permanent: exit code 2, never an HTTP answer
    ├── CodeLoadError                     user code does not load
    ├── PythonVersionMismatch             pickled with another Python major.minor
    └── DependencyError                   ``spec.dependencies`` failed to install

Why 422 and not 500 for a failing user function: such a failure is
deterministic (the same function on the same object fails the same way), so
it must not look retryable. ``webdataset`` opens URLs with ``curl -f -s -L
--retry 30 --retry-delay 2``, and curl retries 408, 429, 500, 502, 503 and
504: a 500 made every DataLoader worker re-fetch a broken shard for a minute
before failing. 422 (Unprocessable Content: the request was understood, this
object cannot be processed) fails at once, and still carries the JSON body
naming the ETL, object and sample. 500 stays for genuine internal errors
(a bug in the runtime, a worker that died: retrying may help), 503 for a
transformer still starting, 504 for a transform that ran out of time.

Errors raised inside a worker process travel to the server as a plain dict
(``to_wire`` / ``from_wire``) and become the same classes again there.
"""

from __future__ import annotations

import traceback
from typing import Any

EXIT_CONFIG_ERROR = 2  # same meaning as etl_operator.reconcile.EXIT_CONFIG_ERROR
DETAIL_LINES = 12


def traceback_tail(exc: BaseException, max_lines: int = DETAIL_LINES) -> str:
    """The ``detail`` of an error body: the last lines of ``exc``'s traceback."""
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-max_lines:])


class TransformerError(Exception):
    """An object (or one sample of it) could not be transformed."""

    status = 500

    def __init__(
        self,
        message: str,
        *,
        sample: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sample = sample
        self.detail = detail

    @property
    def kind(self) -> str:
        return type(self).__name__

    def body(self, etl: str, obj: str | None) -> dict[str, Any]:
        """The JSON error body of the hpush protocol."""
        return {
            "error": self.message,
            "kind": self.kind,
            "etl": etl,
            "object": obj,
            "sample": self.sample,
            "detail": self.detail,
        }

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "sample": self.sample,
            "detail": self.detail,
        }


class BadRequest(TransformerError):
    status = 400


class NotATar(BadRequest):
    pass


class DecodeError(BadRequest):
    pass


class Unauthorized(TransformerError):
    status = 401


class ObjectNotFound(TransformerError):
    status = 404


class TransformError(TransformerError):
    status = 422  # deterministic: must not be retried (see the module docstring)


class BadResult(TransformerError):
    status = 422


class WorkerDied(TransformerError):
    pass


class TransformTimeout(TransformerError):
    status = 504


class NotReady(TransformerError):
    status = 503


_WIRE_KINDS: dict[str, type[TransformerError]] = {
    cls.__name__: cls
    for cls in (
        TransformerError,
        BadRequest,
        NotATar,
        DecodeError,
        ObjectNotFound,
        TransformError,
        BadResult,
        WorkerDied,
    )
}


def from_wire(d: dict[str, Any]) -> TransformerError:
    cls = _WIRE_KINDS.get(str(d.get("kind")), TransformerError)
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
