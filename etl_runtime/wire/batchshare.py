"""The gateway ⇄ target exchange of GetBatch: one target's share of a batch in one answer.

The gateway sends each target ``POST /v1/_moss`` with the items of a batch
that target owns, in request order (``{"coer": bool, "in": [[bucket, object,
start, length, name_in_archive], ...]}``). The target answers one body with a
``Content-Length``:

* an 8-byte big-endian length, then a JSON *manifest*: one entry per item,
  ``[200, size, header_bytes]`` for an item that follows, ``[0]`` for one the
  target cannot serve from its own disk (not its owner, a copy still to be
  pulled: the gateway reads it with a plain GET instead), ``[status, error
  body]`` for one that failed (the target's JSON error, as a GET would answer);
* then, back to back and in order, the TAR entry (header, bytes, padding) of
  every ``200`` item, exactly as it goes into the answer's archive.

So the gateway knows every item's outcome before it relays a byte of the
share, and relays each entry verbatim; the target sends file bytes with
``os.sendfile`` (``wire.zerocopy``). ``tar_header`` is the one TAR header
writer both sides use.
"""

from __future__ import annotations

import json
import struct
import tarfile
from typing import Any

SHARE_PATH = "/v1/_moss"
MANIFEST_LEN = struct.Struct("!Q")
MANIFEST_MAX = 64 << 20  # a sanity bound on the manifest a gateway accepts
BLOCK = tarfile.BLOCKSIZE
OK = 200
ELSEWHERE = 0  # "not here": the gateway falls back to a plain GET of the item


def padding(size: int) -> int:
    return -size % BLOCK


def tar_header(name: str, size: int, mtime: int) -> bytes:
    """A PAX TAR header for a regular file (a long or non-ASCII name gets a pax record)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def encode_manifest(entries: list[list[Any]]) -> bytes:
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return MANIFEST_LEN.pack(len(raw)) + raw
