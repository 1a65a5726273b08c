"""Tar shards read without ``tarfile``: samples as webdataset groups them, with byte offsets.

``ShardReader`` spends most of its client CPU in ``tarfile``'s stream mode
(a ``TarInfo`` object, pax dict and checksum pass per member, reads through
``_Stream``'s small buffer). A WebDataset shard is a plain sequence of
ustar / pax / GNU headers and member data, so this module parses it straight
from the response's chunks: a header is sliced out of the chunk it lies in,
a member's bytes are one slice of it, nothing is copied twice.

``samples()`` yields what webdataset's ``tar_file_expander`` +
``group_by_keys`` yield for the same bytes (regular files only, ``__meta__``
names skipped, the key and lower-cased extension split as
``base_plus_ext`` splits them, a repeated field a ``ValueError``), plus the
byte offset where each sample's first header starts: a reader that knows it
can resume there with a ``Range`` GET instead of reading the shard again.

Where webdataset's ``tarfile`` would stop quietly (a header whose checksum
is wrong after the first), this raises ``TarFormatError``: a shard is never
taken for whole when it is not. Compressed shards (gzip, bzip2, xz) and GNU
sparse members are not parsed here: ``compressed()`` tells the caller to use
``tarfile`` instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

BLOCK = 512
ZERO = bytes(BLOCK)
REGULAR = frozenset(b"0\x007")  # REGTYPE, AREGTYPE, CONTTYPE
NO_DATA = frozenset(b"123456")  # links, devices, dirs, fifos: tarfile skips no data after them
COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


class TarFormatError(ValueError):
    """The bytes are not a tar archive this parser can read (names the offset)."""


def compressed(head: bytes) -> bool:
    """Whether a shard starting with ``head`` is compressed (parse it with ``tarfile``)."""
    return head.startswith(COMPRESSED)


class Chunks:
    """The bytes of an iterator of chunks, taken by exact sizes; ``offset`` counts them."""

    def __init__(self, chunks: Iterator[bytes], offset: int = 0) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0
        self.offset = offset

    def peek(self, n: int) -> bytes:
        """Up to ``n`` bytes ahead, not taken (fewer only at the end)."""
        while len(self._buf) - self._pos < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf = self._buf[self._pos :] + chunk
            self._pos = 0
        return self._buf[self._pos : self._pos + n]

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer only at the end)."""
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            self.offset += n
            return buf[pos:end]
        parts = [buf[pos:]]
        have = len(buf) - pos
        self._buf, self._pos = b"", 0
        while have < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            need = n - have
            if len(chunk) > need:
                parts.append(chunk[:need])
                self._buf, self._pos = chunk, need
                have = n
            else:
                parts.append(chunk)
                have += len(chunk)
        self.offset += have
        return b"".join(parts)


def _text(field: bytes) -> str:
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes, offset: int) -> int:
    if field[0] in (0o200, 0o377):  # GNU base-256
        n = int.from_bytes(field[1:], "big")
        return n - (256 ** (len(field) - 1)) if field[0] == 0o377 else n
    end = field.find(0)
    text = (field if end < 0 else field[:end]).strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise TarFormatError(f"invalid number {field!r} in the header at byte {offset}") from None


def _pax(data: bytes, offset: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    try:
        while pos < len(data) and data[pos] != 0:
            space = data.index(b" ", pos)
            length = int(data[pos:space])
            key, eq, value = data[space + 1 : pos + length - 1].partition(b"=")
            if not eq or length <= 0:
                raise ValueError
            records[key.decode("utf-8", "surrogateescape")] = value.decode(
                "utf-8", "surrogateescape"
            )
            pos += length
    except ValueError:
        raise TarFormatError(f"invalid pax header at byte {offset}") from None
    return records


def _padding(size: int) -> int:
    return -size % BLOCK


def members(src: Chunks) -> Iterator[tuple[str, bytes, int]]:
    """``(name, data, start)`` of every regular file, in order; ``start`` is the offset of
    the first header that describes it (its pax or GNU long-name header, if any)."""
    pax_global: dict[str, str] = {}
    pax: dict[str, str] | None = None
    long_name: str | None = None
    start = src.offset
    first = True
    while True:
        at = src.offset
        header = src.take(BLOCK)
        if len(header) < BLOCK:
            if header or first:
                what = "empty file" if first and not header else "truncated header"
                raise TarFormatError(f"{what} at byte {at}")
            return  # the end without end-of-archive blocks, as tarfile allows
        if header == ZERO:
            return
        first = False
        if _number(header[148:156], at) != 256 + sum(header) - sum(header[148:156]):
            signed = 256 + sum(b - 256 if b > 127 else b for b in header)
            signed -= sum(b - 256 if b > 127 else b for b in header[148:156])
            if _number(header[148:156], at) != signed:
                raise TarFormatError(f"bad checksum in the header at byte {at}")
        kind = header[156]
        size = _number(header[124:136], at)
        if kind in (0x78, 0x67):  # "x": pax for the next member; "g": for all that follow
            records = _pax(src.take(size), at)
            src.take(_padding(size))
            if kind == 0x78:
                pax = {**(pax or {}), **records}
            else:
                pax_global.update(records)
            continue
        if kind in (0x4C, 0x4B):  # GNU "L" long name, "K" long link name
            data = src.take(size)
            src.take(_padding(size))
            if kind == 0x4C:
                long_name = _text(data)
            continue
        if kind == 0x53 or any(k.startswith("GNU.sparse") for k in (pax or {})):
            raise TarFormatError(f"a GNU sparse member at byte {at} (not supported)")
        name = _text(header[0:100])
        if kind == 0 and name.endswith("/"):
            kind = 0x35  # old V7 tar: a directory as a regular file with a trailing slash
        prefix = _text(header[345:500])
        if prefix:
            name = f"{prefix}/{name}"
        if long_name is not None:
            name = long_name
        info = {**pax_global, **pax} if pax is not None else pax_global
        if info:
            name = info.get("path", name)
            if "size" in info:
                try:
                    size = int(info["size"])
                except ValueError:
                    raise TarFormatError(f"invalid pax size at byte {at}") from None
        pax, long_name = None, None
        if kind in REGULAR:
            data = src.take(size)
            if len(data) < size:
                raise TarFormatError(f"member {name!r} ends after {len(data)} of {size} bytes")
            src.take(_padding(size))
            yield name, data, start
        elif kind not in NO_DATA:
            src.take(size + _padding(size))
        start = src.offset


def samples(src: Chunks) -> Iterator[tuple[str, dict[str, bytes], int]]:
    """``(key, {ext: bytes}, start)`` of every sample, as webdataset's ``group_by_keys``
    groups the members; ``start``: the offset a reader resumes at to read it first."""
    fields: dict[str, bytes] | None = None
    key = ""
    begin = 0
    match = KEY.match
    for name, data, start in members(src):
        if name.startswith("__") and META.match(name):
            continue
        m = match(name)
        if m is None:
            continue
        prefix, ext = m.group(1), m.group(2).lower()
        if fields is None or prefix != key:
            if fields is not None:
                yield key, fields, begin
            fields, key, begin = {}, prefix, start
        if ext in fields:
            raise ValueError(f"{name}: duplicate file name in tar file {ext} {list(fields)}")
        fields[ext] = data
    if fields is not None:
        yield key, fields, begin
