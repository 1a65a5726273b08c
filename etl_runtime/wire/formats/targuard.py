"""Checking a tar stream's headers as they pass, before a tar reader acts on them.

Two readers of shards follow a stream header by header: Sluice's own
(``shardread.ShardReader``) and ``tarfile`` under ``webdataset`` (the
transformer's wds mode). Both would hold a pax or GNU long-name header's whole
data in memory, and ``tarfile`` passes any member name on as it is. So:

* ``HEADER_MAX`` (1 MiB) bounds the data of a pax (``x``, ``g``) or GNU
  long-name/long-link (``L``, ``K``) header; a bigger one is refused
  (``UnsafeShard``) as its header block goes by, before its data is read.
* ``unsafe_name`` is the rule for member names: an absolute name, a name with
  a ``..`` segment, or a name below an earlier symlink member of the same
  shard is refused, never rewritten: a rewritten name would silently be
  another sample than the one the shard's writer meant, and a shard with such
  names was not written by a WebDataset writer.
* ``Decompressor`` inflates gzip, bzip2 or xz in bounded steps (at most
  ``STEP`` bytes out per call), so a small compressed chunk never becomes a
  huge buffer.

``GuardedTar`` is a file object for ``tarfile``: it decompresses the shard
itself (so the headers can be seen) and hands on plain tar bytes only after
the headers among them passed the checks. ``BoundedTarInfo`` is the bound for
a ``tarfile`` that reads a seekable file itself (``tarfile.open(...,
tarinfo=BoundedTarInfo)``, dSort's indexing).
"""

from __future__ import annotations

import bz2
import lzma
import re
import tarfile
import zlib
from typing import IO

from etl_runtime.core.errors import UnsafeShard

BLOCK = tarfile.BLOCKSIZE
HEADER_MAX = 1 << 20  # bytes of a pax or GNU long-name header's data
STEP = 1 << 20  # most bytes one decompression step hands out
RAW_CHUNK = 1 << 16
_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.XGLTYPE)
_EXTENDED = (*_LONG, *_PAX)
_LINKS = (tarfile.SYMTYPE, tarfile.LNKTYPE)
_NO_DATA = frozenset(
    {
        tarfile.LNKTYPE,
        tarfile.SYMTYPE,
        tarfile.DIRTYPE,
        tarfile.CHRTYPE,
        tarfile.BLKTYPE,
        tarfile.FIFOTYPE,
    }
)
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext


def padding(size: int) -> int:
    return -size % BLOCK


def sample_of(name: str) -> str:
    """The sample key ``webdataset`` groups member ``name`` under (the name if none)."""
    m = _KEY.match(name)
    return m.group(1) if m else name


def normalized(name: str) -> str:
    """``name`` without ``./``, empty or ``.`` segments and trailing ``/``."""
    lead = "/" if name.startswith("/") else ""
    return lead + "/".join(p for p in name.split("/") if p not in ("", "."))


def unsafe_name(name: str, links: set[str] | frozenset[str] = frozenset()) -> str | None:
    """Why member ``name`` must not pass (None when it may); ``links``: the shard's
    symlink members so far, ``normalized``."""
    if name.startswith("/"):
        return "an absolute name"
    parts = normalized(name).split("/")
    if ".." in parts:
        return "a '..' segment"
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in links:
            return f"a path through the symlink member {'/'.join(parts[:i])!r}"
    return None


class Decompressor:
    """gzip, bzip2, xz or nothing, chosen by the stream's first bytes; bounded steps."""

    def __init__(self, head: bytes) -> None:
        self.kind = "tar"
        self._z: zlib._Decompress | None = None
        self._other: bz2.BZ2Decompressor | lzma.LZMADecompressor | None = None
        if head[:2] == b"\x1f\x8b":
            self.kind, self._z = "gzip", zlib.decompressobj(31)
        elif head[:3] == b"BZh":
            self.kind, self._other = "bzip2", bz2.BZ2Decompressor()
        elif head[:6] == b"\xfd7zXZ\x00":
            self.kind, self._other = "xz", lzma.LZMADecompressor()
        self._pending = b""

    @property
    def plain(self) -> bool:
        return self.kind == "tar"

    def feed(self, data: bytes) -> None:
        self._pending += data

    def step(self) -> bytes:
        """Up to ``STEP`` bytes out of what was fed (``b""``: feed more). Raises
        ``ValueError`` for a stream that does not decompress."""
        if self.plain:
            out, self._pending = self._pending, b""
            return out
        try:
            if self._z is not None:
                if self._z.eof:
                    self._pending = b""
                    return b""
                out = self._z.decompress(self._pending, STEP)
                self._pending = self._z.unconsumed_tail
                return out
            assert self._other is not None
            if self._other.eof:
                self._pending = b""
                return b""
            if not self._pending and self._other.needs_input:
                return b""
            data, self._pending = self._pending, b""
            return self._other.decompress(data, STEP)
        except (zlib.error, OSError, EOFError, lzma.LZMAError) as e:
            raise ValueError(f"its {self.kind} data is corrupt ({e})") from None

    def has_more(self) -> bool:
        """Output may still come without more input."""
        if self.plain:
            return bool(self._pending)
        if self._z is not None:
            return bool(self._pending) and not self._z.eof
        assert self._other is not None
        return not self._other.eof and (bool(self._pending) or not self._other.needs_input)

    def complete(self) -> bool:
        """At the end of the input: the compressed stream ended where it should."""
        if self.plain:
            return True
        if self._z is not None:
            return self._z.eof
        assert self._other is not None
        return self._other.eof


class HeaderWatch:
    """Follows a plain tar stream's headers: ``feed`` bytes in order; raises
    ``UnsafeShard`` (naming ``what`` and the sample) at the first header that
    must not pass. A stream that stops looking like a tar is left to its reader."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._held = bytearray()  # an incomplete header block, or extended header data
        self._skip = 0  # member data and padding to pass
        self._collect = 0  # extended header data (+ padding) still to gather
        self._ext_type = b""
        self._ext_size = 0
        self._name: str | None = None  # from a long-name or pax header, for the next member
        self._pax_size: int | None = None  # from a pax header, for the next member
        self._done = False
        self.links: set[str] = set()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view) and not self._done:
            if self._skip:
                step = min(self._skip, len(view) - pos)
                self._skip -= step
                pos += step
            elif self._collect:
                step = min(self._collect, len(view) - pos)
                self._held += view[pos : pos + step]
                self._collect -= step
                pos += step
                if not self._collect:
                    self._extended(bytes(self._held[: self._ext_size]))
                    self._held.clear()
            else:
                step = min(BLOCK - len(self._held), len(view) - pos)
                self._held += view[pos : pos + step]
                pos += step
                if len(self._held) == BLOCK:
                    block = bytes(self._held)
                    self._held.clear()
                    self._header(block)

    def _refuse(self, name: str, why: str) -> UnsafeShard:
        sample = sample_of(name)
        return UnsafeShard(
            f"{self.what}: member {name[:300]!r} (sample {sample[:300]!r}) is refused: {why}",
            sample=sample[:300],
        )

    def _header(self, block: bytes) -> None:
        if block == bytes(BLOCK):
            self._done = True  # the end of the archive
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            self._done = True  # not a tar header: its reader says so
            return
        if info.type in _EXTENDED:
            if info.size > HEADER_MAX:
                kind = "pax" if info.type in _PAX else "GNU long-name"
                raise UnsafeShard(
                    f"{self.what}: a {kind} header of {info.size} bytes is over the "
                    f"{HEADER_MAX >> 20} MiB limit on tar extended headers",
                )
            self._ext_type, self._ext_size = info.type, info.size
            self._collect = info.size + padding(info.size)
            if not self._collect:
                self._extended(b"")
            return
        name = self._name if self._name is not None else info.name
        self._name = None
        why = unsafe_name(name, self.links)
        if why is not None:
            raise self._refuse(name, why)
        if info.type in _LINKS:
            self.links.add(normalized(name))
        if info.type not in _NO_DATA:
            size = self._pax_size if self._pax_size is not None else info.size
            self._skip = size + padding(size)
        self._pax_size = None

    def _extended(self, data: bytes) -> None:
        if self._ext_type == tarfile.GNUTYPE_LONGNAME:
            self._name = data.rstrip(b"\x00").decode("utf-8", "surrogateescape")
        elif self._ext_type in _PAX:  # a global one applies to the next member too
            records = pax_records(data)
            if "path" in records:
                self._name = records["path"]
            if "size" in records:
                try:
                    self._pax_size = int(records["size"])
                except ValueError:
                    self._done = True  # tarfile refuses it itself


def pax_records(data: bytes) -> dict[str, str]:
    """``"%d key=value\\n"`` records of a pax header."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos : pos + 1] not in (b"\x00", b""):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        found[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return found


class BoundedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` that refuses an extended header over ``HEADER_MAX`` before
    ``tarfile`` reads its data (``UnsafeShard``; the caller names the shard)."""

    def _proc_member(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type in _EXTENDED and self.size > HEADER_MAX:
            raise UnsafeShard(
                f"a {'pax' if self.type in _PAX else 'GNU long-name'} header of {self.size} "
                f"bytes is over the {HEADER_MAX >> 20} MiB limit on tar extended headers"
            )
        return super()._proc_member(tarfile)  # type: ignore[misc]


class GuardedTar:
    """A file object of plain tar bytes for ``tarfile``: ``raw`` decompressed here,
    every header checked by a ``HeaderWatch`` before the bytes after it are handed
    out. ``what`` names the shard in errors (and in ``repr``: never a path)."""

    def __init__(self, raw: IO[bytes], what: str) -> None:
        self._raw = raw
        self.what = what
        self._watch = HeaderWatch(what)
        self._dec: Decompressor | None = None
        self._out = bytearray()
        self._eof = False

    def __repr__(self) -> str:
        return f"<shard of {self.what}>"

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """More checked bytes in ``_out``; False at the end."""
        while True:
            if self._dec is not None and self._dec.has_more():
                out = self._step()
                if out:
                    return True
                continue
            if self._eof:
                return False
            raw = self._raw.read(RAW_CHUNK)
            if not raw:
                self._eof = True
                if self._dec is not None and not self._dec.complete():
                    raise tarfile.ReadError(f"{self.what}: its {self._dec.kind} data ends early")
                return False
            if self._dec is None:
                self._dec = Decompressor(raw)
            self._dec.feed(raw)
            if self._step():
                return True

    def _step(self) -> bool:
        assert self._dec is not None
        try:
            out = self._dec.step()
        except ValueError as e:
            raise tarfile.ReadError(f"{self.what}: {e}") from None
        if out:
            self._watch.feed(out)
            self._out += out
        return bool(out)

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._out) < n) and self._fill():
            pass
        take = len(self._out) if n < 0 else min(n, len(self._out))
        out = bytes(self._out[:take])
        del self._out[:take]
        return out

    def close(self) -> None:
        self._raw.close()
