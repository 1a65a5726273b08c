"""The target's half of GetBatch: ``POST /v1/_moss``, this target's share of a batch in one answer.

The caller is the gateway's ``getbatch/shares.py``; the exchange
(manifest, then TAR entries back to back) is drawn in ``getbatch/exchange.py``.
Every item is opened before the answer starts: its outcome goes into the
manifest, a small file's bytes are read right there (up to ``READ_HERE_BUDGET``
per answer), a bigger file stays open and is sent with ``os.sendfile`` when
its turn comes. A share of up to ``LOOP_ITEMS`` items is opened on the event
loop, reading at most ``LOOP_READ_BUDGET`` (as a GET opens its object on
the loop, ``store.open_if_tagged``); a bigger one in one trip to a worker
thread. In the thread, every ``open``, ``fstat``, ``pread`` and ``close``
let go of the interpreter lock, and the loop, busy with the other shares,
took it back each time: py-spy put a quarter of a target's CPU per 10 KiB
item in that hand-over and anyio's thread machinery (``git show
f8a3f49:docs/benchmarks.md``, "Shares opened on the loop"). An item this target
should not answer from its own disk (it is not an owner, or a copy may still
be on a neighbour) is marked "elsewhere" and the gateway reads it with a
plain GET, which knows how to redirect or pull it.

A share that names an ETL (``getbatch_etl.py``) is transformed here, several
items at once, before the answer starts: each output is then an entry as a
file is, from memory or from a temporary file.

Errors of one item (a missing object, a bad range, the ETL's) are that item's manifest
entry, with the body and status a GET would have answered; only a malformed
request (the gateway's bug, not the user's) is refused as a whole.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from dataclasses import dataclass
from typing import IO, Any

import anyio.to_thread
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from etl_runtime.cluster.clustermap import ClusterMap
from etl_runtime.core.access import require_read
from etl_runtime.core.errors import (
    InvalidRequest,
    ObjectNotFound,
    RangeNotSatisfiable,
    SluiceError,
)
from etl_runtime.core.jsonbody import read_json
from etl_runtime.core.names import SELF, validate_names, validate_object
from etl_runtime.getbatch.exchange import (
    ELSEWHERE,
    OK,
    SHARE_ETL_PATH,
    SHARE_PATH,
    encode_manifest,
    padding,
    tar_header,
)
from etl_runtime.storage import integrity
from etl_runtime.storage.integrity import Checksum
from etl_runtime.storage_target.context import Target
from etl_runtime.storage_target.getbatch_etl import EtlShare, Output
from etl_runtime.wire.http.fastpath import FastRouter
from etl_runtime.wire.http.zerocopy import EXTENSION, offers_zerocopy

SMALL = 64 << 10  # a file up to this size is read with the manifest and sent from memory
READ_HERE_BUDGET = 8 << 20  # bytes read that way per answer; the rest goes by sendfile
LOOP_ITEMS = 128  # a share of up to this many (a whole part of the gateway) opened on the loop...
LOOP_READ_BUDGET = 1 << 20  # ... reading at most this much there (the rest: sendfile)
FLUSH = 1 << 20  # bytes gathered before a write
COPY_BLOCK = 1 << 20  # without sendfile: a big file is read in blocks of this size
MAX_ITEMS = 4096


@dataclass(slots=True)  # one per item of every share
class _Entry:
    head: bytes  # the TAR header
    size: int
    file: IO[bytes] | None = None  # sent from ``offset`` when its turn comes
    offset: int = 0
    data: bytes | None = None  # a small file, already read
    check: Checksum | None = None  # a file's stored checksum, checked as it is sent
    what: str = ""  # bucket/object, for the log of a mismatch
    stamp: integrity.Stamp | None = None  # which file ``check`` is of (a match is noted)


Row = tuple[str, str, int, int, str, str]  # bucket, object, start, length, name, archpath


def share_rows(body: Any) -> list[Row]:
    raw = body.get("in") if isinstance(body, dict) else None
    if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
        raise InvalidRequest(f"a GetBatch share is {{'in': [...]}} of at most {MAX_ITEMS} items")
    out = []
    for i, it in enumerate(raw):
        # type(...) is, not isinstance: JSON gives exact types, and a bool is no offset
        ok = type(it) is list and len(it) in (5, 6)
        if ok:
            b, o, start, length, arcname, archpath = it if len(it) == 6 else [*it, ""]
            ok = (
                type(b) is str
                and type(o) is str
                and type(arcname) is str
                and type(archpath) is str
                and type(start) is int
                and type(length) is int
                and 0 <= start < 1 << 62
                and -1 <= length < 1 << 62
            )
        if not ok:
            raise InvalidRequest(
                f"GetBatch share: in[{i}] is not [bucket, object, start, length, "
                "name_in_archive(, archpath)]"
            )
        out.append((b, o, start, length, arcname, archpath))
    return out


def share_chain(body: dict[str, Any]) -> tuple[list[str], str | None]:
    chain, args = body.get("etl") or [], body.get("etl_args")
    if not isinstance(chain, list) or not all(isinstance(x, str) and x for x in chain):
        raise InvalidRequest("GetBatch share: 'etl' is a list of ETL names")
    if args is not None and not isinstance(args, str):
        raise InvalidRequest("GetBatch share: 'etl_args' is a string")
    return chain, args


class Share:
    """Opening every item of a share (in a worker thread) and what came of it."""

    def __init__(self, target: Target, placed: Any = None) -> None:
        self.target = target
        self.placed = placed  # [target id, map version] the gateway placed the items by
        self.placed_here = False  # ... and they are this target's and this map's
        self.manifest: list[list[Any]] = []
        self.entries: list[_Entry] = []
        self.inline = 0
        self.budget = READ_HERE_BUDGET
        self.mtime = 0
        self.cmap: ClusterMap | None = None
        self.etl: EtlShare | None = None
        self._prefixes: dict[str, str] = {}  # bucket -> its directory, the name checked

    def _look(self) -> None:
        placement = self.target.placement
        if placement is not None and placement.cmap is not None:
            self.cmap = placement.cmap.get()  # one look for the whole share
            # The gateway chose this target among each item's owners under the same map:
            # owners() would say the same for every item (a pure function of the map).
            self.placed_here = self.placed == [placement.self_id, self.cmap.version]

    def open_all(self, items: list[Row], mtime: int, budget: int = READ_HERE_BUDGET) -> None:
        """Open every item; read small ones whole, up to ``budget`` bytes in all."""
        self.mtime = mtime
        self.budget = budget
        self._look()
        for item in items:
            try:
                try:
                    if item[5]:
                        raise InvalidRequest("a file in a shard (archpath) needs an ETL")
                    self._open(*item[:5])
                except (ValueError, UnicodeError) as e:  # a name no TAR header can carry
                    raise InvalidRequest(f"{item[0]}/{item[1]}: {e}") from e
            except SluiceError as e:
                self.manifest.append([e.status, e.body()])

    def _open(self, bucket: str, name: str, start: int, length: int, arcname: str) -> None:
        store, placement = self.target.store, self.target.placement
        prefix = self._prefixes.get(bucket)
        if prefix is None:
            prefix = self._prefixes[bucket] = store.local_fsprefix(bucket)  # checks the name
        path = prefix + validate_object(bucket, name)
        if self._not_an_owner(bucket, name):
            self.manifest.append([ELSEWHERE])
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            if placement is not None and placement.may_be_elsewhere(bucket):
                self.manifest.append([ELSEWHERE])
                return
            store.bucket_dir(bucket)  # BucketNotFound before "no such object"
            raise ObjectNotFound(  # ais://b/o: the aistore SDK raises ErrObjNotFound
                f"object ais://{bucket}/{name} does not exist", bucket=bucket, object=name
            ) from None
        owned = True  # fd is ours to close on a failure
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):  # a name that is also a prefix: its file is SELF
                os.close(fd)
                owned = False
                try:
                    fd = os.open(f"{path}/{SELF}", os.O_RDONLY)
                except OSError:
                    fd = -1
                else:
                    owned = True
                    st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # (or a directory without SELF)
                raise ObjectNotFound(
                    f"object ais://{bucket}/{name} does not exist", bucket=bucket, object=name
                )
            size = st.st_size
            cs = integrity.stored(fd) if integrity.verify_reads() else None
            if cs is not None and cs.size != size:  # cut short (or grown): never sent
                owned = False
                os.close(fd)
                return self._corrupted(bucket, name)
            offset, n = 0, size
            if start or length:
                if start >= size:
                    raise RangeNotSatisfiable(
                        f"start={start} is past the end of the object ({size} bytes)",
                        bucket=bucket,
                        object=name,
                    )
                offset = start
                n = size - start if length == -1 else min(length, size - start)
            entry = _Entry(tar_header(arcname, n, self.mtime), n, None, offset)
            if cs is not None and size > SMALL:
                stamp = integrity.stamp_of(st)
                if integrity.VERIFIED.fresh(stamp, cs):  # matched lately, unchanged since:
                    cs = None  # sent as an unchecked file is (sendfile)
                else:
                    entry.stamp = stamp
            if cs is not None and size <= SMALL and self.inline + size <= self.budget:
                data = os.pread(fd, size, 0)  # the whole object, checked before it is sent
                if not cs.matches(data):
                    os.close(fd)
                    owned = False
                    return self._corrupted(bucket, name)
                entry.data = data[offset : offset + n] if n != size else data
                self.inline += n
                owned = False
                os.close(fd)
            elif n <= SMALL and self.inline + n <= self.budget and cs is None:
                data = os.pread(fd, n, offset)
                if len(data) != n:  # objects are replaced by rename, never cut: a disk fault
                    raise OSError(f"a short read ({len(data)} of {n} bytes)")
                entry.data = data
                self.inline += n
                owned = False
                os.close(fd)
            else:
                entry.file = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed when sent
                entry.check, entry.what = cs, f"{bucket}/{name}"
                owned = False
        except BaseException as e:
            if owned:
                os.close(fd)
            if isinstance(e, OSError):  # the disk failed this item: named, not a bare 500
                raise SluiceError(
                    f"target {self.target.id} could not read ais://{bucket}/{name}: "
                    f"{e.strerror or e}",  # (str(e) would name the file's path)
                    bucket=bucket,
                    object=name,
                    target=self.target.id,
                ) from e
            raise
        self.entries.append(entry)
        self.manifest.append([OK, n, len(entry.head)])

    def _corrupted(self, bucket: str, name: str) -> None:
        """An item whose bytes do not match its checksum: the gateway's GET (which repairs
        it from a copy) when the bucket keeps copies, else that item's ObjectCorrupted."""
        integrity.found_bad(bucket, name, self.target.id)
        placement = self.target.placement
        if placement is not None and placement.keeps_copies(bucket):
            self.manifest.append([ELSEWHERE])
            return
        raise integrity.corrupted(bucket, name, self.target.id)

    def _not_an_owner(self, bucket: str, name: str) -> bool:
        """``Placement.read_owner`` is not None, with the map looked up once per share."""
        cmap, placement = self.cmap, self.target.placement
        if cmap is None or placement is None or self.placed_here:
            return False
        if cmap.version == 0 or not cmap.members or bucket not in cmap.buckets:
            return False
        return placement.self_id not in cmap.owners(bucket, name)

    def owned(self, items: list[Row]) -> list[bool]:
        """Per item: this target answers it (else ELSEWHERE: the gateway's GET)."""
        self._look()
        placement, store = self.target.placement, self.target.store
        out = []
        for b, o, *_ in items:
            validate_names(b, o)
            mine = not self._not_an_owner(b, o)
            if mine and placement is not None and placement.may_be_elsewhere(b):
                mine = os.path.isfile(store.local_path(b, o))
            out.append(mine)
        return out

    async def transform_all(
        self, items: list[Row], chain: list[str], args: str | None, mtime: int
    ) -> None:
        """Every item through the ETL chain (``getbatch_etl.py``), then the manifest."""
        self.mtime = mtime
        rows = [(b, o, archpath) for b, o, _, _, _, archpath in items]
        owned = functools.partial(self.owned, items)  # in the share's one thread hop
        etl = self.etl = EtlShare(self.target, chain, args, rows, owned)
        await etl.run()
        for item, outcome in zip(items, etl.outcomes, strict=True):
            if isinstance(outcome, SluiceError):
                self.manifest.append([outcome.status, outcome.body()])
            elif isinstance(outcome, Output):
                try:
                    head = tar_header(item[4], outcome.size, mtime)
                except (ValueError, UnicodeError) as e:
                    err = InvalidRequest(f"{item[0]}/{item[1]}: {e}")
                    self.manifest.append([err.status, err.body()])
                    continue
                self.entries.append(_Entry(head, outcome.size, outcome.file, 0, outcome.data))
                self.manifest.append([OK, outcome.size, len(head)])
            else:
                self.manifest.append([ELSEWHERE])

    def close(self) -> None:
        for e in self.entries:
            if e.file is not None:
                e.file.close()
        if self.etl is not None:
            self.etl.close()


class ShareResponse(Response):
    """The manifest, then every entry; big files by ``os.sendfile`` where the server offers it."""

    def __init__(self, share: Share, zerocopy: bool) -> None:
        super().__init__(None, media_type="application/octet-stream")
        self.share, self.zerocopy = share, zerocopy
        self.manifest = encode_manifest(share.manifest)
        total = len(self.manifest) + sum(
            len(e.head) + e.size + padding(e.size) for e in share.entries
        )
        self.headers["content-length"] = str(total)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            pending, size = [self.manifest], len(self.manifest)
            for e in self.share.entries:
                pending.append(e.head)
                size += len(e.head)
                if e.data is None:
                    await send(
                        {"type": "http.response.body", "body": b"".join(pending), "more_body": True}
                    )
                    pending, size = [], 0
                    await self._send_file(send, e)
                elif e.size:
                    pending.append(e.data)
                    size += e.size
                if pad := padding(e.size):
                    pending.append(bytes(pad))
                    size += pad
                if size >= FLUSH:
                    await send(
                        {"type": "http.response.body", "body": b"".join(pending), "more_body": True}
                    )
                    pending, size = [], 0
            await send({"type": "http.response.body", "body": b"".join(pending)})
        finally:
            self.share.close()

    async def _send_file(self, send: Send, e: _Entry) -> None:
        assert e.file is not None
        if e.check is not None:
            if e.offset == 0 and e.size == e.check.size:  # checked as it goes
                await self._send_checked(send, e, e.check)
                return
            # A part of a big object: all of it checked first.
            started = time.time_ns()
            if not await anyio.to_thread.run_sync(integrity.file_matches, e.file.fileno(), e.check):
                raise self._cut(e)
            integrity.VERIFIED.note(e.stamp, e.check, started)
        if self.zerocopy:
            await send(
                {
                    "type": EXTENSION,
                    "file": e.file,
                    "offset": e.offset,
                    "count": e.size,
                    "more_body": True,
                }
            )
            return
        fd, offset, left = e.file.fileno(), e.offset, e.size
        while left > 0:
            block = await anyio.to_thread.run_sync(os.pread, fd, min(left, COPY_BLOCK), offset)
            if not block:  # cannot happen (objects are replaced by rename): drop the connection
                raise OSError(f"an object of the batch ended {left} bytes early")
            offset += len(block)
            left -= len(block)
            await send({"type": "http.response.body", "body": block, "more_body": True})

    def _cut(self, e: _Entry) -> OSError:
        """A mismatch found while the answer is sent: the connection drops before the
        entry's last byte, so the gateway (and a tar reader) never takes it as whole."""
        bucket, _, name = e.what.partition("/")
        integrity.VERIFIED.forget(e.stamp)
        integrity.found_bad(bucket, name, self.share.target.id)
        return OSError(f"ais://{e.what} does not match its checksum: the batch was cut short")

    async def _send_checked(self, send: Send, e: _Entry, cs: Checksum) -> None:
        assert e.file is not None
        started = time.time_ns()
        fd, offset, h, held = e.file.fileno(), 0, integrity.new_hash(), None
        while offset < e.size:
            block = await anyio.to_thread.run_sync(
                os.pread, fd, min(e.size - offset, COPY_BLOCK), offset
            )
            if not block:
                break
            h.update(block)
            offset += len(block)
            if held is not None:
                await send({"type": "http.response.body", "body": held, "more_body": True})
            held = block
        if offset != e.size or h.hexdigest() != cs.digest:
            raise self._cut(e)
        integrity.VERIFIED.note(e.stamp, cs, started)  # the next GET or batch: no hash
        if held is not None:
            await send({"type": "http.response.body", "body": held, "more_body": True})


async def open_share(target: Target, body: Any, etl: bool) -> Share:
    """The share a request body asks for, every item opened (or transformed); the
    caller closes it. ``etl``: the route taken is the one for ETL shares."""
    items = share_rows(body)
    chain, args = share_chain(body)
    if etl != bool(chain):
        raise InvalidRequest(
            f"GetBatch share: {SHARE_ETL_PATH} takes the items of an ETL ('etl'), "
            f"{SHARE_PATH} plain ones"
        )
    share = Share(target, body.get("placed"))
    mtime = int(time.time())
    try:
        if chain:
            await share.transform_all(items, chain, args, mtime)
        elif len(items) <= LOOP_ITEMS:
            share.open_all(items, mtime, LOOP_READ_BUDGET)  # on the loop: see above
        else:
            await anyio.to_thread.run_sync(share.open_all, items, mtime)
    except BaseException:
        share.close()
        raise
    return share


def batch_router(target: Target) -> FastRouter:
    router = FastRouter()

    async def answer(request: Request, etl: bool) -> Response:
        require_read(request, target.read_token, target.token, target.cluster_key)
        body = await read_json(request, "a GetBatch share")
        share = await open_share(target, body, etl)
        return ShareResponse(share, offers_zerocopy(request.scope))

    @router.post(SHARE_PATH)
    async def batch_share(request: Request) -> Response:
        return await answer(request, etl=False)

    @router.post(SHARE_ETL_PATH)
    async def batch_share_etl(request: Request) -> Response:
        return await answer(request, etl=True)

    router.fast(SHARE_PATH, ["POST"])  # wire/http/fastpath.py
    router.fast(SHARE_ETL_PATH, ["POST"])
    return router
