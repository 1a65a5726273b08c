"""Which query parameters each object call takes; anything else is a 400 naming it.

A parameter that is silently ignored gives a wrong answer that looks right:
``?etl_pipline=a,b`` (a typo) would return the object through one ETL only,
as a success. So the gateway (before it redirects) and the targets refuse what they
do not know. ``provider=ais`` and ``props`` are what the aistore SDK sends;
``sluice_exp``/``sluice_sig`` are the gateway's redirect signature, and
``sluice_from`` marks a read a target redirected to the object's owner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import Request

from etl_runtime.core.access import REDIRECTED_FROM, SIGNATURE_PARAMS
from etl_runtime.core.errors import InvalidRequest

OBJECT_PARAMS: dict[str, frozenset[str]] = {
    "GET": frozenset(
        {"etl_name", "etl_pipeline", "etl_args", "provider", "props", REDIRECTED_FROM}
    ),
    "HEAD": frozenset({"provider", "props", REDIRECTED_FROM}),
    "PUT": frozenset({"provider"}),
    "DELETE": frozenset({"provider"}),
}
_HINTS = {
    "etl_fqn": "etl_fqn is chosen by the target for ETLs with argType 'fqn', not by a caller",
}


def refuse_unknown(request: Request, known: Iterable[str], **context: Any) -> None:
    """400 naming every query parameter of ``request`` outside ``known``."""
    allowed = set(known) | set(SIGNATURE_PARAMS)
    unknown = sorted({k for k in request.query_params if k not in allowed})
    if not unknown:
        if request.query_params.get("provider", "ais") not in ("ais", "aws", ""):
            raise InvalidRequest(
                f"provider {request.query_params['provider']!r} is not supported: a bucket "
                "is 'ais' (stored by Sluice) or 'aws' (an S3-compatible backend)",
                **context,
            )
        return
    hints = "; ".join(_HINTS[k] for k in unknown if k in _HINTS)
    raise InvalidRequest(
        f"unknown query parameter(s) {', '.join(unknown)} for {request.method} "
        f"{request.url.path}; known: {', '.join(sorted(known))}" + (f" ({hints})" if hints else ""),
        **context,
    )


def refuse_unknown_object_params(request: Request, bucket: str, name: str) -> None:
    refuse_unknown(
        request, OBJECT_PARAMS.get(request.method, frozenset()), bucket=bucket, object=name
    )


def refuse_what(request: Request, supported: tuple[str, ...]) -> None:
    """400 naming a ``what=`` value (AIStore's query selector) this route does not answer."""
    what = request.query_params.get("what")
    if what not in supported:
        got = f"what={what!r} is not supported" if what else "what= is required"
        raise InvalidRequest(
            f"GET {request.url.path}: {got}; supported: {', '.join(supported)}", what=what
        )
