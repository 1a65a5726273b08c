"""GetObject/HeadObject's ``response-*`` query parameters: headers the answer carries instead.

S3 lets a signed GET (a presigned URL, typically: a download link that saves
as ``report.pdf``) choose six headers of its answer: ``response-content-type``,
``-content-language``, ``-expires``, ``-cache-control``,
``-content-disposition`` and ``-content-encoding``. They replace the stored
values on a 200 or 206 (never on a 304 or an error). As in S3 an anonymous
request may not use them (400 ``InvalidRequest``), and any other
``response-*`` parameter is a 400 naming it rather than ignored.
"""

from __future__ import annotations

import re

from fastapi import Request
from fastapi.responses import Response

from etl_runtime.core.errors import S3Error

HEADERS = {
    "response-content-type": "content-type",
    "response-content-language": "content-language",
    "response-expires": "expires",
    "response-cache-control": "cache-control",
    "response-content-disposition": "content-disposition",
    "response-content-encoding": "content-encoding",
}
_PRINTABLE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # a header's latin-1, no CR/LF


def asked(request: Request, signed: bool) -> dict[str, str]:
    """The headers the query asks for (checked before the object is read)."""
    wanted: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if not name.startswith("response-"):
            continue
        header = HEADERS.get(name)
        if header is None:
            known = ", ".join(HEADERS)
            raise S3Error("InvalidArgument", 400, f"unknown parameter {name!r} (known: {known})")
        if header in wanted:
            raise S3Error("InvalidArgument", 400, f"parameter {name!r} is given more than once")
        if not _PRINTABLE.fullmatch(value):
            raise S3Error("InvalidArgument", 400, f"parameter {name!r}: not a header value")
        wanted[header] = value
    if wanted and not signed:
        raise S3Error(
            "InvalidRequest",
            400,
            "response-* parameters cannot be used in an anonymous GET: sign the request",
        )
    return wanted


def apply(response: Response, wanted: dict[str, str]) -> Response:
    """``response`` with ``wanted``'s headers in place of its own, when it is a 200 or 206."""
    if wanted and response.status_code in (200, 206):
        for header, value in wanted.items():
            response.headers[header] = value
    return response
