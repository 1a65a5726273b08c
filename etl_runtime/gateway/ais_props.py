"""An object's props as the aistore SDK asks for them: ``HEAD ?props=`` and ``PATCH``.

``obj.head(props="name,size,version,checksum,atime,custom,...")`` sends
``HEAD /v1/objects/{b}/{o}?props=...``; the gateway HEADs the object at a
target that holds it and answers AIStore's headers for the props asked, and
only those (``Ais-Present: true`` always; the SDK fills in the names):

=================  ==========================================================
``name``           ``Ais-Name``
``size``           ``Content-Length`` (always, asked or not, as AIStore's)
``version``        ``Ais-Version``: the object's MD5, which changes whenever
                   its bytes do (AIStore counts writes; Sluice keeps no counter)
``checksum``       ``Ais-Checksum-Type: md5``, ``Ais-Checksum-Value``
``atime``          ``Ais-Atime``: the last write, in ns (no access times kept)
``custom``         ``Ais-Custom-Md``: ``k=v,k2=v2`` (the ``X-Sluice-Meta-*``)
``copies``         ``Ais-Mirror-Copies``: the bucket's ``copies``
``location``       ``Ais-Location``: ``t[target]``
``last-modified``  ``Last-Modified``; ``etag``: ``ETag``
``ec``, ``chunked`` nothing: Sluice has no erasure coding, and no chunked objects
=================  ==========================================================

Another prop is a 400 naming it. ``obj.get_writer().set_custom_props(md,
replace_existing)`` sends ``PATCH`` with ``{"action": "", "value": {k: v}}``
(``?set-new-custom=true`` to replace): the gateway rewrites the object at its
owner with the merged (or new) user metadata, its bytes and content type as
they were (so the write is checksummed and copied like any other). Keys are
lower-cased and values must be header text (``storage/meta.py``'s rules).
"""

from __future__ import annotations

import email.utils
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from etl_runtime.core.errors import InvalidRequest, ObjectNotFound
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import remote as remote_gateway
from etl_runtime.gateway import views
from etl_runtime.gateway.ais_writes import _head, _kept_meta, _put, _read
from etl_runtime.gateway.context import Gateway

PROPS = (
    "name",
    "size",
    "version",
    "checksum",
    "atime",
    "custom",
    "copies",
    "location",
    "last-modified",
    "etag",
    "ec",
    "chunked",
)
META = "x-sluice-meta-"
NEW_CUSTOM = "set-new-custom"


def is_props_head(request: Request) -> bool:
    return request.method == "HEAD" and "props" in request.query_params


def _asked(raw: str, bucket: str, name: str) -> list[str]:
    asked = [p.strip() for p in raw.split(",") if p.strip()] or ["name", "size"]
    unknown = sorted(set(asked) - set(PROPS))
    if unknown:
        raise InvalidRequest(
            f"HEAD {bucket}/{name}: unknown prop(s) {', '.join(unknown)}; known: "
            + ", ".join(PROPS),
            bucket=bucket,
            object=name,
        )
    return asked


async def head(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    refuse_unknown(request, ("provider", "props"), bucket=bucket, object=name)
    asked = _asked(request.query_params["props"], bucket, name)
    if (view := views.view_of(gw, bucket)) is not None:
        return await views.head(gw, bucket, view, name)
    await remote_gateway.ensure_bucket(gw, request, bucket)
    got = await _head(gw, bucket, name)
    if got is None:
        raise ObjectNotFound(f"object {bucket}/{name} does not exist", bucket=bucket, object=name)
    h = got.headers
    etag = h.get("etag", "").strip('"')
    modified = h.get("last-modified", "")
    when = email.utils.parsedate_to_datetime(modified).timestamp() if modified else 0.0
    custom = {k[len(META) :]: v for k, v in h.items() if k.lower().startswith(META)}
    copies = gw.cmap.get().copies(bucket) if gw.cmap is not None else 1
    values: dict[str, dict[str, str]] = {
        "name": {"Ais-Name": name},
        "size": {"Content-Length": h.get("content-length", "0")},
        "version": {"Ais-Version": etag},
        "checksum": {
            "Ais-Checksum-Type": h.get("ais-checksum-type", "md5"),
            "Ais-Checksum-Value": h.get("ais-checksum-value", etag),
        },
        "atime": {"Ais-Atime": str(int(when * 1e9))},
        "custom": {"Ais-Custom-Md": ",".join(f"{k}={v}" for k, v in sorted(custom.items()))},
        "copies": {"Ais-Mirror-Copies": str(copies)},
        "location": {"Ais-Location": _location(gw, got)},
        "last-modified": {"Last-Modified": modified},
        "etag": {"ETag": h.get("etag", "")},
        "ec": {},
        "chunked": {},
    }
    out = {"Ais-Present": "true", **values["size"]}  # the size always, as AIStore's
    for prop in asked:
        out.update(values[prop])
    return Response(headers=out)


def _location(gw: Gateway, got: Any) -> str:
    """``t[ID]`` of the target that answered (by its URL)."""
    url = str(got.url).split("/v1/", 1)[0].rstrip("/")
    for t in gw.known_targets():
        if t.url.rstrip("/") == url:
            return f"t[{t.id}]"
    return ""


async def set_custom(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    refuse_unknown(request, ("provider", NEW_CUSTOM), bucket=bucket, object=name)
    replace = request.query_params.get(NEW_CUSTOM, "false").lower()
    if replace not in ("true", "false"):
        raise InvalidRequest(f"{NEW_CUSTOM}={replace!r}: true or false", bucket=bucket, object=name)
    what = f"the body of PATCH {bucket}/{name}"
    body = await read_json(request, what)
    if not isinstance(body, dict) or set(body) - {"action", "name", "value"}:
        raise InvalidRequest(
            f"{what} must be an action message {{'action': '', 'value': {{key: value}}}}",
            bucket=bucket,
            object=name,
        )
    if body.get("action") not in (None, "") or body.get("name") not in (None, ""):
        raise InvalidRequest(
            f"{what}: action {body.get('action')!r} is not a props update (send '')",
            bucket=bucket,
            object=name,
        )
    value = body.get("value")
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(
            f"{what}: 'value' must be an object of string keys and values",
            bucket=bucket,
            object=name,
        )
    if views.view_of(gw, bucket) is not None:
        raise views.refuse_write(bucket, name, "PATCH")
    await remote_gateway.ensure_bucket(gw, request, bucket)
    current = await _head(gw, bucket, name)
    if current is None:
        raise ObjectNotFound(f"object {bucket}/{name} does not exist", bucket=bucket, object=name)
    kept = _kept_meta(current)
    if replace == "true":
        kept = {k: v for k, v in kept.items() if not k.lower().startswith(META)}
    headers = {**kept, **{f"{META}{k.lower()}": v for k, v in value.items()}}
    length = int(current.headers.get("content-length", "0"))
    await _put(gw, bucket, name, _read(gw, [(bucket, name)]), length, headers)
    return Response()
