"""What an ETL's own uid may reach in a ``sluice up`` data dir, and a runtime it can run.

Two jobs, both for ``local/runas.py``'s per-ETL uids:

* ``runtime(data_dir)``: an interpreter those uids can run. A venv's ``bin/python``
  is often a link into a home directory they cannot enter (pyenv under
  ``/root``, mode 0700). The base installation's interpreter, ``libpython`` and
  standard library (``sys.base_prefix``, not its ``site-packages``) are then
  mirrored into ``DIR/runtime/python`` as hard links (a copy across file
  systems: about 130 MB), and ``DIR/runtime/venv`` is a venv over it whose
  ``site-packages`` is the running venv's own (a link: it must be readable by
  others, as a venv outside a home directory is). Rebuilt when the interpreter
  changes.
* ``lock_down(data_dir, group)``: modes under ``DIR`` so that an ETL uid (in the
  data ``group``) can traverse to what it needs and nothing else::

    DIR                 0711  (no listing)      cluster-key 0600 as before,
                                                and the lock files (LOCKS)
    DIR/logs, DIR/run   0700                    servers' logs and pids
    DIR/etl             0711                    ETL records are 0600
    DIR/etl/{logs,run}  0700                    every transformer's log, pids
    DIR/etl/deps        0711; deps/<etl> 0700, that ETL's uid
    DIR/targets         0711
    DIR/targets/<t>     0710 root:group         group may traverse to the socket
    DIR/targets/<t>/fd.sock  0666               the target's file broker
    DIR/targets/<t>/buckets  0700               objects: no ETL uid opens one by path
    DIR/targets/<t>/*   0700                    ETL output cache, temp files, jobs

  A transformer gets the objects it is sent as open descriptors from its
  target's file broker (``storage_target/fdbroker.py``), each for a grant the
  target signed for that ETL (``etl/grants.py``); the object files themselves
  keep their modes (0644), so ``/proc/<pid>/fd/N`` reopens a handed one.
  Nothing else of the servers' is in reach. (Where the socket's path would be
  too long for ``sun_path``, no broker runs and ``buckets`` keeps the mode it
  was made with, 0755: objects are then read by path.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import sys
import sysconfig
from pathlib import Path

RUNTIME_DIR = "runtime"
PRIVATE = ("logs", "run")  # under DIR, and under DIR/etl
OBJECTS = "buckets"  # a target's objects: reached through its broker's socket
BROKER_SOCKET = "fd.sock"  # in a target's data dir (storage_target/fdbroker.py)
SUN_PATH_MAX = 100  # sun_path holds 108 bytes
# flock()ed by the servers: the cluster map's writers, the running sluice up
LOCKS = ("cluster.json.lock", ".sluice-up.lock")


def runtime(data_dir: Path) -> tuple[str, dict[str, str]]:
    """``(python, env)``: the runtime's interpreter and what its environment needs
    (``LD_LIBRARY_PATH`` for a ``libpython`` found by an absolute run path).

    ``OSError`` if it cannot be built."""
    base = Path(sys.base_prefix)
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    exe = Path(os.path.realpath(sys.executable))
    purelib = Path(sysconfig.get_paths()["purelib"])
    root = data_dir / RUNTIME_DIR
    stamp = json.dumps(
        {"base": str(base), "exe": str(exe), "version": sys.version, "lib": str(purelib)}
    )
    py_dir, venv = root / "python", root / "venv"
    python = venv / "bin" / "python"
    env = {"LD_LIBRARY_PATH": str(py_dir / "lib")}
    with contextlib.suppress(OSError):
        if (root / "stamp.json").read_text() == stamp and python.exists():
            return str(python), env
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    shutil.rmtree(py_dir, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    (py_dir / "bin").mkdir(parents=True)
    _link(exe, py_dir / "bin" / exe.name)
    for lib in (base / "lib").glob("libpython*"):
        _link(Path(os.path.realpath(lib)), py_dir / "lib" / lib.name)
    stdlib = base / "lib" / ver
    skip = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
    for dirpath, dirnames, filenames in os.walk(stdlib):
        rel = Path(dirpath).relative_to(stdlib)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
        (py_dir / "lib" / ver / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            if not src.is_symlink():
                _link(src, py_dir / "lib" / ver / rel / name)
    (py_dir / "lib" / ver / "site-packages").mkdir(exist_ok=True)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(py_dir / "bin" / exe.name)
    (venv / "lib" / ver).mkdir(parents=True)
    (venv / "lib" / ver / "site-packages").symlink_to(purelib)
    (venv / "pyvenv.cfg").write_text(
        f"home = {py_dir / 'bin'}\ninclude-system-site-packages = false\n"
        f"version = {sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}\n"
    )
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in files:
            if name == "pyvenv.cfg":
                os.chmod(Path(dirpath) / name, 0o644)
    (root / "stamp.json").write_text(stamp)
    return str(python), env


def _link(src: Path, dst: Path) -> None:
    """A hard link (no space, same modes); a copy across file systems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst)
    mode = stat.S_IMODE(os.stat(dst).st_mode)
    if not mode & stat.S_IROTH:  # a hard link shares the inode: copy instead of chmod
        dst.unlink()
        shutil.copy2(src, dst)
        os.chmod(dst, mode | 0o444 | (0o111 if mode & 0o100 else 0))


def closed_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that other users may not traverse (o-x), if any."""
    for parent in reversed(path.resolve().parents):
        with contextlib.suppress(OSError):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return parent
    return None


def broker_socket(data_dir: Path, target_id: str) -> str | None:
    """Where target ``target_id``'s file broker listens; None if the path is too long."""
    path = str(data_dir.resolve() / "targets" / target_id / BROKER_SOCKET)
    return path if len(path.encode()) <= SUN_PATH_MAX else None


def lock_down(data_dir: Path, group: int) -> None:
    """Set the modes the module docstring lists (idempotent; cheap enough for every second)."""
    _mode(data_dir, 0o711)
    for name in PRIVATE:
        _mode(data_dir / name, 0o700)
    for name in LOCKS:  # a file one can open, one can flock: ETL code would hold it
        _mode(data_dir / name, 0o600)
    etl = data_dir / "etl"
    _mode(etl, 0o711)
    for name in PRIVATE:
        _mode(etl / name, 0o700)
    _mode(etl / "deps", 0o711)
    targets = data_dir / "targets"
    _mode(targets, 0o711)
    with contextlib.suppress(OSError):
        for t in targets.iterdir():
            if not t.is_dir() or t.is_symlink():
                continue
            _mode(t, 0o710, group)
            brokered = broker_socket(data_dir, t.name) is not None
            for entry in t.iterdir():
                if entry.name == BROKER_SOCKET or entry.is_symlink():
                    continue  # the broker sets its own mode
                if entry.name != OBJECTS or brokered:
                    _mode(entry, 0o700)


def _mode(path: Path, mode: int, group: int | None = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return
        if group is not None and st.st_gid != group:
            os.chown(path, -1, group)
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
