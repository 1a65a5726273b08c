"""Errors of dSort, mapped onto the shared ``SluiceError`` hierarchy::

    BadRequest (400)
    └── InvalidDsortSpec      a spec field is missing, of the wrong type or unsupported
    DsortFailed (500 shape)   the job failed while running: a shard that is not a
                              tar, a missing input shard, a peer that went away

``InvalidDsortSpec`` carries ``field`` (e.g. ``"algorithm.kind"``) so the 400
names what to fix. ``DsortFailed`` is what a job records as its error; it is
never raised through a request handler.
"""

from __future__ import annotations

from typing import Any

from etl_runtime.target.errors import BadRequest


class InvalidDsortSpec(BadRequest):
    def __init__(self, field: str, message: str, **context: Any) -> None:
        super().__init__(f"dsort spec: {field}: {message}", field=field, **context)
        self.field = field


class DsortFailed(Exception):
    """The job cannot go on; the message names the shard, record or target."""
