"""The target's object store: buckets and objects as files on local disk.

Layout (see docs/processes.md): ``DATA/buckets/<bucket>/<object path>``,
temp files in ``DATA/.tmp/`` on the same filesystem. A write streams into a
temp file while hashing it, fsyncs, stores the MD5 in an extended attribute
of the temp file, renames it into place and fsyncs the directory, so a reader
opens either the whole old object or the whole new one, each with its own
ETag, and an acknowledged write survives a power loss, not only a kill. The
directories a name needs (``a/b/`` of ``a/b/c.jpg``) are created with
``durable.make_dirs``, which fsyncs the parent of each new one: only when a
directory was created, so a write into an existing one pays nothing more.

A full disk (``ENOSPC``) or a spent quota (``EDQUOT``) is ``InsufficientStorage``
(507) naming the target, bucket and object, and the temp file is removed: no
partial object, nothing left taking space.

With a cluster map, the map says which buckets exist (``bucket_known``): a
bucket of the map gets its directory on first use (a target that joined
later, or was away when it was made), and a directory the map no longer lists
is never served.

The store is plain synchronous Python except ``write_object``, which consumes
the request body as it arrives; the web layer runs the blocking calls in a
thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import stat
import threading
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio.to_thread

from etl_runtime.core.durable import fsync_dir, make_dirs
from etl_runtime.core.errors import (
    InsufficientStorage,
    InvalidRequest,
    ObjectNotFound,
    bucket_not_found,
)
from etl_runtime.core.names import SELF, validate_bucket, validate_object
from etl_runtime.storage import integrity
from etl_runtime.storage.integrity import Checksum
from etl_runtime.storage.meta import META_XATTR, check_meta, encode_meta, read_meta

log = logging.getLogger(__name__)

ETAG_XATTR = "user.sluice.md5"
READ_CHUNK = 1 << 20
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})

# Called with (temp path, etag, size) after the body is on disk and before it is
# published: replication writes through to the other copies here.
BeforePublish = Callable[[Path, str, int], Awaitable[None]]


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    size: int
    etag: str
    mtime: float
    # What the writer said about the bytes: {"content-type": ..., "meta": {key: value}}
    # (``check_meta``); empty when nothing was said. Not in listings.
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    # The checksum stored at write time (storage/integrity.py); None: written before them.
    checksum: Checksum | None = field(default=None, compare=False)
    # Which version of which file was opened (``integrity.Verified``); None: not opened.
    stamp: integrity.Stamp | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "etag": self.etag, "mtime": self.mtime}


def _read_etag(fd: int) -> str:
    """The MD5 stored at write time; recomputed if the filesystem lost it."""
    try:
        return os.getxattr(fd, ETAG_XATTR).decode()
    except OSError:
        md5 = hashlib.md5()
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            while block := f.read(READ_CHUNK):
                md5.update(block)
        return md5.hexdigest()


def _info(name: str, fd: int) -> ObjectInfo:
    st = os.fstat(fd)
    etag = _read_etag(fd)
    return ObjectInfo(
        name=name,
        size=st.st_size,
        etag=etag,
        mtime=st.st_mtime,
        meta=read_meta(fd),
        checksum=integrity.stored(fd),
        stamp=integrity.stamp_of(st),
    )


class ObjectStore:
    def __init__(
        self,
        data_dir: Path | str,
        bucket_known: Callable[[str], bool | None] | None = None,
        target_id: str | None = None,
    ):
        # bucket_known(b): True/False from the cluster map, None without one.
        self.bucket_known = bucket_known or (lambda b: None)
        self.target_id = target_id  # named in errors (a full disk)
        self.root = Path(data_dir)
        self.buckets_dir = self.root / "buckets"
        self._buckets_fspath = os.fspath(self.buckets_dir)
        self.tmp_dir = self.root / ".tmp"
        # Told (in the writer's thread) when an object changed or went, (bucket, None) for
        # a whole bucket: the ETL output cache drops what it kept of it (etl/outcache.py).
        self.on_change: Callable[[str, str | None], None] | None = None
        make_dirs(self.buckets_dir)
        make_dirs(self.tmp_dir)
        self._real_buckets = os.path.realpath(self._buckets_fspath)  # object_file's
        self._nesting = threading.Lock()  # one file-to-directory swap or nested write at a time
        for leftover in self.tmp_dir.iterdir():  # interrupted writes of a previous run
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)

    # -- buckets ---------------------------------------------------------------

    def bucket_dir(self, bucket: str) -> Path:
        path = self.buckets_dir / validate_bucket(bucket)
        known = self.bucket_known(bucket)
        if known:
            if not path.is_dir():
                with self.full_disk_is_507(bucket):
                    make_dirs(path, root=self.buckets_dir)
            return path
        if known is False or not path.is_dir():
            raise bucket_not_found(bucket)
        return path

    def list_buckets(self) -> list[str]:
        return sorted(p.name for p in self.buckets_dir.iterdir() if p.is_dir())

    def create_bucket(self, bucket: str) -> bool:
        try:
            with self.full_disk_is_507(bucket):
                (self.buckets_dir / validate_bucket(bucket)).mkdir()
        except FileExistsError:
            return False
        fsync_dir(self.buckets_dir)  # the new bucket survives a power loss
        return True

    def delete_bucket(self, bucket: str) -> None:
        # Rename first so the bucket disappears at once, then remove at leisure.
        trash = self.tmp_dir / f"deleted-{uuid.uuid4().hex}"
        try:
            os.rename(self.buckets_dir / validate_bucket(bucket), trash)
        except FileNotFoundError:
            if self.bucket_known(bucket) is None:
                self.bucket_dir(bucket)  # raises BucketNotFound
            return  # with a map: already gone here (e.g. never used on this target)
        self._changed(bucket, None)
        shutil.rmtree(trash, ignore_errors=True)

    def bucket_dirs(self) -> list[str]:
        """Buckets that have a directory here, whatever the map says."""
        return sorted(p.name for p in self.buckets_dir.iterdir() if p.is_dir())

    def iter_names(self, bucket: str) -> Iterator[str]:
        """Every object name stored here in ``bucket`` (unsorted; published objects only)."""
        bdir = self.buckets_dir / bucket
        for dirpath, _dirs, files in os.walk(bdir):
            rel_dir = os.path.relpath(dirpath, bdir)
            for fname in files:
                yield _name_of(rel_dir, fname)

    def local_path(self, bucket: str, name: str) -> Path:
        """Where ``bucket/name`` lives here (``SELF`` of a name that is also a prefix),
        whether or not it exists."""
        return _file_of(self.buckets_dir / validate_bucket(bucket) / validate_object(bucket, name))

    def local_fspath(self, bucket: str, name: str) -> str:
        """``local_path`` as a string, made without ``pathlib`` (a third of its time:
        GetBatch shares open thousands of objects a second). The plain path: a name
        that is also a prefix is a directory there (``file_of`` gives its file)."""
        bucket, name = validate_bucket(bucket), validate_object(bucket, name)
        return f"{self._buckets_fspath}/{bucket}/{name}"

    def local_fsprefix(self, bucket: str) -> str:
        """``local_fspath(bucket, name)`` less ``name`` (which the caller checks with
        ``validate_object``): a GetBatch share checks each of its few buckets once."""
        return f"{self._buckets_fspath}/{validate_bucket(bucket)}/"

    def remove_if_unchanged(self, bucket: str, name: str, stamp: tuple[int, int, int]) -> bool:
        """Delete the object if it is still the file of ``stamp`` (inode, mtime, size)."""
        path = self.local_path(bucket, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        if (st.st_ino, st.st_mtime_ns, st.st_size) != stamp:
            return False
        path.unlink(missing_ok=True)
        self._changed(bucket, name)
        bdir = self.buckets_dir / bucket
        parent = path.parent
        while parent != bdir:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        return True

    def no_space(
        self, exc: BaseException, bucket: str, name: str | None = None, provider: str = "ais"
    ) -> InsufficientStorage | None:
        """``exc`` as the 507 naming target, bucket and object, if it is ENOSPC or EDQUOT."""
        if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
            return None
        code = errno.errorcode[exc.errno]
        bck = f"{provider}://{bucket}"
        where = f"{bck}/{name}" if name is not None else f"bucket {bck}"
        who = f"target {self.target_id!r}" if self.target_id else "this target"
        return InsufficientStorage(
            f"{who} has no space left for {where} ({code}: {os.strerror(exc.errno)}); "
            "nothing was stored: free space or add capacity, then try again",
            target=self.target_id,
            bucket=bucket,
            object=name,
        )

    @contextlib.contextmanager
    def full_disk_is_507(self, bucket: str, name: str | None = None) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            full = self.no_space(e, bucket, name)
            if full is None:
                raise
            raise full from e

    def _changed(self, bucket: str, name: str | None) -> None:
        if self.on_change is not None:
            try:
                self.on_change(bucket, name)
            except Exception:  # the write itself is done: never fail it for this
                log.exception("on_change(%r, %r) failed", bucket, name)

    # -- objects ---------------------------------------------------------------

    def _object_path(self, bucket: str, name: str) -> Path:
        """The plain path of ``bucket/name`` (a directory if the name is also a prefix)."""
        return self.bucket_dir(bucket) / validate_object(bucket, name)

    def _not_found(self, bucket: str, name: str) -> ObjectNotFound:
        return ObjectNotFound(  # ais://b/o: the aistore SDK raises ErrObjNotFound
            f"object ais://{bucket}/{name} does not exist", bucket=bucket, object=name
        )

    def open_object(self, bucket: str, name: str) -> tuple[IO[bytes], ObjectInfo]:
        """Open the object as it is now; later writes never change what this reads."""
        path = self._object_path(bucket, name)
        try:
            try:
                f = open(path, "rb")  # noqa: SIM115 - the caller streams and closes it
            except IsADirectoryError:  # also a prefix: its file is SELF
                f = open(path / SELF, "rb")  # noqa: SIM115
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise self._not_found(bucket, name) from None
        try:
            return f, _info(name, f.fileno())
        except BaseException:
            f.close()
            raise

    def open_if_tagged(self, bucket: str, name: str) -> tuple[IO[bytes], ObjectInfo] | None:
        """``open_object`` that never reads the file, for the event loop (an open, an
        fstat, a getxattr): None if its ETag is not stored beside it (``open_object``
        would hash the file) or it does not open (``open_object`` says why).

        The path is made as a string, and the bucket's directory is not checked
        first: a bucket the map does not know goes to ``open_object`` (404), and a
        missing directory fails the open itself."""
        if self.bucket_known(bucket) is False:
            return None
        try:
            f = open(self.local_fspath(bucket, name), "rb")  # noqa: SIM115 - the caller's
        except OSError:
            return None
        try:
            st = os.fstat(f.fileno())
            etag = os.getxattr(f.fileno(), ETAG_XATTR).decode()
        except OSError:
            f.close()
            return None
        meta = read_meta(f.fileno())
        cs = integrity.stored(f.fileno())
        return f, ObjectInfo(name, st.st_size, etag, st.st_mtime, meta, cs, integrity.stamp_of(st))

    def verify_object(self, bucket: str, name: str) -> tuple[ObjectInfo, bool | None]:
        """Read the object whole and compare it with its stored checksum: True if it
        matches, False if not. One written before checksums gets one if its MD5 is its
        ETag (``integrity.adopt``; False if not). None: no checksum could be kept (a file
        system without xattrs). Blocking: call from a thread."""
        f, info = self.open_object(bucket, name)
        with f:
            if info.checksum is None:
                cs = integrity.adopt(f.fileno(), info.etag)
                if cs is None:
                    return info, False
                return info, True if integrity.stored(f.fileno()) is not None else None
            ok = integrity.file_matches(f.fileno(), info.checksum)
            if not ok:  # never again taken for verified (integrity.Verified)
                integrity.VERIFIED.forget(info.stamp)
            return info, ok

    def stat_object(self, bucket: str, name: str) -> ObjectInfo:
        f, info = self.open_object(bucket, name)
        f.close()
        return info

    def object_file(self, bucket: str, name: str) -> Path:
        """Absolute path of an existing object (for transformers with direct access).

        The real path of the buckets' directory and the object's name: the store makes
        no links below it, and a transformer resolves what it opens anyway
        (``webserver/fqn.py``), so one ``stat`` does (``Path.resolve`` cost an ETL GET's
        target 0.05-0.1 ms, an ``lstat`` per component)."""
        if self.bucket_known(bucket) is not False:
            try:
                st = os.stat(self.local_fspath(bucket, name))
            except OSError:
                pass  # the slow path below says what is missing
            else:
                if stat.S_ISREG(st.st_mode):
                    return Path(f"{self._real_buckets}/{bucket}/{name}")
        path = _file_of(self._object_path(bucket, name))
        if not path.is_file():
            raise self._not_found(bucket, name)
        return path.resolve()

    def delete_object(self, bucket: str, name: str) -> None:
        bdir = self.bucket_dir(bucket)
        path = _file_of(self._object_path(bucket, name))
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            raise self._not_found(bucket, name) from None
        self._changed(bucket, name)
        # Prune the now-empty "directories" of the name, never the bucket itself.
        parent = path.parent
        while parent != bdir:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list_objects(
        self, bucket: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> tuple[list[ObjectInfo], str | None]:
        """One page of objects sorted by name, and the name to continue after."""
        bdir = self.bucket_dir(bucket)
        start = bdir
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        segments = head.split("/") if head else []
        if all(s not in ("", ".", "..") for s in segments):
            start = bdir.joinpath(*segments)
        names: list[tuple[str, str]] = []  # (name, its file's path below bdir)
        for dirpath, _dirs, files in os.walk(start):
            rel_dir = os.path.relpath(dirpath, bdir)
            for fname in files:
                name = _name_of(rel_dir, fname)
                if name.startswith(prefix) and name > start_after:
                    names.append((name, fname if rel_dir == "." else f"{rel_dir}/{fname}"))
        names.sort()
        page: list[ObjectInfo] = []
        for name, rel in names:
            if len(page) == limit:
                return page, page[-1].name
            try:
                with open(bdir / rel, "rb") as f:
                    page.append(_info(name, f.fileno()))
            except OSError:  # deleted while we listed
                continue
        return page, None

    async def write_object(
        self,
        bucket: str,
        name: str,
        body: AsyncIterable[bytes],
        before_publish: BeforePublish | None = None,
        if_absent: bool = False,
        meta: Mapping[str, Any] | None = None,
        expect: tuple[str | None, str | None] = (None, None),
    ) -> ObjectInfo | None:
        """Stream ``body`` into a temp file, then atomically publish it as the object.

        ``if_absent``: keep an existing object and return None (a rebalance
        never overwrites what the new owner already has: it is as new or newer).
        ``meta``: its content type and user metadata (``check_meta``), stored
        beside the bytes before they are published, so a reader sees both or neither.
        ``expect``: the sender's (MD5, checksum) of a copy: a copy that arrived
        otherwise is refused (400) before it is published.
        """
        bdir = self.bucket_dir(bucket)
        validate_object(bucket, name)
        kept = check_meta(meta, bucket, name)
        tmp = self.tmp_dir / f"put-{uuid.uuid4().hex}"
        md5, xxh = hashlib.md5(), integrity.new_hash()
        size = 0
        f: IO[bytes] | None = None
        try:
            f = open(tmp, "wb")  # noqa: SIM115 - closed in _flush or below
            async for chunk in body:
                md5.update(chunk)
                xxh.update(chunk)
                f.write(chunk)  # page-cache writes are fast; fsync happens in a thread
                size += len(chunk)
            etag = md5.hexdigest()
            cs = Checksum(xxh.hexdigest(), size)
            self._check_copy(bucket, name, expect, etag, cs)
            await anyio.to_thread.run_sync(self._flush, f, etag, kept, cs)
            if before_publish is not None:
                await before_publish(tmp, etag, size)
            stored = await anyio.to_thread.run_sync(
                self._publish, tmp, bdir, bucket, name, if_absent
            )
            if not stored:
                tmp.unlink(missing_ok=True)
                return None
        except BaseException as e:
            if f is not None:
                with contextlib.suppress(OSError):  # its flush may fail again (ENOSPC)
                    f.close()
            tmp.unlink(missing_ok=True)
            full = self.no_space(e, bucket, name)
            if full is not None:
                raise full from e
            raise
        mtime = os.stat(_file_of(bdir / name)).st_mtime
        return ObjectInfo(name, size, etag, mtime, kept, cs)

    @staticmethod
    def _check_copy(
        bucket: str, name: str, expect: tuple[str | None, str | None], etag: str, cs: Checksum
    ) -> None:
        want_md5, want_xxh = expect
        got = integrity.parse(want_xxh) if want_xxh else None
        if (want_md5 and want_md5 != etag) or (got is not None and got != cs):
            raise InvalidRequest(
                f"copy of {bucket}/{name} arrived damaged (md5 {etag}, checksum {cs.value}; "
                f"sent {want_md5}, {want_xxh}); nothing was stored",
                bucket=bucket,
                object=name,
            )

    @staticmethod
    def _flush(f: IO[bytes], etag: str, meta: dict[str, Any], cs: Checksum | None = None) -> None:
        f.flush()
        try:
            os.setxattr(f.fileno(), ETAG_XATTR, etag.encode())
        except OSError:
            pass  # no xattrs here: the ETag is recomputed when read
        if cs is not None:
            integrity.store(f.fileno(), cs.digest, cs.size)
        if meta:  # no fallback: a filesystem without xattrs cannot keep it, and says so
            os.setxattr(f.fileno(), META_XATTR, encode_meta(meta))
        os.fsync(f.fileno())
        f.close()

    def _publish(
        self, tmp: Path, bdir: Path, bucket: str, name: str, if_absent: bool, durable: bool = True
    ) -> bool:
        """Rename ``tmp`` into place; ``durable``: and fsync its directory (a remote
        bucket's cache fill is not durable: ``providers/cache.py`` says why).

        A name that is also a prefix, or below one that is an object, is placed under
        the nesting lock (the module's docstring)."""
        for _attempt in range(10):  # a concurrent delete may prune our parent dirs
            try:
                try:
                    stored = self._place(tmp, bdir, name, if_absent, durable, nested=False)
                except (NotADirectoryError, IsADirectoryError, FileExistsError):
                    with self._nesting:
                        stored = self._place(tmp, bdir, name, if_absent, durable, nested=True)
            except FileNotFoundError:
                if not bdir.is_dir():
                    self.bucket_dir(bucket)  # raises BucketNotFound
                continue
            if stored:
                self._changed(bucket, name)
            return stored
        raise OSError(f"could not publish {bucket}/{name}: parent directories kept vanishing")

    def _place(
        self, tmp: Path, bdir: Path, name: str, if_absent: bool, durable: bool, nested: bool
    ) -> bool:
        dest = bdir / name
        if nested:
            here = bdir
            for segment in name.split("/")[:-1]:  # a prefix that is an object: a directory
                here = here / segment
                if here.is_file():
                    self._nest(here)
            if dest.parent != bdir:
                make_dirs(dest.parent, root=bdir)
            if dest.is_dir():
                dest = dest / SELF
        elif dest.parent != bdir:
            make_dirs(dest.parent, root=bdir)  # fsyncs only what it created
        if if_absent:
            try:
                os.link(tmp, dest)  # atomic: fails if the name exists
            except FileExistsError:
                if not nested and dest.is_dir():
                    raise IsADirectoryError(errno.EISDIR, "a prefix of other objects") from None
                return False
            tmp.unlink()
        else:
            os.replace(tmp, dest)
        if durable:
            fsync_dir(dest.parent)
        return True

    def _nest(self, path: Path) -> None:
        """The object file ``path`` becomes ``path/SELF``, in one atomic swap (nesting lock
        held): names below ``path`` can then be stored."""
        swap = self.tmp_dir / f"nest-{uuid.uuid4().hex}"
        swap.mkdir()
        try:
            try:
                os.link(path, swap / SELF)
            except FileNotFoundError:
                return  # deleted meanwhile: nothing to keep
            try:
                _exchange(swap, path)
            except FileNotFoundError:
                return  # deleted between the link and the swap: not kept
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                    raise
                # No RENAME_EXCHANGE on this filesystem: the name is missing for a moment.
                os.unlink(path)
                os.rename(swap, path)
            else:  # ``swap`` is now the file that was ``path``
                if os.stat(swap).st_ino != os.stat(path / SELF).st_ino:
                    os.replace(swap, path / SELF)  # published between the link and the swap
            fsync_dir(path)
            fsync_dir(path.parent)
        finally:
            with contextlib.suppress(OSError):
                if swap.is_dir():
                    shutil.rmtree(swap)
                else:
                    swap.unlink()


def _name_of(rel_dir: str, fname: str) -> str:
    """The object name of the file ``fname`` in ``rel_dir`` (below the bucket's directory)."""
    if rel_dir == ".":
        return fname
    return rel_dir if fname == SELF else f"{rel_dir}/{fname}"


def _file_of(path: Path) -> Path:
    """The file of the object at ``path``: ``path/SELF`` where the name is also a prefix."""
    return path / SELF if path.is_dir() else path


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(b))
