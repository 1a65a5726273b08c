"""Gateway errors: the same hierarchy and JSON shape as the targets.

The gateway and the targets serve one public API, so they share one error
hierarchy (defined, with its status mapping, in ``etl_runtime.target.errors``);
this module re-exports what the gateway raises::

    SluiceError
    ├── BadRequest (400)     InvalidName, InvalidRequest, InvalidSpec
    ├── Unauthorized (401)
    ├── NotFound (404)       BucketNotFound, EtlNotFound
    └── Unavailable (503)    NoTargets (no live target, or one did not answer)
"""

from __future__ import annotations

from etl_runtime.target.errors import (
    BadRequest,
    BucketNotFound,
    EtlNotFound,
    InvalidName,
    InvalidRequest,
    InvalidSpec,
    NoTargets,
    NotFound,
    SluiceError,
    Unauthorized,
    Unavailable,
    install_error_handlers,
)

__all__ = [
    "BadRequest",
    "BucketNotFound",
    "EtlNotFound",
    "InvalidName",
    "InvalidRequest",
    "InvalidSpec",
    "NoTargets",
    "NotFound",
    "SluiceError",
    "Unauthorized",
    "Unavailable",
    "install_error_handlers",
]
