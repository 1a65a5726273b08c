"""Abandoned S3 multipart uploads, reclaimed: a background sweep on each target.

An S3 upload in progress is hidden objects of its bucket
(``.s3-multipart/ID/upload`` and ``.../part-NNNNN``, ``gateway/s3/multipart.py``),
each on its own HRW owner. Every target sweeps the ones it holds: an object
under ``.s3-multipart/`` whose file is older than the limit is deleted
(``store.delete_object``, so the space is freed and listings forget it).

The limit is measured from the upload's start, as S3's
``AbortIncompleteMultipartUpload`` is: the ``upload`` record is written
before any part, so an old part means an old upload; a record older than the
limit makes the upload unknown (``NoSuchUpload``) and its parts follow it as
they age. Uploads are aborted whole within one sweep interval of each other.

* ``SLUICE_S3_UPLOAD_TTL``: seconds an upload may stay unfinished (default
  86400, 24 h; ``0`` turns the sweep off);
* the sweep runs every ``min(TTL / 4, 1 h)``, at least once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from etl_runtime.core.errors import SluiceError
from etl_runtime.storage.store import ObjectStore

log = logging.getLogger(__name__)

HIDDEN = ".s3-multipart"
TTL_ENV = "SLUICE_S3_UPLOAD_TTL"
DEFAULT_TTL = 24 * 3600.0


def ttl_from_env() -> float:
    raw = os.environ.get(TTL_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_TTL
    except ValueError:
        raise ValueError(f"{TTL_ENV} must be a number of seconds, got {raw!r}") from None


def sweep_once(store: ObjectStore, ttl: float, now: float | None = None) -> int:
    """Delete every hidden upload object older than ``ttl`` here; how many were."""
    now = time.time() if now is None else now
    removed = 0
    for bucket in store.bucket_dirs():
        root = Path(store.buckets_dir) / bucket / HIDDEN
        if not root.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(root):
            for fname in files:
                path = Path(dirpath) / fname
                try:
                    if now - path.stat().st_mtime <= ttl:
                        continue
                    name = str(path.relative_to(Path(store.buckets_dir) / bucket))
                    store.delete_object(bucket, name)
                    removed += 1
                except (OSError, SluiceError):  # gone meanwhile, or a name the store refuses
                    continue
    if removed:
        log.info("multipart sweep: %d abandoned upload objects removed", removed)
    return removed


class MultipartSweep:
    """The periodic sweep, started and stopped with the target's app."""

    def __init__(self, store: ObjectStore, ttl: float | None = None) -> None:
        self.store = store
        self.ttl = ttl_from_env() if ttl is None else ttl
        self.interval = max(1.0, min(self.ttl / 4, 3600.0))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.ttl > 0:
            self._task = asyncio.create_task(self._run(), name="multipart-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(sweep_once, self.store, self.ttl)
            except Exception:  # noqa: BLE001 - a failed sweep is tried again next interval
                log.exception("multipart sweep failed")
            await asyncio.sleep(self.interval)
