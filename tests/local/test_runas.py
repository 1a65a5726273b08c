"""Issue 20 #11: as root, ``sluice up`` runs ETL code as a user who cannot read the key.

An ETL registered by a token holder returned ``DIR/cluster-key`` to a client
holding only the read token: transformers ran as the servers' user. As root
with ``--transformer-user nobody`` they run as that user where it can run
the interpreter and reach the data; where it cannot (a Python under ``/root``,
mode 0700, as on this project's machines) they run as root and the start-up
line says why. ``local/runas.py`` tries it for real, as that user.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import site
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
import pytest

from etl_runtime.core import auth
from etl_runtime.core.spec import CodeSpec, EtlSpec
from etl_runtime.local import runas
from etl_runtime.local.controller import LocalEtlBackend
from tests.local.conftest import FakeTargets, wait_until

ROOT = os.geteuid() == 0
KEY = "k" * 64


def test_a_user_who_cannot_run_the_interpreter_leaves_etl_code_as_root_and_says_why(
    tmp_path: Path,
) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    python.symlink_to(sys.executable)
    user, line = runas.choose("nobody", tmp_path / "data", python=str(python))
    assert user is None
    assert f"can read {tmp_path / 'data' / 'cluster-key'}" in line, line
    if ROOT:  # it tried nobody, and says what failed
        assert "could not run as nobody (uid " in line and "Permission denied" in line, line
    else:  # another user cannot be chosen: the line names this one
        assert line.startswith("sluice: WARNING: ETL code runs as "), line
    assert runas.choose("root", tmp_path / "data")[0] is None
    if ROOT:
        assert "does not exist" in runas.choose("no-such-user-x", tmp_path / "data")[1]


def system_python() -> str | None:
    """A Python of our version that ``nobody`` can run (this machine's Debian one)."""
    for candidate in (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",):
        if os.access(candidate, os.X_OK) and not candidate.startswith("/root"):
            return candidate
    return None


@pytest.mark.skipif(not ROOT or system_python() is None, reason="needs root and a system Python")
def test_as_root_transformers_run_as_nobody_who_cannot_read_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A system Python with our packages on PYTHONPATH stands for "Python installed
    where nobody can run it": the probe passes, and the transformer really runs as
    uid 65534, serves, and its user code gets PermissionError on the cluster key."""
    python = system_python()
    assert python is not None
    paths = [*site.getsitepackages(), str(Path(__file__).resolve().parents[2])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    base = Path(tempfile.mkdtemp(prefix="sluice-runas-"))
    try:
        base.chmod(0o755)  # pytest's own tmp dir is 0700: nobody could not enter it
        data = base / "data"
        (data / "targets" / "t0").mkdir(parents=True)
        (data / "cluster-key").write_text(KEY)
        (data / "cluster-key").chmod(0o600)
        user, line = runas.choose("nobody", data, python=python)
        assert isinstance(user, runas.TransformerUser) and user.name == "nobody", line
        assert line.startswith(
            f"sluice: transformers run as nobody (uid {user.uid}): "
            f"ETL code cannot read {data / 'cluster-key'}"
        )
        code = (
            "def transform(data):\n"
            "    try:\n"
            f"        return open({str(data / 'cluster-key')!r}).read().encode()\n"
            "    except OSError as e:\n"
            "        return type(e).__name__.encode()\n"
        )

        async def scenario() -> None:
            be = LocalEtlBackend(
                data / "etl",
                FakeTargets(["t0"]),
                KEY,
                interval=0.2,
                command=(python, "-m", "etl_runtime.webserver"),
                run_as=user,
            )
            await be.start()
            try:
                rec = await be.init("peek", EtlSpec(code=CodeSpec(source=code), workers=1))
                await wait_until(
                    lambda: (
                        be.registry.get("peek") is not None
                        and be.registry.get("peek").ready_count == 1
                    ),  # type: ignore[union-attr]
                    timeout=120,
                    what="the transformer ready",
                )
                tf = be.registry.get("peek").transformers[0]  # type: ignore[union-attr]
                token = auth.transformer_token(KEY, "peek", rec.uid)
                async with httpx.AsyncClient(timeout=60) as c:
                    r = await c.put(
                        f"{tf.endpoint}/b/o",
                        content=b"x",
                        headers={"Authorization": f"Bearer {token}"},
                    )
                assert r.status_code == 200 and r.content == b"PermissionError", r.text
                pids = [p.pid for ps in be._procs.values() for p in ps]
                assert pids and all(psutil.Process(p).uids().real == user.uid for p in pids)
            finally:
                await be.stop()

        asyncio.run(scenario())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="needs root and a system Python")
def test_a_data_dir_other_uids_cannot_enter_keeps_etl_code_as_root_and_says_why(
    tmp_path: Path,
) -> None:
    """Per-ETL uids (the default as root) need to enter the data dir: under a 0700
    directory they cannot, and the line names it instead of claiming isolation."""
    closed = tmp_path / "home"
    closed.mkdir(mode=0o700)
    choice, line = runas.choose(None, closed / "data")
    assert choice is None
    assert line.startswith("sluice: WARNING: ETL code runs as root"), line
    assert f"cannot enter {closed} (mode 700)" in line or "cannot enter /" in line, line
    assert not (closed / "data" / "runtime").exists()  # nothing built for nothing
