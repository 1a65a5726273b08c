"""What a remembered match (``integrity.Verified``) may skip, on real files.

A read that matched lets the next reads of the same, unchanged file skip the
hash for a bounded time; every change made through the file system (a write
in place with its mtime set back, a truncate, a rename over it, an xattr
set) makes the next read hash again. The cluster-level behaviour (sendfile,
503 after a change) is in test_integrity.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import xxhash

from etl_runtime.storage import integrity
from etl_runtime.storage.integrity import Checksum, Verified

LATER = 2_000_000_000  # a check begun 2 s after the file last changed
TICK = 0.05  # more than a file system clock tick: a later change shows in the ctime


def later() -> None:
    """What ``Verified.note`` ensures by not remembering a file changed within a second
    of its check: the change that follows falls in a later clock tick."""
    time.sleep(TICK)


def written(path: Path, data: bytes) -> tuple[integrity.Stamp, Checksum]:
    path.write_bytes(data)
    return integrity.stamp_of(path.stat()), Checksum(xxhash.xxh3_64_hexdigest(data), len(data))


def remembered(v: Verified, path: Path, cs: Checksum) -> bool:
    return v.fresh(integrity.stamp_of(path.stat()), cs)


def test_every_change_through_the_file_system_is_checked_again(tmp_path: Path) -> None:
    path = tmp_path / "o.bin"
    v = Verified(seconds=60)
    stamp, cs = written(path, b"x" * 10_000)
    v.note(stamp, cs, stamp[4] + LATER)
    assert remembered(v, path, cs)
    st = path.stat()
    later()
    with open(path, "r+b") as f:  # bit flips in place, the mtime set back
        f.seek(100)
        f.write(b"\0\0\0")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not remembered(v, path, cs)

    def rename_over() -> None:
        (tmp_path / "new").write_bytes(b"x" * 10_000)
        os.replace(tmp_path / "new", path)

    for change in (
        lambda: os.truncate(path, 9_999),
        lambda: os.setxattr(path, "user.other", b"1"),
        rename_over,
    ):
        stamp = integrity.stamp_of(path.stat())
        v.note(stamp, cs, stamp[4] + LATER)
        assert remembered(v, path, cs)
        later()
        change()
        assert not remembered(v, path, cs)


def test_a_match_is_bounded_in_time_and_number(tmp_path: Path) -> None:
    path = tmp_path / "o.bin"
    stamp, cs = written(path, b"y" * 1000)
    just_changed = Verified(seconds=60)
    just_changed.note(stamp, cs, stamp[4] + 1000)  # checked within a clock tick of a change
    assert not remembered(just_changed, path, cs)
    other = Checksum("0" * 16, 1000)
    short = Verified(seconds=0.2)
    short.note(stamp, cs, stamp[4] + LATER)
    assert remembered(short, path, cs) and not short.fresh(stamp, other)
    time.sleep(0.3)
    assert not remembered(short, path, cs)
    off = Verified(seconds=0)
    off.note(stamp, cs, stamp[4] + LATER)
    assert not remembered(off, path, cs)
    few = Verified(seconds=60, limit=2)
    stamps = [(1, ino, 1000, 0, 0) for ino in range(3)]
    for s in stamps:
        few.note(s, cs, LATER)
    assert [few.fresh(s, cs) for s in stamps] == [False, True, True]
    few.forget(stamps[2])
    assert not few.fresh(stamps[2], cs)


def test_a_bad_ttl_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_VERIFY_READS_TTL", "soon")
    with pytest.raises(ValueError, match="SLUICE_VERIFY_READS_TTL"):
        Verified()
    monkeypatch.setenv("SLUICE_VERIFY_READS_TTL", "2.5")
    assert Verified().seconds == 2.5
