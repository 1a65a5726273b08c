"""Files inside shards, as AIStore lists and reads them for the official SDK.

* ``ARCH_DIR`` (``bucket.list_archive(shard)``): each ``.tar``, ``.tgz`` /
  ``.tar.gz`` or ``.zip`` object of a listing page is followed by its files,
  ``shard.tar/member`` with the member's size, sorted by name; the shard gets
  AIStore's archive flag (``apc.EntryIsArchive``), its files the shard's
  flags with ``apc.EntryInArch``. Directories are not listed (as AIStore's).
* ``GET /v1/objects/{b}/{shard}?archpath=member``
  (``get_reader(archive_config=ArchiveConfig(archpath=...))``): that file's
  bytes; ``archregx`` + ``archmode`` (``regexp``, ``prefix``, ``suffix``,
  ``substr``, ``wdskey``): a tar (``application/x-tar``) of every matching
  file, in the shard's order. None found is a 404 naming shard and member.

The gateway reads the shard from a target that holds it (a GET, streamed):
tar and tar.gz with ``ShardReader`` (forward only, bounded memory), zip from
a temporary file (its directory is at its end). Member names follow the safe
shard rules (``targuard.unsafe_name``): an absolute name or one with ``..`` is
left out of a listing, and read by ``archpath`` it is a 422 ``UnsafeShard``;
``./`` and empty segments are dropped. A shard that does not parse is a 400
``NotATar`` naming it. An ETL view's shards are refused (a 400): they are
transformed when read, whole.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable
from typing import IO, Any

import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from etl_runtime.core.errors import (
    InvalidRequest,
    NotATar,
    ObjectNotFound,
    UnsafeShard,
)
from etl_runtime.core.params import refuse_unknown
from etl_runtime.gateway import views
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import object_bytes
from etl_runtime.getbatch.archive import ArchiveWriter
from etl_runtime.getbatch.items import Spool
from etl_runtime.wire.formats.shardread import ShardReader
from etl_runtime.wire.formats.targuard import normalized, unsafe_name

TAR_EXTS = (".tar", ".tgz", ".tar.gz")
ZIP_EXT = ".zip"
ARCH_PARAMS = ("archpath", "archregx", "archmode")
READ_PARAMS = ("provider", *ARCH_PARAMS)
MODES = ("regexp", "prefix", "suffix", "substr", "wdskey")
FILE_WRITE = 1 << 20  # bytes gathered before one write of a zip's temp file


def shard_kind(name: str) -> str | None:
    """``tar`` (also tgz, tar.gz), ``zip``, or None: not a shard by its name."""
    low = name.lower()
    if low.endswith(TAR_EXTS):
        return "tar"
    return "zip" if low.endswith(ZIP_EXT) else None


def _shard(bucket: str, name: str) -> str:
    return f"ais://{bucket}/{name}"


def _refuse_view(gw: Gateway, bucket: str, name: str | None = None) -> None:
    if views.view_of(gw, bucket) is not None:
        raise InvalidRequest(
            f"bucket {bucket!r} is an ETL view: its shards are transformed on reading, so "
            "files inside them are not listed or read one by one; use its source bucket",
            bucket=bucket,
            object=name,
        )


def _chunks(gw: Gateway, bucket: str, name: str) -> AsyncIterator[bytes]:
    """The stored bytes of ``bucket/name``, from a target that holds it."""
    return object_bytes(gw, bucket, name, f"reading shard {_shard(bucket, name)}")


async def _zip_file(gw: Gateway, bucket: str, name: str) -> IO[bytes]:
    f: IO[bytes] = await anyio.to_thread.run_sync(tempfile.TemporaryFile)
    try:
        pending: list[bytes] = []
        size = 0
        async for chunk in _chunks(gw, bucket, name):
            pending.append(chunk)
            size += len(chunk)
            if size >= FILE_WRITE:
                await anyio.to_thread.run_sync(f.write, b"".join(pending))
                pending, size = [], 0
        await anyio.to_thread.run_sync(f.write, b"".join(pending))
        return f
    except BaseException:
        f.close()
        raise


def _zip_open(f: IO[bytes], bucket: str, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise NotATar(
            f"{_shard(bucket, name)} is not a zip archive: {e}", bucket=bucket, object=name
        ) from None


def _zip_list(f: IO[bytes], bucket: str, name: str) -> list[tuple[str, int]]:
    with _zip_open(f, bucket, name) as z:
        return [(i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]


async def members(gw: Gateway, bucket: str, name: str) -> list[tuple[str, int]]:
    """The files of shard ``bucket/name`` (safe names only, normalized), sorted."""
    found: list[tuple[str, int]] = []
    if shard_kind(name) == "zip":
        f = await _zip_file(gw, bucket, name)
        try:
            found = await anyio.to_thread.run_sync(_zip_list, f, bucket, name)
        finally:
            f.close()
    else:
        reader = ShardReader(_chunks(gw, bucket, name), _shard(bucket, name))
        while (got := await reader.next()) is not None:
            found.append(got)
            await reader.skip_member(got[1])
    safe = {normalized(m): s for m, s in found if unsafe_name(m) is None}
    return sorted(safe.items())


async def expand(gw: Gateway, bucket: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An ``ARCH_DIR`` page: every shard followed by its files."""
    _refuse_view(gw, bucket)
    out: list[dict[str, Any]] = []
    for o in objects:
        out.append(o)
        if o.get("dir") or shard_kind(o["name"]) is None:
            continue
        files = await members(gw, bucket, o["name"])
        o["archive"] = True
        for member, size in files:
            out.append(
                {
                    "name": f"{o['name']}/{member}",
                    "size": size,
                    "in_arch": True,
                    "cached": o.get("cached", False),
                }
            )
    return out


def is_arch_read(request: Request) -> bool:
    return request.method == "GET" and any(request.query_params.get(p) for p in ARCH_PARAMS)


def _matcher(regex: str, mode: str, bucket: str, name: str) -> Callable[[str], bool]:
    if mode not in MODES:
        raise InvalidRequest(
            f"archmode={mode!r} reading shard {_shard(bucket, name)}; one of {', '.join(MODES)}",
            bucket=bucket,
            object=name,
        )
    if regex in ("", "*"):
        return lambda _: True
    if mode == "regexp":
        try:
            pattern = re.compile(regex)
        except re.error as e:
            raise InvalidRequest(
                f"archregx={regex!r} is not a regular expression ({e})", bucket=bucket, object=name
            ) from None
        return lambda m: pattern.search(m) is not None
    if mode == "prefix":
        return lambda m: m.startswith(regex)
    if mode == "suffix":
        return lambda m: m.endswith(regex)
    if mode == "substr":
        return lambda m: regex in m
    return lambda m: _wds_key(m) == regex


def _wds_key(member: str) -> str:
    """AIStore's ``cos.WdsKey``: the name without its last extension."""
    base = member.rsplit("/", 1)[-1]
    key = member[: len(member) - len(base)] + (base.rsplit(".", 1)[0] if "." in base else base)
    return key.lstrip("/")


async def read(gw: Gateway, request: Request, bucket: str, name: str) -> Response:
    """``?archpath=`` (one file's bytes) or ``?archregx=&archmode=`` (a tar of matches)."""
    refuse_unknown(request, READ_PARAMS, bucket=bucket, object=name)
    q = request.query_params
    archpath, regex, mode = q.get("archpath", ""), q.get("archregx", ""), q.get("archmode", "")
    shard = _shard(bucket, name)
    if archpath and (regex or mode):
        raise InvalidRequest(
            f"reading shard {shard}: archpath and archregx/archmode exclude each other",
            bucket=bucket,
            object=name,
        )
    if not archpath and not mode:
        raise InvalidRequest(
            f"reading shard {shard}: archregx needs archmode ({', '.join(MODES)})",
            bucket=bucket,
            object=name,
        )
    if shard_kind(name) is None:
        raise InvalidRequest(
            f"{shard} is not a shard by its name (.tar, .tgz, .tar.gz or .zip): cannot read "
            "a file inside it",
            bucket=bucket,
            object=name,
        )
    gw.require_read(request, bucket)
    _refuse_view(gw, bucket, name)
    if archpath:
        if (why := unsafe_name(archpath)) is not None:
            raise UnsafeShard(
                f"archpath {archpath!r} of shard {shard}: {why}", bucket=bucket, object=name
            )
        return await _one(gw, bucket, name, normalized(archpath))
    return await _matching(gw, bucket, name, _matcher(regex, mode, bucket, name))


def _not_in(what: str, bucket: str, name: str) -> ObjectNotFound:
    return ObjectNotFound(
        f"{what} is not in shard {_shard(bucket, name)}", bucket=bucket, object=name
    )


async def _as_bytes(spool: Spool) -> AsyncIterator[bytes | memoryview]:
    async for chunk in spool.chunks():
        yield bytes(chunk) if isinstance(chunk, bytearray) else chunk


def _spooled(spool: Spool, media_type: str) -> Response:
    return StreamingResponse(
        _as_bytes(spool),
        media_type=media_type,
        headers={"Content-Length": str(spool.size)},
    )


async def _one(gw: Gateway, bucket: str, name: str, archpath: str) -> Response:
    spool = Spool()
    try:
        if shard_kind(name) == "zip":
            f = await _zip_file(gw, bucket, name)
            try:
                found = await anyio.to_thread.run_sync(
                    _zip_matching, f, bucket, name, lambda n: normalized(n) == archpath
                )
            finally:
                f.close()
            if not found:
                raise _not_in(f"file {archpath!r}", bucket, name)
            await spool.write(found[0][1])
        else:
            reader = ShardReader(_chunks(gw, bucket, name), _shard(bucket, name))
            while (got := await reader.next()) is not None:
                member, size = got
                if unsafe_name(member) is None and normalized(member) == archpath:
                    async for chunk in reader.member(size):
                        await spool.write(chunk)
                    break
                await reader.skip_member(size)
            else:
                raise _not_in(f"file {archpath!r}", bucket, name)
    except BaseException:
        spool.close()
        raise
    return _spooled(spool, "application/octet-stream")


def _zip_matching(
    f: IO[bytes], bucket: str, name: str, match: Callable[[str], bool]
) -> list[tuple[str, bytes]]:
    with _zip_open(f, bucket, name) as z:
        return [
            (normalized(i.filename), z.read(i))
            for i in z.infolist()
            if not i.is_dir() and unsafe_name(i.filename) is None and match(i.filename)
        ]


async def _matching(gw: Gateway, bucket: str, name: str, match: Callable[[str], bool]) -> Response:
    spool, out, count = Spool(), ArchiveWriter(".tar"), 0
    try:
        if shard_kind(name) == "zip":
            f = await _zip_file(gw, bucket, name)
            try:
                found = await anyio.to_thread.run_sync(_zip_matching, f, bucket, name, match)
            finally:
                f.close()
            for member, data in found:
                out.entry(member, data)
                await spool.write(out.take())
            count = len(found)
        else:
            reader = ShardReader(_chunks(gw, bucket, name), _shard(bucket, name))
            while (got := await reader.next()) is not None:
                member, size = got
                if unsafe_name(member) is not None or not match(member):
                    await reader.skip_member(size)
                    continue
                out.header(normalized(member), size)
                await spool.write(out.take())
                async for chunk in reader.member(size):
                    await spool.write(chunk)
                out.pad(size)
                await reader.skip_padding(size)
                count += 1
        if count == 0:
            raise _not_in("no file that matches", bucket, name)
        out.end()
        await spool.write(out.take())
    except BaseException:
        spool.close()
        raise
    return _spooled(spool, "application/x-tar")
