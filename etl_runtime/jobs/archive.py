"""The ``archive`` job: a list of objects packed into one new object (tar, tgz or zip).

AIStore's ``objects(...).archive(archive_name, ...)`` (``PUT /v1/buckets/{b}``,
action ``archive``; ``gateway/ais_archive.py`` turns a template or prefix into
names). The spec every target gets::

    {"bucket": SRC, "objnames": [...], "dst": DST, "archname": "a.tar",
     "format": "tar" | "tgz" | "zip", "isbn": false, "aate": false,
     "continue_on_error": false}

Only the primary owner of ``DST/archname`` works: it reads each object from
its owner (one at a time, spooled to the job's scratch directory), adds it
to the archive it builds there (member name ``obj``, or ``SRC/obj`` with
``isbn``), then stores the archive as a normal write (checksummed, with its
copies). With ``aate`` an existing archive's members come first (AIStore's
append); without it the archive replaces the object. A name that does not
exist is an error naming it: it fails the job, or with ``continue_on_error``
is counted and left out. Progress counts the objects and bytes archived.
"""

from __future__ import annotations

import shutil
import tarfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx

from etl_runtime.core.access import object_url
from etl_runtime.core.errors import BucketNotFound, InvalidRequest
from etl_runtime.core.names import validate_bucket, validate_names
from etl_runtime.jobs.context import JobContext, JobFailed
from etl_runtime.jobs.kinds import register_kind

FORMATS = ("tar", "tgz", "zip")
FIELDS = ("bucket", "objnames", "dst", "archname", "format", "isbn", "aate", "continue_on_error")
MAX_NAMES = 100_000
TIMEOUT = httpx.Timeout(600.0, connect=10.0)


def archive_format(name: str, mime: str) -> str:
    """``tar`` / ``tgz`` / ``zip`` from AIStore's ``mime`` (``.tar``, ``.tgz``, ``.tar.gz``,
    ``.zip``) or, without one, the archive's name; a 400 naming anything else."""
    probe = (mime or name).lower()
    for ext, fmt in ((".tar.gz", "tgz"), (".tgz", "tgz"), (".tar", "tar"), (".zip", "zip")):
        if probe.endswith(ext) or probe.lstrip(".") == ext.lstrip("."):
            return fmt
    what = f"mime {mime!r}" if mime else f"archive name {name!r}"
    raise InvalidRequest(
        f"{what}: Sluice archives as .tar, .tgz (.tar.gz) or .zip (not .tar.lz4)", object=name
    )


async def validate_archive(gw: Any, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"archive job: unknown field(s) {', '.join(unknown)}")
    src, dst = validate_bucket(str(spec.get("bucket"))), validate_bucket(str(spec.get("dst")))
    names = spec.get("objnames")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidRequest(f"archive of {src!r}: no objects to archive", bucket=src)
    if len(names) > MAX_NAMES:
        raise InvalidRequest(f"archive of {src!r}: more than {MAX_NAMES} objects", bucket=src)
    for n in names:
        validate_names(src, n)
    archname = validate_names(dst, str(spec.get("archname")))[1]
    if spec.get("format") not in FORMATS:
        raise InvalidRequest(f"archive {dst}/{archname}: unknown format {spec.get('format')!r}")
    if gw.cmap is not None:
        for b in (src, dst):
            props = gw.cmap.get().buckets.get(b)
            if props is None:
                raise BucketNotFound(f"bucket {b!r} does not exist", bucket=b)
        if gw.cmap.get().buckets[dst].view:
            raise InvalidRequest(f"bucket {dst!r} is an ETL view, read-only", bucket=dst)
    out = {k: spec[k] for k in FIELDS if k in spec}
    out.update(bucket=src, dst=dst, archname=archname, objnames=list(dict.fromkeys(names)))
    return out


def _headers(ctx: JobContext) -> dict[str, str]:
    held = ctx.target.token or ctx.target.read_token
    return {"Authorization": f"Bearer {held}"} if held else {}


async def _fetch(ctx: JobContext, bucket: str, name: str, into: Path) -> int | None:
    """``bucket/name`` from its owner into the file ``into``; its size, None if it is not there."""

    async def get() -> int | None:
        owner = ctx.owners(bucket, name)[0]
        url = object_url(ctx.manager.url(ctx.part, owner), bucket, name)
        async with ctx.manager.http.stream(
            "GET", url, headers=_headers(ctx), timeout=TIMEOUT, follow_redirects=True
        ) as r:
            if r.status_code == 404:
                return None
            if r.status_code != 200:
                body = (await r.aread())[:300].decode(errors="replace")
                raise JobFailed(f"reading {bucket}/{name} from {owner!r}: {r.status_code} {body}")
            size = 0
            async with await anyio.open_file(into, "wb") as f:
                async for chunk in r.aiter_bytes():
                    await f.write(chunk)
                    size += len(chunk)
            return size

    return await ctx.retrying(f"GET {bucket}/{name}", get)


class _Writer:
    """An archive being built in a file (in a worker thread, one member at a time)."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.fmt = fmt
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) if fmt == "zip" else None
        self.tar: tarfile.TarFile | None = None
        if fmt == "tgz":
            self.tar = tarfile.open(path, "w:gz")  # noqa: SIM115
        elif fmt == "tar":
            self.tar = tarfile.open(path, "w")  # noqa: SIM115

    def add(self, member: str, path: Path) -> None:
        if self.zip is not None:
            self.zip.write(path, member)
        else:
            assert self.tar is not None
            self.tar.add(path, member, recursive=False)

    def copy_from(self, existing: Path) -> None:
        """The members of an existing archive of the same format, first."""
        if self.zip is not None:
            with zipfile.ZipFile(existing) as old:
                for info in old.infolist():
                    with old.open(info) as src, self.zip.open(info, "w") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
            return
        assert self.tar is not None
        with tarfile.open(existing, "r:*") as old:
            for member in old:
                self.tar.addfile(member, old.extractfile(member) if member.isfile() else None)

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()
        if self.tar is not None:
            self.tar.close()


async def run_archive(ctx: JobContext) -> None:
    spec = ctx.spec
    src, dst, archname = spec["bucket"], spec["dst"], spec["archname"]
    if not ctx.owns(dst, archname):
        return  # the archive's owner builds it
    coer = bool(spec.get("continue_on_error", False))
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    out = ctx.workdir / f"archive-{uuid.uuid4().hex}"
    part = ctx.workdir / f"member-{uuid.uuid4().hex}"
    writer = await anyio.to_thread.run_sync(_Writer, out, spec["format"])
    try:
        if spec.get("aate") and await _fetch(ctx, dst, archname, part) is not None:
            try:
                await anyio.to_thread.run_sync(writer.copy_from, part)
            except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
                raise JobFailed(
                    f"appending to {dst}/{archname}: it is not a {spec['format']} archive ({e})"
                ) from None
        for name in spec["objnames"]:
            ctx.check()
            size = await _fetch(ctx, src, name, part)
            if size is None:
                ctx.error(name, f"object {src}/{name} does not exist")
                if not coer:
                    raise JobFailed(f"archiving {src}/{name}: the object does not exist")
                continue
            member = f"{src}/{name}" if spec.get("isbn") else name
            await anyio.to_thread.run_sync(writer.add, member, part)
            ctx.progress.add(objects=1, bytes=size)
        await anyio.to_thread.run_sync(writer.close)
        written = await ctx.put_object(dst, archname, _chunks(out))
        ctx.set_output(bucket=src, archive=f"{dst}/{archname}", size=written)
    finally:
        await anyio.to_thread.run_sync(writer.close)
        out.unlink(missing_ok=True)
        part.unlink(missing_ok=True)


async def _chunks(path: Path) -> Any:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(1 << 20):
            yield chunk


register_kind("archive", run_archive, validate=validate_archive)
