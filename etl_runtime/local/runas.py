"""Which OS users run ``sluice up``'s transformers: one uid per ETL.

ETL code is code a token holder registered; run as the servers' own user it
can open ``DIR/cluster-key`` (mode 0600), derive the internal token from it,
read every other transformer's token from ``/proc/<pid>/environ`` and signal
other ETLs' processes. When ``sluice up`` runs as root, each ETL's
transformers therefore run as a uid of their own (``Isolation``): uid
``BASE + n`` for the n-th ETL registered here (``DIR/etl/etl-uids.json``),
primary group the same number, plus the data group ``BASE``; ``BASE`` is
``$SLUICE_ETL_UID_BASE`` (default 2000000000, a range no login uses; no
``/etc/passwd`` entries are made). A uid of its own cannot read another's
``/proc/<pid>/environ``, signal it or trace it, nor read the key or the
servers' environment (root's, mode 0400). ``local/sandbox.py`` sets the data
dir's modes so that the data group reaches each target's file broker and
nothing else (a transformer gets the objects it is sent from it, as open
files, for grants the target signs: ``target_env`` tells each target where
to listen and which uid runs which ETL; ``etl/grants.py``), and
gives those uids an interpreter they can run when the venv's is out of their
reach (a link into ``/root``): ``DIR/runtime``. ``choose`` tries it for real,
as the data group's uid, once at start; if that fails, transformers run as
root and the start-up line says why, on every start.

``--transformer-user NAME`` instead runs every ETL as that one user (the
servers' key is still out of reach, other ETLs are not); ``root`` runs them
as the servers. As any other user nothing changes: a process cannot switch
users, and the start-up line says that ETL code can read the key. On
Kubernetes transformer pods never get the key (the chart runs them as uid
10001, each in its own pod).

``sluice up`` hands the choice to the gateway (whose local ETL controller spawns
the transformers): ``$SLUICE_ETL_ISOLATION`` (JSON) or ``$SLUICE_TRANSFORMER_UID``
= ``uid:gid:name``.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etl_runtime.etl import grants
from etl_runtime.local import sandbox

USER_ENV = "SLUICE_TRANSFORMER_USER"
UID_ENV = "SLUICE_TRANSFORMER_UID"  # what the gateway is told: uid:gid:name
ISOLATION_ENV = "SLUICE_ETL_ISOLATION"  # or this: per-ETL uids (JSON)
BASE_ENV = "SLUICE_ETL_UID_BASE"
DEFAULT_BASE = 2_000_000_000
UID_COUNT = 1_000_000
UIDS_FILE = "etl-uids.json"  # in the state dir: ETL name -> uid, never reused
PROBE_SECONDS = 60.0


@dataclass(frozen=True)
class TransformerUser:
    uid: int
    gid: int
    name: str
    groups: tuple[int, ...] = ()

    def encode(self) -> str:
        return f"{self.uid}:{self.gid}:{self.name}"

    def own(self, path: Path) -> None:
        """Make the directory ``path`` (the transformer's deps dir) this user's only."""
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, self.uid, self.gid)
        if self.groups:  # an ETL of its own: no other ETL may look in
            os.chmod(path, 0o700)

    def popen_kwargs(self) -> dict[str, Any]:
        """What ``subprocess`` takes to start a child as this user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run as this user through a step that drops root's credentials and
        ``exec``s it (same pid): uvloop's ``subprocess_exec`` takes no ``user``."""
        groups = ",".join(str(g) for g in self.groups)
        return [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _DROP,
            str(self.uid),
            str(self.gid),
            groups,
            *argv,
        ]


_DROP = (
    "import os, sys\n"
    "uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "os.setgroups([int(g) for g in groups.split(',') if g])\n"
    "os.setgid(gid)\n"
    "os.setuid(uid)\n"
    "os.execv(sys.argv[4], sys.argv[4:])\n"
)


@dataclass(frozen=True)
class Isolation:
    """One uid per ETL (module docstring): ``base`` is also the data group."""

    base: int
    python: str  # an interpreter every ETL uid can run, with our packages
    env: dict[str, str] = field(default_factory=dict)  # what it needs (LD_LIBRARY_PATH)

    def encode(self) -> str:
        return json.dumps({"base": self.base, "python": self.python, "env": self.env})

    @property
    def group(self) -> int:
        return self.base

    def user(self, n: int) -> TransformerUser:
        uid = self.base + n
        return TransformerUser(uid, uid, f"etl-uid-{uid}", (self.base,))

    def user_for(self, state_dir: Path, etl: str) -> TransformerUser:
        """The uid of ETL ``etl``: the one it had, or the next never given out."""
        path = state_dir / UIDS_FILE
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {"next": 1, "etls": {}}
        n = table["etls"].get(etl)
        if n is None:
            n = int(table["next"])
            if n >= UID_COUNT:
                raise OSError(f"no ETL uid left in {self.base}+{UID_COUNT}")
            table["etls"][etl], table["next"] = n, n + 1
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(table, f)
            os.replace(tmp, path)
        return self.user(int(n))


Choice = TransformerUser | Isolation | None


def gateway_env(choice: Choice) -> dict[str, str]:
    """What ``sluice up`` tells the gateway of ``choice``."""
    if isinstance(choice, Isolation):
        return {ISOLATION_ENV: choice.encode()}
    if isinstance(choice, TransformerUser):
        return {UID_ENV: choice.encode()}
    return {}


def target_env(requested: str | None, data_dir: Path, target_id: str) -> dict[str, str]:
    """What target ``target_id`` needs to hand per-ETL uids the objects' files (its file
    broker, ``storage_target/fdbroker.py``): set where ``choose`` tries those uids."""
    if os.geteuid() != 0 or requested is not None:
        return {}
    try:
        base = base_from_env()
    except ValueError:
        return {}
    sock = sandbox.broker_socket(data_dir, target_id)
    if sock is None:
        return {}
    return {grants.ENV: sock, grants.UIDS_ENV: f"{base}:{data_dir / 'etl' / UIDS_FILE}"}


def from_env(environ: dict[str, str] | None = None) -> Choice:
    """What ``sluice up`` chose (``$SLUICE_ETL_ISOLATION``, ``$SLUICE_TRANSFORMER_UID``),
    or None: our own user."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if raw := env.get(ISOLATION_ENV, ""):
        try:
            d = json.loads(raw)
            return Isolation(int(d["base"]), str(d["python"]), dict(d.get("env") or {}))
        except (ValueError, KeyError, TypeError):
            return None
    raw = env.get(UID_ENV, "")
    uid, _, rest = raw.partition(":")
    gid, _, name = rest.partition(":")
    if not (uid.isdigit() and gid.isdigit()):
        return None
    return TransformerUser(int(uid), int(gid), name or uid)


def base_from_env() -> int:
    raw = os.environ.get(BASE_ENV, "").strip()
    if not raw:
        return DEFAULT_BASE
    if not raw.isdigit() or not 1000 <= int(raw) <= 2**32 - 2 - UID_COUNT:
        raise ValueError(f"{BASE_ENV}={raw!r}: give a uid from 1000 to {2**32 - 2 - UID_COUNT}")
    return int(raw)


def choose(
    requested: str | None, data_dir: Path, python: str = sys.executable
) -> tuple[Choice, str]:
    """``(choice, start-up line)``: who runs transformers (None: our user) and why.

    ``requested``: a user name or uid; None means a uid per ETL when we are root;
    ``""`` or ``root`` keeps ours. The uids must be able to import
    ``etl_runtime.webserver`` from ``DIR/etl`` and reach ``DIR/targets`` -- tried
    for real, as such a uid.
    """
    key = data_dir / "cluster-key"
    me = _my_name()
    same = (
        f"sluice: WARNING: ETL code runs as {me}, like the servers: it can read {key}, "
        "reach the internal API and other ETLs' processes; register only code you trust "
        "here (on Kubernetes transformers get no cluster key)"
    )
    if os.geteuid() != 0:
        return None, same
    wanted = "" if requested is None else requested.strip()
    if requested is not None and wanted in ("", "root", "0"):
        return None, f"{same} (--transformer-user {wanted!r})"
    if requested is None:
        return _isolate(data_dir, python, same)
    try:
        entry = pwd.getpwuid(int(wanted)) if wanted.isdigit() else pwd.getpwnam(wanted)
    except KeyError:
        return None, f"{same}; user {wanted!r} does not exist (--transformer-user)"
    user = TransformerUser(entry.pw_uid, entry.pw_gid, entry.pw_name)
    why = probe(user, data_dir, python)
    if why:
        return None, (
            f"{same}; transformers could not run as {user.name} (uid {user.uid}): {why}. "
            f"Install Python where {user.name} can run it, or pick another "
            "--transformer-user"
        )
    return user, (
        f"sluice: transformers run as {user.name} (uid {user.uid}): ETL code cannot read "
        f"{key}; all ETLs share that user (without --transformer-user each gets its own)"
    )


def _isolate(data_dir: Path, python: str, same: str) -> tuple[Choice, str]:
    try:
        base = base_from_env()
    except ValueError as e:
        return None, f"{same}; {e}"
    probe_user = TransformerUser(base, base, f"uid {base}", (base,))
    if closed := sandbox.closed_ancestor(data_dir):
        return None, (
            f"{same}; ETL uids ({base}+) cannot enter {closed} (mode "
            f"{closed.stat().st_mode & 0o777:o}), above the data dir: use a --data-dir "
            "that other users can enter (e.g. under /var/lib or /srv)"
        )
    sandbox.lock_down(data_dir, base)
    why = probe(probe_user, data_dir, python)
    env: dict[str, str] = {}
    if why:  # the venv's interpreter is out of their reach: one under DIR/runtime
        try:
            python, env = sandbox.runtime(data_dir)
        except OSError as e:
            return None, f"{same}; cannot build {data_dir / sandbox.RUNTIME_DIR}: {e}"
        again = probe(probe_user, data_dir, python, env)
        if again:
            return None, (
                f"{same}; ETL uids ({base}+) cannot run {python}: {again} (and the venv's "
                f"interpreter: {why}). Use a --data-dir that other users can enter"
            )
    return Isolation(base, python, env), (
        f"sluice: each ETL's transformers run as a uid of their own ({base}+n): ETL code "
        f"cannot read {data_dir / 'cluster-key'}, other ETLs' processes or the servers'"
    )


def probe(
    user: TransformerUser, data_dir: Path, python: str, extra: dict[str, str] | None = None
) -> str | None:
    """None if ``user`` can start a transformer here, else why not (one line)."""
    check = "import os, sys, etl_runtime.webserver; os.stat(sys.argv[1])"
    (data_dir / "etl").mkdir(parents=True, exist_ok=True)
    (data_dir / "targets").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")} | (extra or {})
    try:
        r = subprocess.run(
            [python, "-c", check, str(data_dir / "targets")],
            cwd=data_dir / "etl",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
            **user.popen_kwargs(),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot start {python}: {e}"
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else f"{python} exited with code {r.returncode}"
    return None


def _my_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
