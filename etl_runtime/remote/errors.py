"""Errors of remote buckets: what the backend said, mapped to one HTTP status each.

    SluiceError (etl_runtime.target.errors)
    ├── BackendUnauthorized (401)   no credentials, or the backend rejected them
    ├── BackendForbidden (403)      the credentials may not do this
    ├── ObjectNotFound (404)        the backend has no such object (or bucket)
    └── BackendUnavailable (503)    the backend does not answer; Retry-After

Every message names the bucket, the object (if any) and the backend endpoint.
"""

from __future__ import annotations

from typing import Any

from etl_runtime.target.errors import SluiceError, Unavailable

RETRY_AFTER_SECONDS = 5


class BackendUnauthorized(SluiceError):
    status = 401


class BackendForbidden(SluiceError):
    status = 403


class BackendUnavailable(Unavailable):
    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message, retry_after=RETRY_AFTER_SECONDS, **context)


class BackendError(SluiceError):
    """The backend answered something we cannot map more precisely (502)."""

    status = 502
