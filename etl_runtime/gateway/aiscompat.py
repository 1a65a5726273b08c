"""AIStore's wire shapes, for the official ``aistore`` Python SDK (2.0.x).

Sluice's own API answers in its own JSON; the official SDK sends some calls in
AIStore's form and parses AIStore's answers, so the gateway recognises those
requests and answers them in kind:

* a listing is ``GET /v1/buckets/{b}`` with a JSON body ``{"action": "list",
  "value": {"prefix", "pagesize", "continuation_token", "start_after", ...}}``
  and ``Accept: application/msgpack``; the answer is an ``LsoResult``
  (``{"UUID", "ContinuationToken", "Flags", "Entries": [{"n", "s", "cs", ...}]}``)
  in msgpack (the SDK's JSON path cannot parse it) — ``msgspec`` encodes it.
  Its ``flags`` (``ListObjectFlag``): ``NAME_ONLY`` / ``NAME_SIZE`` (names,
  and sizes, only), ``NO_RECURSION`` (the names right under ``prefix``, and
  each directory there once, as ``dir/`` with AIStore's directory flag);
  ``CACHED``, ``BCK_PRESENT``, ``DONT_HEAD_REMOTE``, ``DONT_ADD_REMOTE`` and
  ``NO_DIRS`` change nothing Sluice lists; ``ARCH_DIR`` follows each shard
  with its files (``ais_shards.py``); any other flag and any other field of
  the message is a 400 naming it;
* ``cluster().list_buckets()`` is ``GET /v1/buckets`` with ``{"action": "list"}``
  and wants ``[{"name", "provider", "namespace"}]``;
* the ETL list and details (``GET /v1/etl[/name]``) from a client whose
  ``User-Agent`` starts with ``ais/python`` get ``[ETLInfo]`` and
  ``ETLDetails``; stop, start and delete already share AIStore's shape.
"""

from __future__ import annotations

import base64
from typing import Any
from uuid import uuid4

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.errors import InvalidRequest
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.spec import runtime_python_version

MSGPACK = "application/msgpack"
AIS_USER_AGENT = "ais/python"
MAX_PAGE = 10_000
DEFAULT_PAGE = 1_000
ENTRY_IS_CACHED = 1 << 6  # LsoEntry flag: a remote object a target holds (apc.EntryIsCached)
IN_PROGRESS = ".s3-multipart/"  # gateway/s3/multipart.HIDDEN: parts not yet an object
ENTRY_IS_DIR = 1 << 8  # LsoEntry flag: a virtual directory of a non-recursive listing
ENTRY_IN_ARCH = 1 << 7  # LsoEntry flag: a file inside a shard (ARCH_DIR)
ENTRY_IS_ARCHIVE = 1 << 9  # LsoEntry flag: a shard whose files follow it (ARCH_DIR)
# ListObjectFlag bits (the SDK's list_object_flag.py, AIStore's apc.Ls*).
LIST_FLAGS = {
    "CACHED": 0,
    "MISSING": 1,
    "DELETED": 2,
    "ARCH_DIR": 3,
    "NAME_ONLY": 4,
    "NAME_SIZE": 5,
    "BCK_PRESENT": 6,
    "DONT_HEAD_REMOTE": 7,
    "DONT_ADD_REMOTE": 8,
    "NOT_CACHED": 9,
    "ONLY_REMOTE_PROPS": 10,
    "NO_RECURSION": 11,
    "DIFF": 12,
    "NO_DIRS": 13,
    "IS_S3": 14,
    "NBI": 15,
}
LIST_FLAGS_TAKEN = frozenset(
    {"CACHED", "NAME_ONLY", "NAME_SIZE", "BCK_PRESENT", "DONT_HEAD_REMOTE", "DONT_ADD_REMOTE"}
    | {"NO_RECURSION", "NO_DIRS", "ARCH_DIR"}
)
LIST_FIELDS = (
    "prefix",
    "pagesize",
    "uuid",
    "props",
    "continuation_token",
    "flags",
    "target",
    "start_after",
)


def from_ais_sdk(request: Request) -> bool:
    return request.headers.get("user-agent", "").startswith(AIS_USER_AGENT)


async def list_action(request: Request, bucket: str | None = None) -> dict[str, Any] | None:
    """The ``{"action": "list", "value": {...}}`` body of a GET, or None when there is none."""
    empty = request.headers.get("content-length", "0").strip() in ("", "0")
    if empty and "transfer-encoding" not in request.headers:
        return None
    body = await read_json(request, 'the list action {"action": "list", "value": {...}}')
    if not isinstance(body, dict) or body.get("action") != "list":
        raise InvalidRequest(
            f"unsupported body for a listing: {str(body)[:100]!r}; "
            'send {"action": "list", "value": {...}} or query parameters',
            bucket=bucket,
        )
    value = body.get("value") or {}
    if not isinstance(value, dict):
        raise InvalidRequest("'value' of the list action must be an object", bucket=bucket)
    unknown = sorted(set(value) - set(LIST_FIELDS)) + sorted(
        set(body) - {"action", "name", "value"}
    )
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} of the list action; known: "
            f"{', '.join(LIST_FIELDS)}",
            bucket=bucket,
        )
    if value.get("target"):
        raise InvalidRequest(
            f"target={value['target']!r}: Sluice lists a bucket across all targets only",
            bucket=bucket,
        )
    list_flags(value, bucket)  # a 400 now for a flag Sluice does not list by
    return value


def list_flags(value: dict[str, Any], bucket: str | None) -> frozenset[str]:
    """The names of the ``flags`` of a list message; a 400 naming those not supported."""
    raw = value.get("flags") or 0
    try:
        bits = int(raw)
    except (TypeError, ValueError):
        raise InvalidRequest(
            f"flags={raw!r} of the list action must be an integer", bucket=bucket
        ) from None
    names = {n for n, bit in LIST_FLAGS.items() if bits & (1 << bit)}
    unknown_bits = bits & ~sum(1 << b for b in LIST_FLAGS.values())
    refused = sorted(names - LIST_FLAGS_TAKEN)
    if refused or unknown_bits:
        named = refused + ([f"bits {unknown_bits:#x}"] if unknown_bits else [])
        raise InvalidRequest(
            f"listing flag(s) {', '.join(named)} not supported for bucket {bucket!r}; "
            f"supported: {', '.join(sorted(LIST_FLAGS_TAKEN))}",
            bucket=bucket,
        )
    return frozenset(names)


def finished(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A page without the parts of uploads and appends in progress (``ais_writes.py``)."""
    return [o for o in objects if not o["name"].startswith(IN_PROGRESS)]


def shallow(objects: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """A ``NO_RECURSION`` page: names right under ``prefix``, each directory once."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for o in objects:
        rest = o["name"][len(prefix) :]
        if "/" not in rest:
            out.append(o)
            continue
        d = prefix + rest.split("/", 1)[0] + "/"
        if d not in seen:
            seen.add(d)
            out.append({"name": d, "size": 0, "dir": True})
    return out


def page_args(value: dict[str, Any], bucket: str) -> tuple[str, str, int]:
    """(prefix, start_after, limit) from an AIStore list message."""
    prefix = value.get("prefix") or ""
    token = value.get("continuation_token") or value.get("start_after") or ""
    size = value.get("pagesize") or DEFAULT_PAGE
    if not isinstance(prefix, str) or not isinstance(token, str):
        raise InvalidRequest("prefix and continuation_token must be strings", bucket=bucket)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidRequest(
            f"pagesize of the listing of {bucket!r} must be a non-negative integer, got {size!r}",
            bucket=bucket,
        )
    return prefix, token, min(size, MAX_PAGE)


def _entry_flags(o: dict[str, Any]) -> int:
    if o.get("dir"):
        return ENTRY_IS_DIR
    flags = ENTRY_IS_CACHED if o.get("cached") else 0
    if o.get("archive"):
        flags |= ENTRY_IS_ARCHIVE
    return (flags | ENTRY_IN_ARCH) if o.get("in_arch") else flags


def lso_result(
    objects: list[dict[str, Any]],
    next_name: str | None,
    request: Request,
    uuid: str = "",
    flags: frozenset[str] = frozenset(),
) -> Response:
    """An ``LsoResult``; ``UUID`` names the listing (the SDK's iterator stops only with one)."""
    entries: list[dict[str, Any]] = [
        {
            "n": o["name"],
            "s": int(o["size"] if o["size"] is not None else o.get("source_size") or 0),
            "cs": o.get("etag", ""),
            "a": str(o.get("mtime", "")),
            "v": "",
            "t": "",
            "c": 1,
            "f": _entry_flags(o),
        }
        for o in objects
    ]
    if "NAME_ONLY" in flags or "NAME_SIZE" in flags:
        keep = ("n", "f") if "NAME_ONLY" in flags and "NAME_SIZE" not in flags else ("n", "s", "f")
        entries = [{k: e[k] for k in keep} for e in entries]
    result = {
        "UUID": uuid or uuid4().hex,
        "ContinuationToken": next_name or "",
        "Flags": 0,
        "Entries": entries,
    }
    if MSGPACK in request.headers.get("accept", ""):
        return Response(msgspec.msgpack.encode(result), media_type=MSGPACK)
    return JSONResponse(result)


def bucket_models(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "provider": "ais", "namespace": {"uuid": "", "name": ""}} for n in names]


def etl_info(record: EtlRecord, stats: dict[str, Any]) -> dict[str, Any]:
    stage = {"Running": "Running", "Stopped": "Aborted", "Error": "Aborted"}.get(
        record.phase, "Initializing"
    )
    return {
        "id": record.name,
        "xaction_id": record.uid,
        "stage": stage,
        "obj_count": int(stats.get("objects", 0)),
        "in_bytes": int(stats.get("bytes_in", 0)),
        "out_bytes": int(stats.get("bytes_out", 0)),
    }


def etl_details(record: EtlRecord, last_errors: list[dict[str, Any]]) -> dict[str, Any]:
    spec = record.spec
    init_msg: dict[str, Any] = {
        "name": record.name,
        "communication": "hpush://",
        "init_timeout": f"{spec.init_timeout_seconds:g}s",
        "obj_timeout": f"{spec.request_timeout_seconds:g}s",
        "chunk_size": 0,
        "runtime": f"python{runtime_python_version()}",
    }
    if spec.code.source is not None:
        init_msg["code"] = base64.b64encode(spec.code.source.encode()).decode()
    if spec.code.ais_class is not None:  # created by init_class: its runtime, as sent
        env = [{"name": k, "value": v} for k, v in spec.env]
        env.append(
            {"name": "ETL_CLASS_PAYLOAD", "value": f"<{len(spec.code.ais_class)} characters>"}
        )
        if spec.dependencies:
            env.append({"name": "PACKAGES", "value": ",".join(spec.dependencies)})
        if spec.workers is not None:
            env.append({"name": "NUM_WORKERS", "value": str(spec.workers)})
        image = f"aistorage/runtime_python:{spec.code.python_version}"
        init_msg["runtime"] = {"image": image, "env": env}
    if spec.foreign:  # created by init(image=...): the image, as sent
        runtime: dict[str, Any] = {"image": spec.image}
        if spec.command:
            runtime["command"] = list(spec.command)
        runtime["env"] = [{"name": k, "value": v} for k, v in spec.env]
        init_msg["runtime"] = runtime
        init_msg["communication"] = spec.comm_type
    return {
        "init_msg": init_msg,
        "obj_errors": [
            {"obj_name": e.get("object") or "", "msg": str(e.get("error")), "ecode": 422}
            for e in last_errors
        ],
    }


def etl_node_logs(logs: dict[str, str]) -> list[dict[str, str]]:
    """``etl.logs()``'s ``[ETLNodeLogs]``: per target, its logs base64-encoded."""
    return [
        {"target_id": t, "logs": base64.b64encode(text.encode()).decode()}
        for t, text in sorted(logs.items())
    ]
