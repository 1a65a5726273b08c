"""ETL records as JSON files: the local cluster's stand-in for ETL custom resources.

The local ETL controller (inside the gateway) is the only writer: it keeps one
``<name>.json`` per ETL (``EtlRecord.to_dict()``) in the state directory and
rewrites it atomically (temp file, fsync, rename) whenever the spec or the
observed status changes. Targets are readers: ``FileRegistry.get()`` runs on
every transformed request, so it answers from a cache and re-reads a file only
when its ``stat`` signature changes.

A file replaced twice within the filesystem's timestamp granularity could keep
the same mtime, size and (reused) inode; like git's "racily clean" index
entries, a file modified less than ``RACY_SECONDS`` ago is therefore always
re-read.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core.durable import fsync_dir, write_atomic
from etl_runtime.core.errors import RegistryUnreadable
from etl_runtime.core.spec import InvalidSpec, validate_name

RACY_SECONDS = 1.0
log = logging.getLogger(__name__)

_Signature = tuple[int, int, int]  # (st_ino, st_mtime_ns, st_size)


class FileRegistry:
    """``EtlRegistry`` over ``dir/<name>.json``, plus the controller's writer side."""

    def __init__(self, dir: Path | str) -> None:
        self.dir = Path(dir)
        self._cache: dict[str, tuple[_Signature, EtlRecord]] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    # -- read side (targets) -------------------------------------------------

    def get(self, name: str) -> EtlRecord | None:
        """The record of ETL ``name`` or ``None``; cheap when the file is unchanged."""
        try:
            validate_name(name)
        except InvalidSpec:
            return None  # never turn a request parameter into an arbitrary path
        path = self.path(name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            with self._lock:
                self._cache.pop(name, None)
            return None
        sig: _Signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._cache.get(name)
        racy = time.time_ns() - st.st_mtime_ns < RACY_SECONDS * 1e9
        if cached is not None and cached[0] == sig and not racy:
            return cached[1]
        try:
            record = self._read(path)
        except RegistryUnreadable:
            # Unreadable (permissions, or a torn file, which atomic writes should
            # not leave): keep serving the last good version rather than failing
            # requests; with none, say so: never "no such ETL".
            if cached is not None:
                return cached[1]
            raise
        if record is None:  # gone between the stat and the read
            return None
        with self._lock:
            self._cache[name] = (sig, record)
        return record

    @staticmethod
    def _read(path: Path) -> EtlRecord | None:
        """The record in ``path``; None if it is gone; ``RegistryUnreadable`` naming the
        ETL, the file and the cause if it cannot be read or parsed."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RegistryUnreadable(
                f"the record of ETL {path.stem!r} ({path}) cannot be read by uid "
                f"{os.getuid()}: {e.strerror or e}; the registry directory must be readable "
                "by every target",
                etl=path.stem,
            ) from None
        try:
            return EtlRecord.from_dict(json.loads(data))
        except (ValueError, KeyError, TypeError) as e:
            raise RegistryUnreadable(
                f"the record of ETL {path.stem!r} ({path}) is not a valid record "
                f"({type(e).__name__}: {e})",
                etl=path.stem,
            ) from None

    def list(self) -> list[EtlRecord]:
        """Every readable record, sorted by name (an unreadable one is logged and left
        out: a listing must not fail for one bad file)."""
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = self.get(path.stem)
            except RegistryUnreadable as e:
                log.warning("%s", e.message)
                continue
            if record is not None:
                out.append(record)
        return out

    # -- write side (the local ETL controller) -------------------------------

    def write(self, record: EtlRecord) -> None:
        """Atomically replace ``<name>.json`` with ``record``."""
        validate_name(record.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps(record.to_dict(), indent=1, sort_keys=True).encode()
        write_atomic(self.path(record.name), data)

    def delete(self, name: str) -> None:
        """Remove the record; ``KeyError(name)`` if there is none."""
        validate_name(name)
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            raise KeyError(name) from None
        finally:
            with self._lock:
                self._cache.pop(name, None)
        fsync_dir(self.dir)
