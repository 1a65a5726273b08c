"""``etl_fqn``: which files a transformer may open by path.

For ``argType: fqn`` the target sends the path of the object's file instead
of its bytes. Anyone holding the transformer's token could send any path, so
the transformer opens only files whose resolved real path (symlinks and
``..`` followed) lies under one of its data roots: the target's data
directory, given by whoever starts the transformer in ``SLUICE_DATA_ROOTS``
(``os.pathsep``-separated). Everything else is a 400 before any file is
opened, and so is every ``etl_fqn`` when no root was given.
"""

from __future__ import annotations

import logging
import os

from etl_runtime.core.errors import BadRequest

log = logging.getLogger("sluice.transformer")

DATA_ROOTS_ENV = "SLUICE_DATA_ROOTS"


def data_roots(value: str | None = None) -> tuple[str, ...]:
    """The real paths of the roots in ``value`` (default: ``$SLUICE_DATA_ROOTS``)."""
    raw = os.environ.get(DATA_ROOTS_ENV, "") if value is None else value
    return tuple(os.path.realpath(p) for p in raw.split(os.pathsep) if os.path.isabs(p))


def confine(fqn: str, roots: tuple[str, ...], dirs: dict[str, str] | None = None) -> str:
    """The real path of ``fqn`` if it lies under one of ``roots``; else ``BadRequest``.

    ``dirs``: the real paths of directories already resolved (one batch's: its
    files share a few directories, and ``realpath`` costs a ``lstat`` per
    component); a file that is not a symlink itself is then one ``lstat``."""
    if "\x00" in fqn or not os.path.isabs(fqn):
        raise BadRequest(f"etl_fqn must be an absolute path, got {fqn!r:.200}")
    if not roots:
        raise BadRequest(
            f"etl_fqn refused: this transformer has no data root ({DATA_ROOTS_ENV} is not set)"
        )
    head, tail = os.path.split(fqn)
    if dirs is not None and tail not in ("", ".", "..") and not os.path.islink(fqn):
        if head not in dirs:
            dirs[head] = os.path.realpath(head)
        real = os.path.join(dirs[head], tail)
    else:
        real = os.path.realpath(fqn)
    if not any(real == root or real.startswith(_dir(root)) for root in roots):
        log.warning("etl_fqn %r refused: outside the data roots %s", fqn[:300], roots)
        raise BadRequest("etl_fqn refused: the path lies outside the target's data directory")
    return real


def _dir(root: str) -> str:
    """``root`` with one trailing ``/``: a real path under it starts with this. (Both are
    real paths, so normalized: the test ``os.path.commonpath`` made, without its cost,
    which was 5% of a transformer's CPU per item of a batch.)"""
    return root if root.endswith("/") else root + "/"
