"""GetBatch items read in shares: one request to each target for all of its items.

Caller: ``assemble.Assembler``. Items a target can send straight from its
disk (whole objects or byte ranges of ``ais`` buckets, no ``archpath``, no
ETL: ``shareable``) are grouped by the target a GET would be sent to
(``placement.route``), in request order, and asked for in parts of ``PART``
items; the exchange (a manifest of every item's outcome, then the TAR entries
back to back) is drawn in ``wire/batchshare.py``. ``AHEAD`` parts per target
are in flight at once, so every target reads its disk and sends while the
gateway writes another target's items; what the gateway has not taken yet
waits in socket buffers (TCP pushes back), so memory stays bounded whatever
the batch's size.

A ``ShareItem``'s ``head`` resolves when its part's manifest arrives: the
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
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.errors import DuplexError, NoTargets, SluiceError
from etl_runtime.gateway.batch.items import ERROR_BODY_MAX, ITEM_TIMEOUT, Failed, relayed
from etl_runtime.gateway.batch.request import BatchRequest, Item
from etl_runtime.gateway.context import Gateway
from etl_runtime.gateway.placement import route
from etl_runtime.wire.batchshare import (
    ELSEWHERE,
    MANIFEST_LEN,
    MANIFEST_MAX,
    OK,
    SHARE_PATH,
    padding,
)
from etl_runtime.wire.duplex import DuplexClient, DuplexResponse

PART = 128  # items per share request
AHEAD = 2  # share requests in flight per target


class Elsewhere:
    """The target does not hold the item now: read it with a plain GET."""


READ_BY_GET: Final = Elsewhere()
Head = int | Failed | Elsewhere


def shareable(req: BatchRequest, item: Item) -> bool:
    return not req.etl_name and not item.archpath and not item.provider


class ShareItem:
    """One item of a target's share: ``head``, then its entry from ``TargetShare.entry``."""

    def __init__(self, share: TargetShare, item: Item, name: str) -> None:
        self.share, self.item = share, item
        self.name = name  # in the answer's archive
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.header_len = 0  # bytes of the TAR header the target wrote
        self.part: _Part | None = None


class _Body:
    """A share's answer body, taken in exact pieces (the pieces are not copied)."""

    def __init__(self, response: DuplexResponse) -> None:
        self._it = response.aiter_bytes()
        self._view = memoryview(b"")
        self._skip = 0  # the last entry's padding, dropped before the next read

    def skip(self, n: int) -> None:
        self._skip += n

    async def _drop(self) -> None:
        while self._skip:
            if not self._view:
                await self._more()
            take = min(self._skip, len(self._view))
            self._view = self._view[take:]
            self._skip -= take

    async def _more(self) -> None:
        try:
            self._view = memoryview(await anext(self._it))
        except StopAsyncIteration:
            raise DuplexError("the share ended before its last item") from None

    async def exactly(self, n: int) -> bytes:
        await self._drop()
        parts: list[memoryview] = []
        while n:
            if not self._view:
                await self._more()
            take = self._view[:n]
            self._view = self._view[len(take) :]
            parts.append(take)
            n -= len(take)
        return b"".join(parts)

    async def pieces(self, n: int) -> AsyncIterator[memoryview]:
        await self._drop()
        while n:
            if not self._view:
                await self._more()
            take = self._view[:n]
            self._view = self._view[len(take) :]
            n -= len(take)
            yield take

    async def end(self) -> None:
        """Read to the end (the connection goes back to the pool)."""
        await self._drop()
        if self._view:
            raise DuplexError("the share sent more than its manifest announced")
        async for extra in self._it:
            if extra:
                raise DuplexError("the share sent more than its manifest announced")


class _Part:
    def __init__(self, items: list[ShareItem]) -> None:
        self.items = items
        self.body: _Body | None = None
        self.entries_left = 0  # OK items whose entries are still in the body
        self.consumed = asyncio.Event()  # the body was read to its end (or given up)
        self.task: asyncio.Task[None] | None = None
        for si in items:
            si.part = self


class TargetShare:
    """Every shareable item of one batch that one target owns, asked for in parts."""

    def __init__(self, gw: Gateway, http: DuplexClient, target: TargetInfo) -> None:
        self._gw, self._http, self.target = gw, http, target
        self.items: list[ShareItem] = []
        self._parts: deque[_Part] = deque()
        self._started = 0

    def add(self, item: Item, name: str) -> ShareItem:
        si = ShareItem(self, item, name)
        self.items.append(si)
        return si

    def start(self) -> None:
        self._parts.extend(_Part(self.items[k : k + PART]) for k in range(0, len(self.items), PART))
        self._fill()

    def _fill(self) -> None:
        while self._started < len(self._parts) and self._started < AHEAD + self._done():
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

    def _away(self, si: ShareItem, why: str) -> NoTargets:
        item = si.item
        return NoTargets(
            f"in[{item.index}] {item.cname()}: target {self.target.id} {why}; retry",
            bucket=item.bucket,
            object=item.name,
            target=self.target.id,
        )

    async def _run(self, part: _Part) -> None:
        response: DuplexResponse | None = None
        try:
            response = await self._request(part)
            if response is not None:
                await self._manifest(part, response)
                await part.consumed.wait()
        except asyncio.CancelledError:
            raise
        except (DuplexError, OSError) as e:
            for si in part.items:
                if not si.head.done():
                    err = self._away(si, f"did not answer ({type(e).__name__}: {e})")
                    si.head.set_result(Failed(err, per_item=False))
        finally:
            part.consumed.set()
            self._fill()
            if response is not None:
                await response.aclose()

    async def _request(self, part: _Part) -> DuplexResponse | None:
        rows = [
            [si.item.bucket, si.item.name, si.item.start, si.item.length, si.name]
            for si in part.items
        ]
        body = json.dumps({"in": rows}, separators=(",", ":")).encode()
        headers = {**self._gw.target_headers(), "Content-Type": "application/json"}
        response = await self._http.request(
            "POST",
            f"{self.target.url.rstrip('/')}{SHARE_PATH}",
            headers=headers,
            body=body,
            timeout=ITEM_TIMEOUT,
        )
        if response.status_code == 200:
            return response
        raw = bytes(await response.read(ERROR_BODY_MAX))
        await response.aclose()
        if response.status_code in (404, 405):  # a target without shares: plain GETs
            for si in part.items:
                si.head.set_result(READ_BY_GET)
            return None
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {"error": f"answered {response.status_code}: {raw[:300]!r}"}
        payload.setdefault("target", self.target.id)
        for si in part.items:
            failed = relayed(response.status_code, payload, si.item, None)
            si.head.set_result(Failed(failed.error, per_item=False))
        return None

    async def _manifest(self, part: _Part, response: DuplexResponse) -> None:
        body = part.body = _Body(response)
        (n,) = MANIFEST_LEN.unpack(await body.exactly(MANIFEST_LEN.size))
        if n > MANIFEST_MAX:
            raise DuplexError(f"a share manifest of {n} bytes")
        entries: list[list[Any]] = json.loads(await body.exactly(n))
        if len(entries) != len(part.items):
            raise DuplexError(f"{len(entries)} manifest entries for {len(part.items)} items")
        for si, e in zip(part.items, entries, strict=True):
            status = e[0]
            if status == OK:
                si.header_len = e[2]
                part.entries_left += 1
                si.head.set_result(e[1])
            elif status == ELSEWHERE:
                si.head.set_result(READ_BY_GET)
            else:
                si.head.set_result(relayed(status, e[1], si.item, None))
        if not part.entries_left:
            await body.end()
            self._consumed(part)

    def _consumed(self, part: _Part) -> None:
        part.consumed.set()
        self._fill()

    async def entry(self, si: ShareItem, size: int) -> AsyncIterator[bytes | memoryview]:
        """The item's TAR header (whole, one piece), its bytes, its padding; raises if cut."""
        part = si.part
        assert part is not None and part.body is not None
        try:
            yield await part.body.exactly(si.header_len)
            async for piece in part.body.pieces(size):
                yield piece
        except (DuplexError, OSError) as e:
            raise self._away(
                si, f"broke off its share of the batch ({type(e).__name__}: {e})"
            ) from None
        pad = padding(size)
        part.body.skip(pad)  # the target's padding goes with the next read; ours is written now
        if pad:
            yield bytes(pad)
        part.entries_left -= 1
        if not part.entries_left:
            try:
                await part.body.end()
            except (DuplexError, OSError):
                pass  # every entry of the part is in: the connection is just not reused
            self._consumed(part)


def plan(
    gw: Gateway, http: DuplexClient, req: BatchRequest
) -> tuple[list[ShareItem | None], list[TargetShare]]:
    """Per item, its ``ShareItem`` (None: read with a GET); the shares, not started."""
    shares: dict[str, TargetShare] = {}
    out: list[ShareItem | None] = []
    for item in req.items:
        if not shareable(req, item):
            out.append(None)
            continue
        try:
            target = route(gw, "GET", item.bucket, item.name)
        except SluiceError:
            out.append(None)  # the GET path answers the same error for this item
            continue
        share = shares.get(target.id)
        if share is None:
            share = shares[target.id] = TargetShare(gw, http, target)
        out.append(share.add(item, req.name_in_archive(item)))
    return out, list(shares.values())
