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
  the first byte, then answered from memory;
* a bigger one is checked as it streams; the last block is held back until
  the hash matches, and a mismatch aborts the stream (the connection is
  dropped before the last byte: no HTTP client or tar reader takes it for
  complete).

A mismatch is logged, counted (``sluice_integrity_*``) and, where a good copy
exists, repaired from it (``Placement.repair``); else the read fails with
``ObjectCorrupted`` (503, naming bucket, object and target; ``Retry-After``
only while a copy that may be good could not be reached). An object written
before checksums were stored (no attribute) is served unchecked.
"""

from __future__ import annotations

import logging
import os
import threading
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


def file_matches(fd: int, cs: Checksum) -> bool:
    """Read the whole file (by ``pread``) and compare; blocking: call from a thread."""
    if os.fstat(fd).st_size != cs.size:
        return False
    h, offset = new_hash(), 0
    while block := os.pread(fd, BLOCK, offset):
        h.update(block)
        offset += len(block)
    return offset == cs.size and h.hexdigest() == cs.digest


def checked_blocks(blocks: Iterable[bytes], cs: Checksum, on_bad: BadRead) -> Iterator[bytes]:
    """``blocks`` (a whole object) passed on, the last one only once the hash matched;
    on a mismatch ``on_bad()`` is called and the stream raises (the connection drops)."""
    h, seen, held = new_hash(), 0, None
    for block in blocks:
        h.update(block)
        seen += len(block)
        if held is not None:
            yield held
        held = block
    if seen != cs.size or h.hexdigest() != cs.digest:
        raise on_bad()
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
