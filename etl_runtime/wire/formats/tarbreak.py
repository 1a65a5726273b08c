"""Marking a tar stream that breaks after its first byte, so no reader takes it as whole.

A wds answer is a sequence of whole tar members streamed as they are made. If
it breaks after the first byte, aborting the connection is not enough: a
stream cut on a member boundary is a valid, shorter archive to ``tarfile``
(``r|*``: a missing, truncated or invalid header after the first is read as
the end), and ``webdataset`` reads through a ``curl`` pipe that may end without
the reader ever seeing curl's exit status. So before aborting, the sender
writes an **error marker**: the header of one more member,
``__sluice_error__/<sample>.txt``, followed by the error message, declaring
``MISSING`` bytes more than it carries. Every tar reader then fails with
"unexpected end of data" (``tarfile``, webdataset) or "Unexpected EOF in
archive" (GNU tar) whether or not it sees the transport error, and ``tar x``
leaves the message on disk.

The transformer knows its own output is whole members (``error_marker``). A
target relaying a transformer's stream does not: ``TarCursor`` follows the
headers as the bytes go by and holds back a header block until it is whole,
so when the stream breaks it knows whether the client's copy stands on a
member boundary (add a marker) or inside a member's data (already short:
nothing to add, a marker the transformer sent included).
"""

from __future__ import annotations

import re
import struct
import tarfile
import time

BLOCK = tarfile.BLOCKSIZE
ERROR_DIR = "__sluice_error__"
MISSING = 1 << 20  # declared beyond what the marker carries: the rest never comes
MESSAGE_MAX = 4096
KIND_PREFIX = "kind: "
_MARKER_NAME = f"{ERROR_DIR}/".encode()
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Types whose size field is not followed by data (as ``tarfile`` reads them).
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


def error_marker(message: str, sample: str | None = None, kind: str | None = None) -> bytes:
    """A member header plus ``message``, declaring ``MISSING`` more bytes than follow.

    Sent at a member boundary (a multiple of 512 bytes into the stream), then
    the connection is aborted. The carried length is never a multiple of 512,
    so the stream does not end on a block boundary either. ``kind``: the error's
    class (``TransformError``, ``WorkerDied``, ...), on a last line ``kind: K``,
    so a target relaying the stream can tell the failure's status (``marked``).
    """
    tail = f"\n{KIND_PREFIX}{kind}" if kind else ""
    text = (message[:MESSAGE_MAX] + tail + "\n").encode("utf-8", "replace")
    if len(text) % BLOCK == 0:
        text += b"\n"
    name = _NAME_UNSAFE.sub("_", sample or "")[:80] or "stream"
    info = tarfile.TarInfo(f"{ERROR_DIR}/{name}.txt")
    info.size = len(text) + MISSING
    info.mtime = int(time.time())
    info.mode = 0o444
    info.uname = info.gname = "sluice"
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape") + text


class TarCursor:
    """Where a relayed tar stream stands, so that a break can be marked.

    ``feed(chunk)`` returns what to pass on now: the chunk, less the start of a
    header block whose rest has not come yet (held back, at most 511 bytes;
    ``flush()`` gives it up at a clean end).
    ``broken(message)`` returns what to send before aborting: an error marker
    when what was passed on ends on a member boundary, else ``b""``. A stream
    that stops looking like a tar (a bad header checksum) is passed on as it
    comes and never marked; after the end-of-archive block nothing is tracked.
    """

    def __init__(self) -> None:
        self._held = b""  # the start of an incomplete header block
        self._skip = 0  # member data and padding still to pass before the next header
        self._done = False  # the end-of-archive block went by, or the stream is not a tar
        self._marker: tuple[str, bytearray] | None = None  # the sender's error marker

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
        view = memoryview(chunk).cast("B")
        if self._done:
            return [view]
        out: list[bytes | memoryview] = []
        pos = 0
        if self._held:
            need = BLOCK - len(self._held)
            if len(view) < need:
                self._held += bytes(view)
                return out
            header, self._held = self._held + bytes(view[:need]), b""
            out.append(header)
            self._header(header)
            pos = need
        start = pos
        while pos < len(view) and not self._done:
            if self._skip:
                step = min(self._skip, len(view) - pos)
                if self._marker is not None and len(self._marker[1]) < MESSAGE_MAX:
                    self._marker[1].extend(view[pos : pos + step][: MESSAGE_MAX + 64])
                self._skip -= step
                pos += step
            elif len(view) - pos < BLOCK:
                self._held = bytes(view[pos:])
                if pos > start:
                    out.append(view[start:pos])
                return out
            else:
                self._header(view[pos : pos + BLOCK])
                pos += BLOCK
        if len(view) > start:
            out.append(view[start:])
        return out

    def _header(self, block: bytes | memoryview) -> None:
        block = bytes(block)
        if block == tarfile.NUL * BLOCK:
            self._done = True  # the end of the archive: the rest is padding
            return
        try:
            if not _checksum_ok(block):
                raise ValueError("bad checksum")
            size = _number(block[124:136])
        except ValueError:
            self._done = True  # not a tar header: stop following the stream
            return
        if block[156:157] not in _NO_DATA:
            self._skip = size + (-size % BLOCK)
        if block.startswith(_MARKER_NAME):  # the sender failed: what it said follows
            name = block[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            self._marker = (name[len(_MARKER_NAME) :].removesuffix(".txt"), bytearray())

    def flush(self) -> bytes:
        """At a clean end: what is still held back (nothing, for a whole tar)."""
        held, self._held = self._held, b""
        return held

    def marked(self) -> tuple[str, str, str | None] | None:
        """The sender's own error marker, if one went by: its sample, message, kind."""
        if self._marker is None:
            return None
        sample, data = self._marker
        lines = data[: MESSAGE_MAX + 64].decode("utf-8", "replace").split("\n")
        lines = [ln for ln in lines if ln.strip("\0")]
        kind = None
        if lines and lines[-1].startswith(KIND_PREFIX):
            kind = lines.pop()[len(KIND_PREFIX) :]
        return sample, "\n".join(lines), kind

    def broken(self, message: str, sample: str | None = None) -> bytes:
        """The error marker if the bytes passed on end on a member boundary, else ``b""``."""
        if self._done or self._skip:
            return b""
        return error_marker(message, sample)


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 (first byte 0x80 or 0xff)."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n if field[0] == 0x80 else n - (1 << (8 * (len(field) - 1)))
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _checksum_ok(block: bytes) -> bool:
    """The header's checksum matches, unsigned or signed (``tarfile`` accepts both)."""
    field = block[148:156]
    want = _number(field)
    if want == 256 + sum(block) - sum(field):
        return True
    return want == 256 + sum(struct.unpack_from("148b8x356b", block))
