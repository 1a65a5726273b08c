"""GetBatch items read in shares: one request to each target for all of its items.

Caller: ``assemble.Assembler``. Items a target can answer from its own disk
(whole objects or byte ranges of ``ais`` buckets; with an ETL, whole objects
and files in shards: ``shareable``) are grouped by the target a GET would be
sent to (``read_router``: the host's ``read_owner`` choice) and by ETL (the
batch's, or a view's, with its args), in request order, and asked for in
parts of ``PART`` items (``ETL_PART`` through an ETL: the target transforms
a part's items, several at once, before it answers); the exchange (a manifest of every item's
outcome, then the TAR entries back to back) is drawn in ``getbatch/exchange.py``.
``AHEAD`` parts per target are in flight at once, so every target reads its
disk and sends while the gateway writes another target's items; what the
gateway has not taken yet waits in socket buffers (the gateway reads a share
only when it writes that share's item: TCP pushes back on the target), so
memory stays bounded whatever the batch's size. A part of small entries
(``SMALL_ENTRY``, ``WHOLE_PART`` in all) is read whole once its manifest is
in, and each item's entry is a slice of it (``ShareItem.entry``): a batch of
10 KiB objects read one socket per item before, with a copy into a buffer,
out of it and into the answer. Such a part counts as consumed once the
assembler wrote all its entries (``took``), so it is still bounded.

A ``ShareItem``'s ``head`` resolves when its part's manifest arrives (a part
read whole: once all of it is in): the
object's size, a ``Failed`` (the item's error as a GET would have answered
it, classified by ``items.relayed``), or ``ELSEWHERE`` (the target does not
hold it now: the assembler reads it with a plain GET, ``items.Slot``). A
target that does not answer, answers a share with an error, or breaks off
mid-share fails the items still to come with an error naming the target;
after the answer started that means a broken archive and a dropped
connection, never a short one that looks whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, cast

from etl_runtime.cluster.clustermap import ClusterMap, hrw_first
from etl_runtime.cluster.hrw import hrw_owner, object_key
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.errors import NoTargets, SluiceError
from etl_runtime.getbatch.exchange import (
    ELSEWHERE,
    MANIFEST_LEN,
    MANIFEST_MAX,
    OK,
    SHARE_ETL_PATH,
    SHARE_PATH,
    Moved,
    ShareBody,
    ShareBroken,
    SharePool,
    padding,
)
from etl_runtime.getbatch.host import BatchHost
from etl_runtime.getbatch.items import ERROR_BODY_MAX, ITEM_TIMEOUT, Failed, relayed
from etl_runtime.getbatch.request import BatchRequest, Item

log = logging.getLogger(__name__)

PART = 128  # items per share request
AHEAD = 2  # share requests in flight per target
ETL_PART = 32  # the same through an ETL: the target transforms a part before it answers
ETL_AHEAD = 3
SMALL_ENTRY = 64 << 10  # an object up to this size is relayed with its header in one piece
# A part whose entries are all small and together at most this big is read in one piece as
# soon as its manifest is in; each item's entry is then a slice of it (``ShareItem.entry``)
WHOLE_PART = 1 << 20
POOL = SharePool()  # this process's connections to targets for shares


class Elsewhere:
    """The target does not hold the item now: read it with a plain GET."""


READ_BY_GET: Final = Elsewhere()
Head = int | Failed | Elsewhere


def shareable(item: Item) -> bool:
    """On its target's disk (an ``ais`` bucket); an ``archpath`` only through an ETL (the
    target picks the file out of the transformed shard)."""
    return not item.read_provider and (not item.archpath or bool(item.etl))


EtlKey = tuple[tuple[str, ...], str | None]  # (chain, etl_args): one share per target and key


class ShareItem:
    """One item of a target's share: ``head``, then its entry from ``TargetShare.entry``."""

    # one per item of every batch: no instance dict to allocate, and one less object for
    # the GC to walk while the batch is in flight
    __slots__ = ("share", "item", "name", "head", "header_len", "part", "entry")

    def __init__(self, share: TargetShare, item: Item, name: str) -> None:
        self.share, self.item = share, item
        self.name = name  # in the answer's archive
        self.head: asyncio.Future[Head] = share.loop.create_future()
        self.header_len = 0  # bytes of the TAR header the target wrote
        self.part: _Part | None = None
        # the whole TAR entry (header, bytes, padding), where the part was read in one piece
        # (set before ``head``); the assembler takes it with ``took``
        self.entry: memoryview | None = None


class _Part:
    def __init__(self, items: list[ShareItem]) -> None:
        self.items = items
        self.body: ShareBody | None = None
        self.entries_left = 0  # OK items whose entries are still in the body
        self.consumed = asyncio.Event()  # the body was read to its end (or given up)
        self.task: asyncio.Task[None] | None = None
        for si in items:
            si.part = self


class TargetShare:
    """Every shareable item of one batch that one target owns, asked for in parts."""

    def __init__(
        self, gw: BatchHost, target: TargetInfo, etl: EtlKey = ((), None), map_version: int = -1
    ) -> None:
        self._gw, self.target = gw, target
        # looked up once, not per item (Python 3.11's get_running_loop is a getpid() call)
        self.loop = asyncio.get_running_loop()
        # a share of the assembling target itself: read (or transformed) in this process
        self._local = gw.local_share(target.id)
        self.map_version = map_version  # of the cluster map that placed the items (-1: none)
        self.etl = etl  # every item of this share goes through this ETL chain (or none)
        self._part_size, self._ahead = (ETL_PART, ETL_AHEAD) if etl[0] else (PART, AHEAD)
        self.items: list[ShareItem] = []
        self.splice = False  # big entries go socket to socket (``wire/http/splice.py``)
        self._parts: deque[_Part] = deque()
        self._started = 0

    def add(self, item: Item, name: str) -> ShareItem:
        si = ShareItem(self, item, name)
        self.items.append(si)
        return si

    def start(self) -> None:
        n = self._part_size
        self._parts.extend(_Part(self.items[k : k + n]) for k in range(0, len(self.items), n))
        self._fill()

    def _fill(self) -> None:
        while self._started < len(self._parts) and self._started < self._ahead + self._done():
            part = self._parts[self._started]
            part.task = asyncio.create_task(self._run(part))
            self._started += 1

    def _done(self) -> int:
        return sum(1 for p in self._parts if p.consumed.is_set())

    def close(self) -> None:
        """Stop every part in flight (synchronous: safe while being cancelled)."""
        for part in self._parts:
            if part.task is not None:
                part.task.cancel()
        self._started = len(self._parts)

    def _away_message(self, si: ShareItem, why: str) -> str:
        return f"in[{si.item.index}] {si.item.cname()}: target {self.target.id} {why}; retry"

    def _away(self, si: ShareItem, why: str) -> NoTargets:
        item = si.item
        return NoTargets(
            self._away_message(si, why),
            bucket=item.bucket,
            object=item.name,
            target=self.target.id,
        )

    async def _run(self, part: _Part) -> None:
        answer: ShareBody | None = None
        try:
            answer = await self._request(part)
            if answer is not None:
                await self._manifest(part, answer)
                await part.consumed.wait()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every item still open fails, naming the target: no hang
            if not isinstance(e, OSError | ValueError):  # ValueError: a manifest not JSON
                log.exception("GetBatch share of target %s failed", self.target.id)
            for si in part.items:
                if not si.head.done():
                    err = self._away(si, f"did not answer ({type(e).__name__}: {e})")
                    si.head.set_result(Failed(err, per_item=False))
        finally:
            part.consumed.set()
            self._fill()
            if answer is not None:
                answer.close()  # a no-op once the body was read to its end

    async def _request(self, part: _Part) -> ShareBody | None:
        rows: list[list[Any]] = []
        for si in part.items:
            it = si.item
            row: list[Any] = [it.read_bucket, it.name, it.start, it.length, si.name]
            if it.archpath:
                row.append(it.archpath)
            rows.append(row)
        ask: dict[str, Any] = {"in": rows}
        if self.map_version >= 0:  # the target skips its owner check under the same map
            ask["placed"] = [self.target.id, self.map_version]
        chain, args = self.etl
        if chain:
            ask["etl"] = list(chain)
            ask["etl_args"] = args
        if self._local is not None:
            try:
                return cast(ShareBody, await self._local(ask))
            except SluiceError as e:  # what the target would have answered
                self._refused(part, e.status, e.body(), e.headers.get("Retry-After"))
                return None
        body = json.dumps(ask, separators=(",", ":")).encode()
        headers = {**self._gw.target_headers(), "Content-Type": "application/json"}
        path = SHARE_ETL_PATH if chain else SHARE_PATH
        answer = await POOL.post(self.target.url, path, headers, body, ITEM_TIMEOUT)
        if answer.status == 200:
            return answer
        raw = await answer.read_all(ERROR_BODY_MAX)
        if answer.status in (404, 405):  # a target without shares: plain GETs
            for si in part.items:
                si.head.set_result(READ_BY_GET)
            return None
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {"error": f"answered {answer.status}: {raw[:300]!r}"}
        self._refused(part, answer.status, payload, answer.headers.get("retry-after"))
        return None

    def _refused(
        self, part: _Part, status: int, payload: dict[str, Any], retry_after: str | None
    ) -> None:
        """The target refused the whole part: every item fails with what it said."""
        payload.setdefault("target", self.target.id)
        for si in part.items:
            failed = relayed(status, payload, si.item, retry_after)
            si.head.set_result(Failed(failed.error, per_item=False))

    async def _manifest(self, part: _Part, answer: ShareBody) -> None:
        body = part.body = answer
        (n,) = MANIFEST_LEN.unpack(await body.exactly(MANIFEST_LEN.size))
        if n > MANIFEST_MAX:
            raise ShareBroken(f"a share manifest of {n} bytes")
        entries: list[list[Any]] = json.loads(await body.exactly(n))
        if len(entries) != len(part.items):
            raise ShareBroken(f"{len(entries)} manifest entries for {len(part.items)} items")
        total, small = 0, True
        for e in entries:
            if e[0] == OK:
                size = e[1]
                total += e[2] + size + padding(size)
                small = small and size <= SMALL_ENTRY
        whole = None
        read_whole = small and total <= WHOLE_PART
        if read_whole:
            # every entry in one read: per item a slice, not a read of the socket
            whole = memoryview(await body.block(total)) if total else None
            await body.end()
        off = 0
        for si, e in zip(part.items, entries, strict=True):
            status = e[0]
            if status == OK:
                size = e[1]
                si.header_len = e[2]
                if whole is not None:
                    end = off + e[2] + size + padding(size)
                    si.entry, off = whole[off:end], end
                part.entries_left += 1
                si.head.set_result(size)
            elif status == ELSEWHERE:
                si.head.set_result(READ_BY_GET)
            else:
                si.head.set_result(relayed(status, e[1], si.item, None))
        if not part.entries_left:
            if not read_whole:
                await body.end()
            self._consumed(part)

    def took(self, si: ShareItem) -> None:
        """The assembler wrote ``si.entry``: the part is done once every entry was."""
        si.entry = None
        part = si.part
        assert part is not None
        part.entries_left -= 1
        if not part.entries_left:
            self._consumed(part)

    def _consumed(self, part: _Part) -> None:
        part.consumed.set()
        self._fill()

    async def entry(
        self, si: ShareItem, size: int
    ) -> AsyncIterator[bytes | bytearray | memoryview | Moved]:
        """A big item's TAR entry (over ``SMALL_ENTRY``: ``small_entry`` takes the others):
        its header (whole, one piece), bytes, padding; raises if cut. The padding is
        ours, the target's is dropped with the next read, so an entry is complete in
        the answer once its last byte is."""
        part = si.part
        assert part is not None and part.body is not None
        pad = padding(size)
        try:
            yield await part.body.exactly(si.header_len)
            if self.splice:
                what = self._away_message(si, "broke off its share of the batch")
                async for moved in part.body.spliced(size, what):
                    yield moved
            else:
                async for piece in part.body.pieces(size):
                    yield piece
            part.body.skip(pad)
            if pad:
                yield bytes(pad)
        except OSError as e:
            raise self._broke(si, e) from None
        await self._entry_done(part)

    async def small_entry(self, si: ShareItem, size: int) -> bytes:
        """A small item's whole TAR entry, header to padding, in one piece (or an error):
        a coroutine, not an async generator (two of those per item, each registered with
        the loop, were 3% of the gateway's CPU on a batch of 10 KiB objects)."""
        part = si.part
        assert part is not None and part.body is not None
        try:
            piece = await part.body.exactly(si.header_len + size + padding(size))
        except OSError as e:
            raise self._broke(si, e) from None
        await self._entry_done(part)
        return piece

    def _broke(self, si: ShareItem, e: OSError) -> SluiceError:
        return self._away(si, f"broke off its share of the batch ({type(e).__name__}: {e})")

    async def _entry_done(self, part: _Part) -> None:
        assert part.body is not None
        part.entries_left -= 1
        if not part.entries_left:
            try:
                await part.body.end()
            except OSError:
                part.body.close()  # every entry of the part is in: just not reused
            self._consumed(part)


def read_router(gw: BatchHost, cmap: ClusterMap | None) -> Callable[[str, str], TargetInfo | None]:
    """``gw.read_owner(...)`` for many items: the map (``cmap``, the
    gateway's, looked up by the caller), liveness and addresses looked up once. None
    where ``route`` would raise (the item then takes the GET path, whose ``route``
    answers the error)."""
    if cmap is None:
        try:
            live = gw.live_targets()
        except SluiceError:
            return lambda bucket, name: None
        return lambda bucket, name: hrw_owner(live, object_key(bucket, name))
    alive, suspect = gw.alive_ids(), gw.suspect_ids()
    known = {t.id: t for t in gw.known_targets()}
    members = cmap.members
    infos: dict[str, TargetInfo | None] = {}

    def info_of(tid: str) -> TargetInfo | None:
        if tid not in infos:
            info = known.get(tid)
            if info is None and tid in cmap.urls:
                info = TargetInfo(id=tid, url=cmap.urls[tid])
            infos[tid] = info
        return infos[tid]

    def owner(bucket: str, name: str) -> TargetInfo | None:
        props = cmap.buckets.get(bucket)
        if props is None or not members:
            return None
        if props.copies == 1:  # cmap.owners' own shortcut, without its list
            tid = hrw_first(members, f"{bucket}/{name}".encode())
            return info_of(tid) if tid in alive else None
        reachable = [t for t in cmap.owners(bucket, name) if t in alive]
        if len(reachable) > 1:
            reachable.sort(key=lambda t: t in suspect)  # stable: owner order
        for tid in reachable:
            info = info_of(tid)
            if info is not None:
                return info
        return None

    return owner


def plan(gw: BatchHost, req: BatchRequest) -> tuple[list[ShareItem | None], list[TargetShare]]:
    """Per item, its ``ShareItem`` (None: read with a GET); the shares, not started."""
    shares: dict[tuple[str, EtlKey], TargetShare] = {}
    out: list[ShareItem | None] = []
    cmap = gw.cmap.get() if gw.cmap is not None else None
    owner = read_router(gw, cmap)
    version = cmap.version if cmap is not None else -1
    for item in req.items:
        target = owner(item.read_bucket, item.name) if shareable(item) else None
        if target is None:
            out.append(None)
            continue
        etl: EtlKey = (item.etl, item.etl_args)
        key = (target.id, etl)
        share = shares.get(key)
        if share is None:
            share = shares[key] = TargetShare(gw, target, etl, version)
        out.append(share.add(item, req.name_in_archive(item)))
    return out, list(shares.values())
