"""Putting a GetBatch answer together: items from shares and single GETs, in request order.

``Assembler`` starts every target's share (``shares.py``: the target's plain
objects, parts of ``PART`` items, read only as they are written) and keeps
at most ``WINDOW`` other items in flight (``items.Slot``, one GET each); the
item at the head of the request is written out as soon as its size is known
and its bytes arrive, and each item written makes room for the next one. Bytes
are gathered into the archive writer's buffer and handed to the server
whenever the next step would wait, or past ``FLUSH_BYTES``: small items leave
in few large writes, and nothing sits in the buffer while a slow item is
awaited.

Errors, for a batch without ``coer`` (or one that ``coer`` does not cover):

* ``prime()`` waits for the first window's heads and every share's first
  manifest before the answer starts, so a missing item among them is a plain
  JSON error (the status and kind of what the target said, naming the item);
  an answer whose every item is then known goes with a Content-Length
  (``known_length``), and its big share entries socket to socket
  (``use_splice``);
* later, the stream is made unmistakably broken: a header for the failing
  item that declares bytes that never follow, then the connection is aborted
  (the generator raises, and the server drops it without the final chunk).

The multipart answer (``strm`` false, AIStore's buffered mode: a JSON part
with one ``MossOut`` per item, then the archive) needs every item's outcome
before its first byte; the archive goes into a ``Spool`` (1 MiB in memory,
the rest in a temporary file) and is sent once complete, so any error is
still a plain JSON error.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from etl_runtime.core.errors import SluiceError
from etl_runtime.getbatch.archive import BLOCK, ArchiveWriter, Chunk, Piece
from etl_runtime.getbatch.exchange import FileSlice, Spliced, padding, placeholder_header
from etl_runtime.getbatch.host import BatchHost
from etl_runtime.getbatch.items import Failed, Slot, Spool
from etl_runtime.getbatch.request import BatchRequest, Item
from etl_runtime.getbatch.shares import READ_BY_GET, SMALL_ENTRY, ShareItem, plan
from etl_runtime.wire.clients.duplex import DuplexClient

WINDOW = 16  # items in flight per batch
FLUSH_BYTES = 256 << 10


def moss_out(item: Item, size: int, err: str | None = None) -> dict[str, Any]:
    """AIStore's ``apc.MossOut`` for one item."""
    out: dict[str, Any] = {
        "objname": item.name,
        "bucket": item.bucket,
        "provider": item.provider or "ais",
        "size": size,
    }
    if item.archpath:
        out["archpath"] = item.archpath
    if item.opaque:
        out["opaque"] = item.opaque
    if err:
        out["err_msg"] = err
    return out


class Assembler:
    def __init__(
        self, gw: BatchHost, http: DuplexClient, req: BatchRequest, window: int = WINDOW
    ) -> None:
        self._gw, self._http, self._req, self._window = gw, http, req, max(1, window)
        self._shared, self._shares = plan(gw, req)  # per item: its ShareItem or None
        self._slots: dict[int, Slot] = {}  # items read with a GET, in flight, by index
        self._scanned = 0  # items looked at for a Slot so far
        self.out: list[dict[str, Any]] = []  # MossOut per item written (multipart)
        self.spool: Spool | None = None  # the multipart answer's archive
        for share in self._shares:
            share.start()

    def _fill(self) -> None:
        """Slots for the next items no share holds, at most ``window`` in flight."""
        items = self._req.items
        while len(self._slots) < self._window and self._scanned < len(items):
            if self._shared[self._scanned] is None:
                self._slots[self._scanned] = self._slot(items[self._scanned])
            self._scanned += 1

    def _slot(self, item: Item) -> Slot:
        return Slot(self._gw, self._http, self._req, item)

    def _stop(self) -> None:
        """Stop every item in flight (synchronous: safe while being cancelled)."""
        for share in self._shares:
            share.close()
        while self._slots:
            self._slots.popitem()[1].cancel()

    def close(self) -> None:
        """The answer is over, however it ended: nothing in flight, no spool left."""
        self._stop()
        if self.spool is not None:
            self.spool.close()

    def _ends_batch(self, head: object) -> bool:
        return isinstance(head, Failed) and not (head.per_item and self._req.cont_on_err)

    def use_splice(self) -> None:
        """Big entries of shares go from the target's socket to the client's, or from
        the file for the assembling target's own (the answer has a Content-Length and
        the server offers ``wire/http/splice.py``)."""
        for share in self._shares:
            share.splice = True

    def known_length(self) -> int | None:
        """The answer's exact length, when every item's outcome is already known (a plain
        TAR of items that all come in shares whose manifests are in): the answer then goes
        with a Content-Length instead of chunked (no copy of every piece to frame it)."""
        if self._req.fmt != ".tar":
            return None
        total = 2 * BLOCK
        for si in self._shared:
            if si is None or not si.head.done():
                return None
            head = si.head.result()
            if isinstance(head, Failed):
                name = self._req.missing_name(si.item, head.shard_missing)
                total += len(placeholder_header(name, head.error.message, 0))
            elif isinstance(head, int):
                total += si.header_len + head + padding(head)
            else:
                return None  # read with a GET: its size is not known yet
        return total

    async def prime(self) -> None:
        """Wait for the first window's heads and every share's first manifest; raise the
        first failure among them that would end the batch (a plain JSON error)."""
        self._fill()
        heads: list[asyncio.Future[Any]] = [s.head for s in self._slots.values()]
        heads += [share.items[0].head for share in self._shares if share.items]
        try:
            if heads:
                await asyncio.wait(heads)
            for i, si in enumerate(self._shared):
                slot = self._slots.get(i)
                future = si.head if si is not None else slot.head if slot is not None else None
                if future is not None and future.done():
                    head = future.result()
                    if isinstance(head, Failed) and self._ends_batch(head):
                        raise head.error
        except BaseException:
            self._stop()
            raise

    async def archive(self) -> AsyncIterator[Piece]:
        """The answer's archive, chunk by chunk; raises (after a broken entry) to abort."""
        req, w = self._req, ArchiveWriter(self._req.fmt)
        outs = not req.streaming  # the multipart answer's JSON part lists every item
        count = len(req.items)
        try:
            for i, item in enumerate(req.items):
                if self._scanned < count:
                    self._fill()
                si = self._shared[i]
                if si is not None and si.entry is None and not si.head.done():
                    if w.pending:
                        yield w.take()
                    await si.head
                if si is not None and si.entry is not None:  # its part came whole: a slice
                    w.data(si.entry)
                    if outs:
                        self.out.append(moss_out(item, cast(int, si.head.result())))
                    si.share.took(si)
                    if w.pending >= FLUSH_BYTES:
                        yield w.take()
                    continue
                slot = self._slots.pop(i, None)
                name = si.name if si is not None else req.name_in_archive(item)
                head: object
                if si is not None:
                    head = si.head.result()
                    if head is READ_BY_GET:  # not on its target's disk now: a plain GET
                        slot, si = self._slot(item), None
                if slot is not None:
                    if not slot.head.done() and w.pending:
                        yield w.take()
                    head = await slot.head
                if isinstance(head, Failed):
                    if self._ends_batch(head):
                        w.broken_entry(name, 1)
                        yield w.take()
                        raise head.error
                    w.placeholder(req.missing_name(item, head.shard_missing), head.error.message)
                    if outs:
                        self.out.append(moss_out(item, 0, head.error.message))
                    continue
                assert isinstance(head, int)
                if si is not None and head <= SMALL_ENTRY:
                    try:
                        piece = await si.share.small_entry(si, head)
                    except SluiceError:  # nothing of it written: an entry that never ends
                        w.broken_entry(name, 1)
                        yield w.take()
                        raise
                    w.data(piece)
                    if w.pending >= FLUSH_BYTES:
                        yield w.take()
                elif si is not None:
                    async for chunk in self._shared_entry(w, si, name, head):
                        yield chunk
                else:
                    assert slot is not None
                    async for chunk in self._slot_entry(w, slot, head):
                        yield chunk
                if outs:
                    self.out.append(moss_out(item, head))
            w.end()
            yield w.take()
        finally:
            self._stop()

    async def _shared_entry(
        self, w: ArchiveWriter, si: ShareItem, name: str, size: int
    ) -> AsyncIterator[Piece]:
        """The entry the target wrote (header, bytes), relayed; our own padding."""
        started = False
        try:
            async for piece in si.share.entry(si, size):
                if isinstance(piece, Spliced | FileSlice):
                    # the server moves it (socket or file): what comes before goes first
                    if w.pending:
                        yield w.take()
                    yield piece
                    continue
                if len(piece) >= FLUSH_BYTES and w.pending:
                    yield w.take()  # then the big piece goes on uncopied
                w.data(piece)
                started = True
                if w.pending >= FLUSH_BYTES:
                    yield w.take()
        except SluiceError:
            if not started:  # nothing of it written: an entry that can never end
                w.broken_entry(name, 1)
            yield w.take()
            raise

    async def _slot_entry(self, w: ArchiveWriter, slot: Slot, size: int) -> AsyncIterator[Chunk]:
        item = slot.item
        w.header(self._req.name_in_archive(item), size)
        sent = 0
        while True:
            if w.pending and not slot.ready():
                yield w.take()
            chunk = await slot.next()
            if chunk is None:
                break
            if len(chunk) >= FLUSH_BYTES and w.pending:
                yield w.take()  # then the big chunk goes on uncopied
            w.data(chunk)
            sent += len(chunk)
            if w.pending >= FLUSH_BYTES:
                yield w.take()
        if slot.broken is not None or sent != size:
            # the header declared ``size`` bytes: fewer follow, then the abort
            yield w.take()
            raise slot.broken or SluiceError(
                f"in[{item.index}] {item.cname()}: {sent} of the {size} bytes announced came"
            )
        w.pad(size)


async def multipart(asm: Assembler, fmt: str) -> tuple[str, AsyncIterator[Chunk]]:
    """(boundary, body) of the buffered answer; every error is raised before it starts."""
    spool = asm.spool = Spool()
    try:
        async for chunk in asm.archive():
            assert not isinstance(chunk, Spliced | FileSlice)  # never asked for (``use_splice``)
            await spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    boundary = uuid.uuid4().hex
    meta = json.dumps({"uuid": uuid.uuid4().hex, "out": asm.out}).encode() + b"\n"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n'.encode()
        + meta
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="archive"; '
        f'filename="batch{fmt}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
    )

    async def body() -> AsyncIterator[Chunk]:
        yield head
        async for chunk in spool.chunks():
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    return boundary, body()
