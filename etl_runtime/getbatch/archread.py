"""Files inside shards, as AIStore reads and lists them (``archpath``, ``archregx``).

Shared by the gateway (``gateway/ais_shards.py``: the shard streamed from a
target that holds it) and a target answering a direct read
(``get_reader(direct=True, archive_config=...)`` of the aistore SDK: the
shard read from its own disk, checked first). ``source`` gives the shard's
stored bytes from the start, as often as it is called.

* ``archpath=member``: that file's bytes; ``archregx`` + ``archmode``
  (``regexp``, ``prefix``, ``suffix``, ``substr``, ``wdskey``): a tar
  (``application/x-tar``) of every matching file, in the shard's order. None
  found is a 404 naming shard and member.
* tar and tar.gz are read with ``ShardReader`` (forward only, bounded memory),
  zip from a temporary file (its directory is at its end). Member names follow
  the safe shard rules (``targuard.unsafe_name``): an absolute name or one with
  ``..`` is left out of a listing, and read by ``archpath`` it is a 422
  ``UnsafeShard``; ``./`` and empty segments are dropped. A shard that does not
  parse is a 400 ``NotATar`` naming it.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping
from typing import IO

import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from etl_runtime.core.errors import InvalidRequest, NotATar, ObjectNotFound, UnsafeShard
from etl_runtime.getbatch.archive import ArchiveWriter
from etl_runtime.getbatch.items import Spool
from etl_runtime.wire.formats.shardread import ShardReader
from etl_runtime.wire.formats.targuard import normalized, unsafe_name

Source = Callable[[], AsyncIterator[bytes]]  # the shard's stored bytes, from its start

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


async def _zip_file(source: Source) -> IO[bytes]:
    f: IO[bytes] = await anyio.to_thread.run_sync(tempfile.TemporaryFile)
    try:
        pending: list[bytes] = []
        size = 0
        async for chunk in source():
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


async def members(source: Source, bucket: str, name: str) -> list[tuple[str, int]]:
    """The files of shard ``bucket/name`` (safe names only, normalized), sorted."""
    found: list[tuple[str, int]] = []
    if shard_kind(name) == "zip":
        f = await _zip_file(source)
        try:
            found = await anyio.to_thread.run_sync(_zip_list, f, bucket, name)
        finally:
            f.close()
    else:
        reader = ShardReader(source(), _shard(bucket, name))
        while (got := await reader.next()) is not None:
            found.append(got)
            await reader.skip_member(got[1])
    safe = {normalized(m): s for m, s in found if unsafe_name(m) is None}
    return sorted(safe.items())


def is_arch_read(request: Request) -> bool:
    """A GET with ``archpath`` or ``archregx``: files in a shard, not the shard."""
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


class ArchRead:
    """A checked ``archpath`` / ``archregx`` request: what to read from the shard."""

    def __init__(self, bucket: str, name: str, archpath: str, match: Callable[[str], bool] | None):
        self.bucket, self.name, self.archpath, self.match = bucket, name, archpath, match

    async def answer(self, source: Source) -> Response:
        """The file's bytes, or a tar of the matching files, read from ``source``."""
        if self.match is None:
            return await _one(source, self.bucket, self.name, self.archpath)
        return await _matching(source, self.bucket, self.name, self.match)


def parse(query: Mapping[str, str], bucket: str, name: str) -> ArchRead:
    """``archpath`` (one file) or ``archregx`` + ``archmode`` (a tar of matches): a 400
    naming what is wrong, a 422 ``UnsafeShard`` for an unsafe ``archpath``."""
    archpath, regex = query.get("archpath", ""), query.get("archregx", "")
    mode = query.get("archmode", "")
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
    if not archpath:
        return ArchRead(bucket, name, "", _matcher(regex, mode, bucket, name))
    if (why := unsafe_name(archpath)) is not None:
        raise UnsafeShard(
            f"archpath {archpath!r} of shard {shard}: {why}", bucket=bucket, object=name
        )
    return ArchRead(bucket, name, normalized(archpath), None)


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


async def _one(source: Source, bucket: str, name: str, archpath: str) -> Response:
    spool = Spool()
    try:
        if shard_kind(name) == "zip":
            f = await _zip_file(source)
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
            reader = ShardReader(source(), _shard(bucket, name))
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


async def _matching(
    source: Source, bucket: str, name: str, match: Callable[[str], bool]
) -> Response:
    spool, out, count = Spool(), ArchiveWriter(".tar"), 0
    try:
        if shard_kind(name) == "zip":
            f = await _zip_file(source)
            try:
                found = await anyio.to_thread.run_sync(_zip_matching, f, bucket, name, match)
            finally:
                f.close()
            for member, data in found:
                out.entry(member, data)
                await spool.write(out.take())
            count = len(found)
        else:
            reader = ShardReader(source(), _shard(bucket, name))
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
