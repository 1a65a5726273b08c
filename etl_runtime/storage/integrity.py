"""Bytes you can trust: every object's checksum, checked on every read.

Every write (a PUT, a copy or rebalance move on ``/v1/_replica``, an S3
multipart completion, a remote bucket's cache fill, a job's ``put_object``)
hashes the bytes as they arrive with xxHash's XXH3-64 (beside the MD5 that is
the ETag) and stores ``xxh3:<hex>:<size>`` in the ``user.sluice.xxh``
extended attribute of the temp file before it is published, so the checksum
and the bytes are one version. A copy is checked against the sender's
checksum before it is published (``X-Sluice-Xxh``).

A read checks the bytes against it (``SLUICE_VERIFY_READS=0`` turns that off,
for measurement; the default is on):

* a size that differs from the stored one (a truncated file) is found before
  the first byte, whatever the object's size;
* an object of at most ``WHOLE_MAX`` (1 MiB) is read whole and checked before
  the first byte, then answered from memory or by ``sendfile``;
* a bigger one is checked as it streams; the last block is held back until
  the hash matches, and a mismatch aborts the stream (the connection is
  dropped before the last byte: no HTTP client or tar reader takes it for
  complete);
* a match is remembered (``Verified``) for ``SLUICE_VERIFY_READS_TTL``
  seconds while the file is unchanged (same inode, size, mtime, ctime): a
  read of it then needs no hash (docs/integrity.md says what that leaves).

An object written before checksums were stored (no attribute) gets one on its
first read or scrub (``adopt``: its MD5 checked against the stored ETag).

A mismatch is logged, counted (``sluice_integrity_*``) and, where a good copy
exists, repaired from it (``Placement.repair``); else the read fails with
``ObjectCorrupted`` (503, naming bucket, object and target; ``Retry-After``
only while a copy that may be good could not be reached).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import xxhash
from prometheus_client.core import CounterMetricFamily, Metric

from etl_runtime.core.errors import ObjectCorrupted

log = logging.getLogger(__name__)

XXH_XATTR = "user.sluice.xxh"
XXH_HEADER = "X-Sluice-Xxh"  # a copy's checksum travels with it
WHOLE_MAX = 1 << 20  # read and checked before the first byte; bigger: checked as streamed
BLOCK = 1 << 20


def verify_reads() -> bool:
    """Reads are checked unless ``SLUICE_VERIFY_READS`` is 0/false/off."""
    return os.environ.get("SLUICE_VERIFY_READS", "1").strip().lower() not in ("0", "false", "off")


def new_hash() -> xxhash.xxh3_64:
    return xxhash.xxh3_64()


def encode(digest: str, size: int) -> str:
    return f"xxh3:{digest}:{size}"


@dataclass(frozen=True, slots=True)
class Checksum:
    digest: str
    size: int

    @property
    def value(self) -> str:
        return encode(self.digest, self.size)

    def matches(self, data: bytes | memoryview) -> bool:
        return len(data) == self.size and xxhash.xxh3_64_hexdigest(data) == self.digest


def parse(raw: str | bytes | None) -> Checksum | None:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    algo, _, rest = raw.partition(":")
    digest, _, size = rest.partition(":")
    if algo != "xxh3" or not digest or not size.isdigit():
        return None
    return Checksum(digest, int(size))


def stored(fd: int | str | os.PathLike[str]) -> Checksum | None:
    """The checksum stored beside an object's bytes, or None (written before checksums)."""
    try:
        return parse(os.getxattr(fd, XXH_XATTR))
    except OSError:
        return None


def store(fd: int | str | os.PathLike[str], digest: str, size: int) -> None:
    try:
        os.setxattr(fd, XXH_XATTR, encode(digest, size).encode())
    except OSError:
        pass  # no xattrs here: the object is served unchecked, as before checksums


_BUFFERS = threading.local()  # one read buffer per thread: no allocation per read
_BUFFER = 256 << 10
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def _buffer() -> memoryview:
    view: memoryview | None = getattr(_BUFFERS, "view", None)
    if view is None:
        view = _BUFFERS.view = memoryview(bytearray(_BUFFER))
    return view


def file_matches(fd: int, cs: Checksum, flags: int = 0) -> bool:
    """Read the whole file (``preadv`` into this thread's buffer) and compare; blocking:
    call from a thread (``matches_cached`` is the loop's). ``flags``: ``preadv``'s."""
    if os.fstat(fd).st_size != cs.size:
        return False
    h, offset, buf = new_hash(), 0, _buffer()
    while n := os.preadv(fd, [buf], offset, flags):
        h.update(buf[:n])
        offset += n
    return offset == cs.size and h.hexdigest() == cs.digest


def adopt(fd: int, etag: str) -> Checksum | None:
    """An object written before checksums were stored: hash it whole (MD5 and XXH3);
    if its MD5 is the stored ETag (or the ETag is no plain MD5, as a multipart one's),
    store the XXH3 beside it (from then on it is checked as any object) and return it;
    None if the MD5 differs (the bytes changed since they were written). Blocking."""
    md5, h, offset, buf = hashlib.md5(), new_hash(), 0, _buffer()
    while n := os.preadv(fd, [buf], offset):
        view = buf[:n]
        md5.update(view)
        h.update(view)
        offset += n
    if _PLAIN_MD5.fullmatch(etag) and md5.hexdigest() != etag:
        return None
    cs = Checksum(h.hexdigest(), offset)
    store(fd, cs.digest, cs.size)
    return cs


_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")


def matches_cached(fd: int, cs: Checksum) -> bool | None:
    """``file_matches`` for the event loop: only while every byte is in the page cache
    (``RWF_NOWAIT``: a read that would wait for the disk fails at once); None if one
    would wait (check it in a thread). A read from memory of 1 MiB costs ~0.08 ms."""
    if not _NOWAIT:
        return None
    try:
        return file_matches(fd, cs, _NOWAIT)
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no RWF_NOWAIT on this filesystem
            return None
        raise


VERIFIED_ENV = "SLUICE_VERIFY_READS_TTL"  # sluice up passes SLUICE_VERIFY_READS*
VERIFIED_SECONDS = 10.0  # how long a match stands for an unchanged file
VERIFIED_MAX = 65536  # files remembered per process (about 200 bytes each)
SETTLED_NS = 1_000_000_000  # a file changed less than this ago is never remembered

# What identifies one version of one file: any change made through the filesystem (a
# write, a truncate, a rename over it, a utime, a setxattr) changes (inode, size,
# mtime, ctime); ctime cannot be set back by a user.
Stamp = tuple[int, int, int, int, int]


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def verified_seconds() -> float:
    """``$SLUICE_VERIFY_READS_TTL`` (default 10; 0: every read hashes the bytes)."""
    raw = os.environ.get(VERIFIED_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else VERIFIED_SECONDS
    except ValueError:
        raise ValueError(f"{VERIFIED_ENV}={raw!r}: give a number of seconds") from None


class Verified:
    """The files whose bytes matched their checksum in the last ``seconds``: a read of
    one of them, unchanged since (same ``Stamp`` and checksum), needs no second hash and
    may go by ``sendfile``. A file that changed within ``SETTLED_NS`` of the check is
    not remembered (a file system's clock is coarse: a change in the same tick could
    keep the stamp). Bounded: the oldest entries go first."""

    def __init__(self, seconds: float | None = None, limit: int = VERIFIED_MAX) -> None:
        self.seconds = verified_seconds() if seconds is None else seconds
        self.limit = limit
        self._lock = threading.Lock()
        self._at: dict[tuple[int, int], tuple[Stamp, str, float]] = {}

    def fresh(self, stamp: Stamp | None, cs: Checksum | None = None) -> bool:
        """``stamp``'s file matched within ``seconds`` and is unchanged since. ``cs``
        None: a ``stat`` alone asks (an ETL GET, whose transformer reads the file): the
        stored checksum cannot have changed under an unchanged ctime (an xattr set
        moves it), and ``note`` never remembers a file changed within a tick."""
        if stamp is None or self.seconds <= 0:
            return False
        entry = self._at.get((stamp[0], stamp[1]))
        return (
            entry is not None
            and entry[0] == stamp
            and (cs is None or entry[1] == cs.value)
            and time.monotonic() - entry[2] < self.seconds
        )

    def left(self, stamp: Stamp | None, cs: Checksum | None = None) -> float:
        """Seconds ``stamp``'s match still stands (``fresh`` until then), 0 if not fresh."""
        if not self.fresh(stamp, cs):
            return 0.0
        assert stamp is not None
        entry = self._at.get((stamp[0], stamp[1]))
        return 0.0 if entry is None else max(0.0, self.seconds - (time.monotonic() - entry[2]))

    def note(self, stamp: Stamp | None, cs: Checksum, started_ns: int) -> None:
        """``stamp``'s bytes matched ``cs`` in a check begun at ``started_ns``
        (``time.time_ns()``)."""
        if stamp is None or self.seconds <= 0 or started_ns - stamp[4] < SETTLED_NS:
            return
        key = (stamp[0], stamp[1])
        with self._lock:
            self._at.pop(key, None)
            while len(self._at) >= self.limit:
                del self._at[next(iter(self._at))]
            self._at[key] = (stamp, cs.value, time.monotonic())

    def forget(self, stamp: Stamp | None) -> None:
        if stamp is not None:
            with self._lock:
                self._at.pop((stamp[0], stamp[1]), None)

    def clear(self) -> None:
        with self._lock:
            self._at.clear()


VERIFIED = Verified()


def checked_blocks(
    blocks: Iterable[bytes], cs: Checksum, on_bad: BadRead, stamp: Stamp | None = None
) -> Iterator[bytes]:
    """``blocks`` (a whole object) passed on, the last one only once the hash matched;
    on a mismatch ``on_bad()`` is called and the stream raises (the connection drops).
    ``stamp``: the file's, whose match is noted in ``VERIFIED`` (forgotten on a mismatch)."""
    started = time.time_ns()
    h, seen, held = new_hash(), 0, None
    for block in blocks:
        h.update(block)
        seen += len(block)
        if held is not None:
            yield held
        held = block
    if seen != cs.size or h.hexdigest() != cs.digest:
        VERIFIED.forget(stamp)
        raise on_bad()
    VERIFIED.note(stamp, cs, started)
    if held is not None:
        yield held


class BadRead:
    """What a streamed read that found a mismatch does: log, count, tell ``then`` (a
    repair), and give the error that cuts the stream."""

    def __init__(
        self,
        bucket: str,
        name: str,
        target: str | None,
        then: Callable[[], None] | None = None,
    ) -> None:
        self.bucket, self.name, self.target, self.then = bucket, name, target, then

    def __call__(self) -> ObjectCorrupted:
        found_bad(self.bucket, self.name, self.target)
        if self.then is not None:
            try:
                self.then()
            except Exception:
                log.exception("after a bad read of %s/%s", self.bucket, self.name)
        return corrupted(self.bucket, self.name, self.target, streamed=True)


def found_bad(bucket: str, name: str, target: str | None) -> None:
    """Log and count a mismatch found on a read."""
    COUNTS.add("corrupted_reads", target)
    where = f"target {target!r}" if target else "this target"
    log.error("ais://%s/%s on %s does not match its stored checksum", bucket, name, where)


def corrupted(
    bucket: str,
    name: str,
    target: str | None,
    *,
    streamed: bool = False,
    retry_after: int | None = None,
) -> ObjectCorrupted:
    """The error a read that found a mismatch fails with (``found_bad`` counted it)."""
    where = f"target {target!r}" if target else "this target"
    how = "the stream was cut short" if streamed else "nothing was served"
    message = (
        f"object ais://{bucket}/{name} on {where} does not match its checksum (bit rot or "
        f"a damaged disk); {how}"
    )
    if retry_after is not None:
        message += f"; a copy that may be good is not reachable now: retry in {retry_after}s"
    else:
        message += "; no good copy to repair it from: rewrite the object"
    return ObjectCorrupted(
        message, retry_after=retry_after, bucket=bucket, object=name, target=target
    )


class Counts:
    """The integrity counters of this process, per target (a test cluster runs several)."""

    FIELDS = (
        "corrupted_reads",
        "read_repairs",
        "scrub_objects",
        "scrub_bytes",
        "scrub_corrupted",
        "scrub_repaired",
        "scrub_missing_copies",
        "scrub_orphaned_copies",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_target: dict[str | None, dict[str, int]] = {}

    def add(self, field: str, target: str | None, n: int = 1) -> None:
        with self._lock:
            counts = self.by_target.setdefault(target, dict.fromkeys(self.FIELDS, 0))
            counts[field] += n

    def of(self, target: str | None) -> dict[str, int]:
        with self._lock:
            return dict(self.by_target.get(target) or dict.fromkeys(self.FIELDS, 0))


COUNTS = Counts()


class IntegrityCollector:
    """``sluice_integrity_<field>_total{target}`` for a target's ``/metrics``."""

    def __init__(self, target_id: str, counts: Counts = COUNTS) -> None:
        self.target_id, self.counts = target_id, counts

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for field, value in self.counts.of(self.target_id).items():
            c = CounterMetricFamily(
                f"sluice_integrity_{field}",
                f"Object integrity: {field.replace('_', ' ')}.",
                labels=["target"],
            )
            c.add_metric([self.target_id], value)
            yield c
