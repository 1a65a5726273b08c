"""Files that survive a crash or a power loss: atomic replace, and the directory fsync.

A rename is atomic for readers at once, but it is durable only once the
directory holding it is fsynced; without that, a power loss can bring the old
file back after the write was acknowledged. Shared by the object store, the
cluster map and the local ETL registry.

The same holds for a new directory: its entry lives in its parent, so until
the parent is fsynced a power loss can take the directory away, and with it
every file renamed into it, fsynced or not. ``make_dirs`` creates missing
directories and fsyncs the parent of each one it created; a directory that
already exists costs one ``stat`` and no fsync.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make renames and unlinks in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, root: Path | None = None) -> list[Path]:
    """Create ``path`` and its missing parents durably; the directories created, deepest first.

    After creating them, the parent of each new directory is fsynced, from the
    deepest new one up to the first ancestor that existed. ``root`` is never
    created: if it is missing, ``FileNotFoundError`` (the caller decides, e.g.
    a bucket deleted meanwhile). A directory a concurrent caller created
    between our check and our ``mkdir`` counts as ours: its entry may not be
    durable yet, and an fsync too many is cheap where that race happens.
    """
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        if p == root or p.parent == p:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(p))
        missing.append(p)
        p = p.parent
    if not missing:
        return []
    made: list[Path] = []
    try:
        for d in reversed(missing):  # shallowest first
            try:
                d.mkdir()
            except FileExistsError:
                if not d.is_dir():
                    raise  # a file in the way: the caller's conflict
            made.append(d)
    except OSError:  # e.g. ENOSPC halfway: leave no empty directories behind
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    for d in missing:  # deepest first: each new entry, then the one holding it
        fsync_dir(d.parent)
    return missing


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
