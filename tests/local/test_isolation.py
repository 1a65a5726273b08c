"""A hostile ETL on a ``sluice up`` run as root cannot reach another ETL, the key or the
internal API.

Each ETL's transformers run as a uid of their own (``local/runas.py``), with an
interpreter under ``DIR/runtime`` when the venv's lies under ``/root``
(``local/sandbox.py``). The hostile ETL's code gets a plan (the victim's
transformer pids, the targets' URLs, the data dir) as the object it
transforms, tries everything on it, and answers what it found: another ETL's
token or the cluster key from ``/proc/<pid>/environ`` and ``cmdline``, a
SIGKILL to the victim's transformers, the key file and the servers' private
files, a write through the internal replica API with every secret it could
find. The test asserts that nothing leaked, every attempt was refused, and the
victim ETL still serves and its bucket's object is unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from aistore.sdk import Client
from aistore.sdk.etl import ETLConfig

from etl_runtime.local import LocalCluster
from etl_runtime.sdk import Client as SluiceClient

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a system Python"),
]

VICTIM = """
def transform(data):
    return data.upper()
"""

# Runs inside the hostile ETL's transformer: every way in it can think of.
HOSTILE = r"""
import glob, json, os, signal, urllib.request

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError as e:
        return "refused: " + type(e).__name__

def transform(data):
    plan = json.loads(data)
    mine = os.environ.get("SLUICE_ETL_TOKEN", "")
    found = {"tokens": [], "keys": [], "read": {}, "kill": {}, "replica": [], "uid": os.getuid()}
    secrets = set()
    for proc in glob.glob("/proc/[0-9]*"):
        for part in ("environ", "cmdline"):
            text = _read(proc + "/" + part)
            for item in text.replace("\0", "\n").split("\n"):
                name, _, value = item.partition("=")
                if name in ("SLUICE_ETL_TOKEN", "SLUICE_CLUSTER_KEY", "SLUICE_TOKEN"):
                    if value and value != mine:
                        (found["keys"] if "KEY" in name else found["tokens"]).append(value)
                        secrets.add(value)
    for pid in plan["victim_pids"]:
        found["read"]["environ %d" % pid] = _read("/proc/%d/environ" % pid)[:80]
        try:
            os.kill(pid, signal.SIGKILL)
            found["kill"][str(pid)] = "killed"
        except OSError as e:
            found["kill"][str(pid)] = type(e).__name__
    for path in plan["files"]:
        text = _read(path)
        found["read"][path] = text[:80]
        if not text.startswith("refused: ") and text.strip().isalnum():
            secrets.add(text.strip())  # a key file
    try:
        found["listing"] = sorted(os.listdir(plan["data_dir"]))
    except OSError as e:
        found["listing"] = "refused: " + type(e).__name__
    import hashlib, hmac
    headers = [{}, {"Authorization": "Bearer " + mine}, {"X-Sluice-Internal": mine}]
    for s in secrets:  # a key found: derive the internal token, as the servers do
        derived = hmac.new(s.encode(), b"target-to-target", hashlib.sha256).hexdigest()
        headers += [{"X-Sluice-Internal": s}, {"X-Sluice-Internal": derived}]
    for url in plan["targets"]:
        for h in headers:
            req = urllib.request.Request(
                url + "/v1/_replica/" + plan["bucket"] + "/" + plan["object"],
                data=b"overwritten by the hostile ETL", method="PUT", headers=h,
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    found["replica"].append(r.status)
            except urllib.error.HTTPError as e:
                found["replica"].append(e.code)
            except OSError as e:
                found["replica"].append(type(e).__name__)
    return json.dumps(found).encode()
"""


@pytest.fixture(scope="module")
def up() -> Iterator[LocalCluster]:
    base = Path(tempfile.mkdtemp(prefix="sluice-isolation-"))
    base.chmod(0o755)  # pytest's own tmp dirs are 0700: no other uid could enter them
    try:
        with LocalCluster(base / "data", targets=2) as c:
            sluice = SluiceClient(c.endpoint)
            # started afresh (a variable read at import time), not forked by the zygote:
            # its token is in its /proc/PID/environ, for the hostile ETL to look for
            sluice.etl("victim").init_spec(source=VICTIM, timeout=120, env={"OMP_NUM_THREADS": "1"})
            sluice.etl("hostile").init_spec(source=HOSTILE, timeout=120)
            ais = Client(c.endpoint)
            for bucket in ("private", "plans"):
                ais.bucket(bucket).create(exist_ok=True)
            ais.bucket("private").object("secret.txt").get_writer().put_content(b"team b's data")
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


def transformer_pids(up: LocalCluster, etl: str) -> list[int]:
    """The leaders of ``etl``'s transformers, from the controller's pid files."""
    out = []
    for f in (up.data_dir / "etl" / "run").glob(f"etl-{etl}-t*.json"):
        pid = json.loads(f.read_text())["pid"]
        if psutil.pid_exists(pid):
            out.append(pid)
    return sorted(out)


def test_each_etl_runs_as_a_uid_of_its_own_and_sluice_up_says_so(up: LocalCluster) -> None:
    assert "each ETL's transformers run as a uid of their own" in up.output, up.output
    uids = {}
    for etl in ("victim", "hostile"):
        pids = transformer_pids(up, etl)
        assert pids, f"no transformer of {etl} found"
        uids[etl] = {psutil.Process(p).uids().real for p in pids}
    assert len(uids["victim"]) == 1 and len(uids["hostile"]) == 1, uids
    assert uids["victim"] != uids["hostile"] and 0 not in uids["victim"] | uids["hostile"]


def test_a_hostile_etl_finds_nothing_and_the_victim_still_serves(up: LocalCluster) -> None:
    data = up.data_dir.resolve()
    view = httpx.get(f"{up.endpoint}/v1/cluster", timeout=30).json()
    targets = [t["url"] for t in view["targets"] if t.get("url")]
    assert len(targets) == 2, view
    victims = transformer_pids(up, "victim")
    plan = {
        "victim_pids": victims,
        "targets": targets,
        "bucket": "private",
        "object": "secret.txt",
        "data_dir": str(data),
        "files": [
            str(data / "cluster-key"),
            str(data / "etl" / "victim.json"),
            str(data / "etl" / "logs" / "etl-victim-t0.log"),
            str(data / "logs" / "t0.log"),
            str(data / "logs" / "gateway.log"),
            str(data / "cluster.json"),
            *[f"/proc/{p}/environ" for p in victims],
        ],
    }
    ais = Client(up.endpoint)
    ais.bucket("plans").object("plan.json").get_writer().put_content(json.dumps(plan).encode())
    answer = ais.bucket("plans").object("plan.json").get_reader(etl=ETLConfig("hostile"))
    found = json.loads(answer.read_all())

    key = (data / "cluster-key").read_text().strip()
    assert found["keys"] == [] and found["tokens"] == [], found
    assert key not in json.dumps(found)
    assert all(v.startswith("refused: PermissionError") for v in found["read"].values()), found
    assert found["listing"] == "refused: PermissionError", found
    assert set(found["kill"].values()) == {"PermissionError"}, found
    assert found["replica"] and set(found["replica"]) == {401}, found
    assert found["uid"] != 0

    # the victim's transformers live on, serve, and its bucket's object is as it was
    assert set(transformer_pids(up, "victim")) == set(victims)
    secret = ais.bucket("private").object("secret.txt")
    assert secret.get_reader().read_all() == b"team b's data"
    assert secret.get_reader(etl=ETLConfig("victim")).read_all() == b"TEAM B'S DATA"


def test_etl_code_reads_objects_but_not_the_targets_other_files(up: LocalCluster) -> None:
    """The transformer reads objects by path (``etl_fqn``), so the data group may enter
    a target's ``buckets``; the ETL output cache and temp files stay the servers'."""
    for t in sorted((up.data_dir / "targets").iterdir()):
        assert oct(t.stat().st_mode & 0o777) == "0o710", t
        for entry in t.iterdir():
            want = 0o755 if entry.name == "buckets" else 0o700
            assert entry.stat().st_mode & 0o777 == want, entry
    assert (up.data_dir / "cluster-key").stat().st_mode & 0o777 == 0o600
