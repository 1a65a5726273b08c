"""Conditional and range requests on an object GET/HEAD (RFC 9110 sections 13 and 14).

``preconditions`` evaluates ``If-Match`` (412 when the object is another
version), ``If-None-Match`` (304 when it is the version the client holds),
``If-Unmodified-Since`` (412; ignored beside ``If-Match``), ``If-Modified-Since``
(304; ignored beside ``If-None-Match``, as S3 and RFC 9110 combine them) and
``If-Range``; ``byte_range`` turns a ``Range`` header into the one slice to
serve:

* ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` give ``206`` with
  ``Content-Range``; a range starting past the end gives ``416`` with
  ``Content-Range: bytes */size``.
* Several ranges (``bytes=0-1,5-9``) get a plain ``200`` of the whole object,
  as RFC 9110 allows (no ``multipart/byteranges``): a client asking for many
  pieces reads them with one request each, as the aistore SDK's parallel
  reader does.
* A header that is not a byte range at all is ignored (``200``), as the RFC
  says, and so is a ``Range`` whose ``If-Range`` names another version.

ETags are MD5s in quotes; comparison is strong (a ``W/`` tag never matches).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from etl_runtime.core.errors import PreconditionFailed, RangeNotSatisfiable
from etl_runtime.storage.store import ObjectInfo

_RANGE_RE = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")
# The request headers ``preconditions`` and ``byte_range`` read: a GET with none of them
# is answered whole, 200 (storage_target/inprotocol.py answers only those).
READ_CONDITIONS = (
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
)


def _http_date(value: str | None) -> float | None:
    """An HTTP date as a POSIX time (whole seconds); None when absent or not a date,
    which RFC 9110 says to ignore."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _tags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def _matches(header: str, etag: str) -> bool:
    quoted = f'"{etag}"'
    return any(t == "*" or t == quoted for t in _tags(header))


def preconditions(
    headers: Mapping[str, str], info: ObjectInfo, last_modified: str
) -> tuple[bool, bool]:
    """``(not_modified, use_range)``; raises ``PreconditionFailed`` for ``If-Match``.

    ``headers`` is the request's (case-insensitive) header mapping.
    """
    get = headers.get
    if_match = get("if-match")
    if if_match is not None and not _matches(if_match, info.etag):
        raise PreconditionFailed(
            f'If-Match {if_match!r}: the object is now version "{info.etag}"',
            headers={"ETag": f'"{info.etag}"'},
        )
    mtime = _http_date(last_modified)
    since = _http_date(get("if-unmodified-since")) if if_match is None else None
    if since is not None and mtime is not None and mtime > since:
        raise PreconditionFailed(
            f"If-Unmodified-Since: the object was modified at {last_modified}",
            headers={"ETag": f'"{info.etag}"', "Last-Modified": last_modified},
        )
    if_none_match = get("if-none-match")
    not_modified = if_none_match is not None and _matches(if_none_match, info.etag)
    since = _http_date(get("if-modified-since")) if if_none_match is None else None
    if since is not None and mtime is not None and mtime <= since:
        not_modified = True
    if_range = get("if-range")
    use_range = True
    if if_range is not None:
        value = if_range.strip()
        use_range = value == f'"{info.etag}"' or value == last_modified
    return not_modified, use_range


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a single byte range, or None for the whole object."""
    if header is None:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or not spec:
        return None  # not a byte range: ignored
    parts = spec.split(",")
    if len(parts) != 1:
        return None  # several ranges: the whole object (documented above)
    m = _RANGE_RE.match(parts[0])
    if m is None or (not m.group(1) and not m.group(2)):
        return None  # malformed: ignored, as RFC 9110 says
    first, last = m.group(1), m.group(2)
    if not first:  # bytes=-n: the last n bytes
        n = int(last)
        if n == 0:
            raise _unsatisfiable(header, size)
        return max(0, size - n), size
    start = int(first)
    end = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None  # invalid (last < first): ignored
    if start >= size:
        raise _unsatisfiable(header, size)
    return start, end


def _unsatisfiable(header: str, size: int) -> RangeNotSatisfiable:
    return RangeNotSatisfiable(
        f"Range {header!r} is outside the object ({size} bytes)",
        headers={"Content-Range": f"bytes */{size}"},
    )
