"""Records of a tar shard: where each sample's bytes lie, and writing them out again.

A record is what ``webdataset`` calls a sample: the consecutive tar members
whose names share a key (``base_plus_ext``: the name up to the first dot of
its last path part). dSort never splits one. Because a record's members are
consecutive, a record is one byte range of the shard — its members' headers
(PAX/GNU long-name headers included), data and padding — and dSort moves that
range verbatim: names, modes and times survive, nothing is re-encoded, and an
output shard is the concatenation of its records' ranges plus the two zero
blocks that end a tar.

A member with no extension (``README``) is a record of its own, keyed by its
full name, so it is carried over rather than lost; directories are dropped
(a tar of samples needs none, and their headers carry no data). Since the
bytes go out as they are, a shard with a member name that is unsafe to
extract (absolute, ``..``, below a symlink member) or a pax/long-name header
over 1 MiB fails the job naming shard and member (``wire/formats/targuard.py``).
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from etl_runtime.core.errors import DsortFailed, UnsafeShard
from etl_runtime.wire.formats.targuard import BoundedTarInfo, normalized, unsafe_name

END_OF_ARCHIVE = tarfile.NUL * (2 * tarfile.BLOCKSIZE)

# webdataset.tariterators.base_plus_ext's rule, copied rather than imported:
# importing webdataset imports torch, which cost every target and gateway
# (they load the job kinds at start) about 500 MB of RSS and seconds of start-up.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def base_plus_ext(path: str) -> tuple[str | None, str | None]:
    """Split a tar member name into its sample key and its extensions."""
    match = _KEY_RE.match(path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


@dataclass(frozen=True)
class Record:
    key: str
    offset: int  # first byte of the first member's (extended) header in the shard
    size: int  # bytes up to the end of the last member's padding

    def to_wire(self) -> list[object]:
        return [self.key, self.offset, self.size]

    @classmethod
    def from_wire(cls, w: list[object]) -> Record:
        key, offset, size = w
        return cls(str(key), int(offset), int(size))  # type: ignore[call-overload]


def record_key(name: str) -> str:
    prefix, _suffix = base_plus_ext(name)
    return prefix if prefix is not None else name


def index_shard(path: Path, shard: str) -> list[Record]:
    """The records of one tar shard on disk, in order. ``DsortFailed`` names a bad shard."""
    total = path.stat().st_size
    records: list[Record] = []
    key: str | None = None
    start = end = 0
    try:
        links: set[str] = set()
        with tarfile.open(path, mode="r:", tarinfo=BoundedTarInfo) as tar:
            for ti in tar:
                if why := unsafe_name(ti.name, links):  # its bytes go out as they are
                    name = ti.name[:300]
                    raise DsortFailed(f"shard {shard!r}: member {name!r} is refused: {why}")
                if ti.issym() or ti.islnk():
                    links.add(normalized(ti.name))
                if ti.isdir():
                    if key is not None:
                        records.append(Record(key, start, end - start))
                    key = None
                    continue
                member_end = ti.offset_data + ti.size + (-ti.size % tarfile.BLOCKSIZE)
                if not ti.isreg():
                    member_end = ti.offset_data  # links and the like carry no data blocks
                if member_end > total:
                    raise DsortFailed(
                        f"shard {shard!r} is truncated: member {ti.name!r} "
                        "ends past the end of the file"
                    )
                k = record_key(ti.name)
                if k != key:
                    if key is not None:
                        records.append(Record(key, start, end - start))
                    key, start = k, ti.offset
                end = member_end
    except tarfile.TarError as e:
        raise DsortFailed(f"shard {shard!r} is not a valid tar file: {e}") from None
    except UnsafeShard as e:
        raise DsortFailed(f"shard {shard!r}: {e.message}") from None
    if key is not None:
        records.append(Record(key, start, end - start))
    return records


def copy_range(f: IO[bytes], offset: int, size: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Bytes ``[offset, offset + size)`` of an open file, in chunks."""
    f.seek(offset)
    left = size
    while left > 0:
        data = f.read(min(chunk, left))
        if not data:
            name = getattr(f, "name", "shard")
            raise DsortFailed(f"{name}: ended {left} bytes early (changed during the job?)")
        left -= len(data)
        yield data
