"""Which OS user runs ``sluice up``'s transformers (issue 20 #11).

ETL code is code a token holder registered; run as the servers' own user it
can open ``DIR/cluster-key`` (mode 0600) and hand it to anyone. When ``sluice
up`` runs as root it therefore runs transformers as an unprivileged user
(``--transformer-user``, ``$SLUICE_TRANSFORMER_USER``; default ``nobody``), who
cannot read the key, nor the servers' ``/proc/<pid>/environ``. That works only
where that user can run the interpreter and import Sluice (a system-wide
Python, a venv outside ``/root``) and reach the targets' data dirs (the
transformer reads objects by path). ``choose`` tries exactly that, as that user,
once at start; if it fails, transformers run as root and the start-up line says
why. As any other user nothing changes: a process cannot switch users, and the
start-up line says that ETL code can read the key. On Kubernetes transformer
pods never get the key (the chart runs them as uid 10001).

``sluice up`` hands the choice to the gateway (whose local ETL controller spawns
the transformers) as ``$SLUICE_TRANSFORMER_UID`` = ``uid:gid:name``.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USER_ENV = "SLUICE_TRANSFORMER_USER"
UID_ENV = "SLUICE_TRANSFORMER_UID"  # what the gateway is told: uid:gid:name
DEFAULT_USER = "nobody"
PROBE_SECONDS = 60.0


@dataclass(frozen=True)
class TransformerUser:
    uid: int
    gid: int
    name: str

    def encode(self) -> str:
        return f"{self.uid}:{self.gid}:{self.name}"

    def own(self, path: Path) -> None:
        """Make the directory ``path`` (the transformer's deps dir) this user's."""
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, self.uid, self.gid)

    def popen_kwargs(self) -> dict[str, Any]:
        """What ``subprocess``/``asyncio`` take to start a child as this user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def from_env(environ: dict[str, str] | None = None) -> TransformerUser | None:
    """The user ``sluice up`` chose (``$SLUICE_TRANSFORMER_UID``), or None: our own."""
    raw = (os.environ if environ is None else environ).get(UID_ENV, "")
    uid, _, rest = raw.partition(":")
    gid, _, name = rest.partition(":")
    if not (uid.isdigit() and gid.isdigit()):
        return None
    return TransformerUser(int(uid), int(gid), name or uid)


def choose(
    requested: str | None, data_dir: Path, python: str = sys.executable
) -> tuple[TransformerUser | None, str]:
    """``(user, start-up line)``: the user to run transformers as (None: ours) and why.

    ``requested``: a user name or uid; None means ``nobody`` when we are root;
    ``""`` or ``root`` keeps ours. The user must be able to import
    ``etl_runtime.webserver`` with ``python`` from ``DIR/etl`` and list the
    targets' data under ``DIR/targets`` -- tried for real, as that user.
    """
    key = data_dir / "cluster-key"
    me = _my_name()
    same = (
        f"sluice: note: ETL code runs as {me}, like the servers, and can read {key}: "
        "register only code you trust here (on Kubernetes transformers get no cluster key)"
    )
    if os.geteuid() != 0:
        return None, same
    wanted = DEFAULT_USER if requested is None else requested.strip()
    if wanted in ("", "root", "0"):
        return None, f"{same} (--transformer-user {wanted!r})"
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
        f"sluice: transformers run as {user.name} (uid {user.uid}): ETL code cannot read {key}"
    )


def probe(user: TransformerUser, data_dir: Path, python: str) -> str | None:
    """None if ``user`` can start a transformer here, else why not (one line)."""
    check = "import os, sys, etl_runtime.webserver; os.listdir(sys.argv[1])"
    (data_dir / "etl").mkdir(parents=True, exist_ok=True)
    (data_dir / "targets").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
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
