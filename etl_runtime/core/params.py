"""Which query parameters each object call takes; anything else is a 400 naming it.

A parameter that is silently ignored gives a wrong answer that looks right:
``?etl_pipline=a,b`` (a typo) would return the object through one ETL only,
as a success. So the gateway (before it redirects) and the targets refuse what they
do not know. ``provider=ais`` and ``props`` are what the aistore SDK sends;
``sluice_exp``/``sluice_sig`` are the gateway's redirect signature, and
``sluice_from`` marks a read a target redirected to the object's owner.

The same goes for a parameter given twice: ``request.query_params.get`` (and
FastAPI's scalar ``Query``) keeps the last value and drops the others, so
``?etl_name=upper&etl_name=reverse`` answered 200 through ``reverse`` alone.
``refuse_repeated`` makes it a 400 naming the parameter; ``refuse_unknown``
calls it, so every route that refuses unknown parameters refuses repeats too,
and the listings (which take any parameter) call it themselves. Every query
parameter Sluice reads is single-valued; one that may repeat belongs in
``MULTI_VALUED``. ``etl_args`` without ``etl_name`` is refused too: it would
otherwise be dropped, and the object answered untransformed. ``etl_skip=K``
(a wds ETL's answer without the shard's first ``K`` samples, which are not
transformed: a loader resuming mid-shard) must be a decimal count and goes
with no ``etl_pipeline``; the target refuses it without a wds ETL. The internal
routes targets and the gateway call on each other (``/v1/_replica``,
``/v1/_jobs``, ``/v1/_etl``, ``/v1/_remote``, ``/v1/_rebalance``) refuse
unknown and repeated parameters the same way, and
so does the transformer's hpush ``PUT`` (``webserver/app.py``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from fastapi import Request

from etl_runtime.core import providers
from etl_runtime.core.access import REDIRECTED_FROM, SIGNATURE_PARAMS
from etl_runtime.core.errors import InvalidRequest

OBJECT_PARAMS: dict[str, frozenset[str]] = {
    "GET": frozenset(
        {"etl_name", "etl_pipeline", "etl_args", "etl_skip", "provider", "props", REDIRECTED_FROM}
    ),
    "HEAD": frozenset({"provider", "props", REDIRECTED_FROM}),
    "PUT": frozenset({"provider"}),
    "DELETE": frozenset({"provider"}),
}
MULTI_VALUED: frozenset[str] = frozenset()  # read with getlist(); none yet
_HINTS = {
    "etl_fqn": "etl_fqn is chosen by the target for ETLs with argType 'fqn', not by a caller",
    "etl_grant": "etl_grant is signed by the target beside etl_fqn, not sent by a caller",
}


def refuse_repeated(request: Request, **context: Any) -> None:
    """400 naming every query parameter of ``request`` given more than once."""
    q = request.query_params
    items = q.multi_items()
    if len(items) == len(q):  # one value per name: the usual case
        return
    counts = collections.Counter(k for k, _ in items if k not in MULTI_VALUED)
    repeated = sorted((k, n) for k, n in counts.items() if n > 1)
    if not repeated:
        return
    if len(repeated) == 1:
        ((name, n),) = repeated
        message = f"query parameter {name!r} given {n} times; give it once"
    else:
        named = ", ".join(f"{k!r} ({n} times)" for k, n in repeated)
        message = f"query parameters {named} given more than once; give each once"
    raise InvalidRequest(message, **context)


def _refuse_orphan_args(request: Request, **context: Any) -> None:
    """400 for ``etl_args`` without ``etl_name``: there is no ETL to pass them to, and
    answering the object untransformed would look like a success."""
    q = request.query_params
    if "etl_args" in q and not q.get("etl_name"):
        raise InvalidRequest(
            f"etl_args={q['etl_args']!r} needs etl_name (the ETL it is passed to); "
            "drop etl_args, or name the ETL",
            **context,
        )


ETL_SKIP = "etl_skip"
ETL_SKIP_MAX = 1 << 31  # samples in one shard; more is a typo


def etl_skip_of(value: str | None, **context: Any) -> int:
    """The count of ``etl_skip=`` (0 when absent); a 400 naming it when it is no count."""
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()) or int(value) > ETL_SKIP_MAX:
        raise InvalidRequest(
            f"etl_skip={value!r} is not a count of samples: give a whole number from 0 "
            f"to {ETL_SKIP_MAX} (the samples of the shard to leave out)",
            **context,
        )
    return int(value)


def _refuse_bad_skip(request: Request, **context: Any) -> None:
    q = request.query_params
    if ETL_SKIP in q:
        etl_skip_of(q[ETL_SKIP], **context)
        if "etl_pipeline" in q:
            raise InvalidRequest(
                "etl_skip does not go with etl_pipeline: a step may drop samples, so the "
                "count would not say where the answer starts; name one wds ETL",
                **context,
            )


def refuse_unknown(request: Request, known: Iterable[str], **context: Any) -> None:
    """400 naming every query parameter of ``request`` outside ``known``, or repeated."""
    allowed = set(known) | set(SIGNATURE_PARAMS)
    unknown = sorted({k for k in request.query_params if k not in allowed})
    if not unknown:
        refuse_repeated(request, **context)
        _refuse_orphan_args(request, **context)
        _refuse_bad_skip(request, **context)
        if request.query_params.get("provider", "ais") not in (*providers.spellings(), ""):
            raise InvalidRequest(
                f"provider {request.query_params['provider']!r} is not supported: a bucket "
                f"is {providers.described()}",
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
