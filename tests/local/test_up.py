"""``sluice up`` end to end: real gateway, targets and transformers as processes.

Runs ``python -m etl_runtime.local up`` through ``LocalCluster`` and checks what
a user of the command sees: it serves transformed objects, keeps data and ETLs
across a restart, exits 0 on SIGTERM, and leaves no process behind -- also
when one of its servers is killed hard.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from etl_runtime.local import LocalCluster

TOKEN = "s3cret"
UPPER = {
    "mode": "object",
    "workers": 1,
    "code": {"source": "def transform(data):\n    return data.upper()\n"},
}


def client(endpoint: str) -> httpx.Client:
    return httpx.Client(
        base_url=endpoint,
        headers={"Authorization": f"Bearer {TOKEN}"},
        follow_redirects=True,
        timeout=30,
    )


def wait_running(c: httpx.Client, name: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        details = c.get(f"/v1/etl/{name}").json()
        if details.get("phase") == "Running":
            return details
        if time.monotonic() > deadline:
            raise AssertionError(f"ETL {name} not Running: {details}")
        time.sleep(0.3)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def survivors(procs: list[psutil.Process], data_dir: Path) -> list[str]:
    """Processes of the cluster still alive: listed ones, or any naming the data dir."""
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(data_dir) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(f"{p.pid} {cmd[:120]}")
    return alive


def transformer_leaders(pid: int) -> list[psutil.Process]:
    out = []
    for p in descendants(pid):
        try:
            if "etl_runtime.webserver" in p.cmdline() and os.getsid(p.pid) == p.pid:
                out.append(p)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return out


def test_up_serves_survives_restart_and_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cluster = LocalCluster(data, targets=2, token=TOKEN)
    with cluster:
        assert cluster.endpoint.startswith("http://127.0.0.1:")
        assert stat.S_IMODE(os.stat(data / "cluster-key").st_mode) == 0o600
        key = (data / "cluster-key").read_text()
        # Issue 20 #11: who runs ETL code, and whether it can read the key: said at start
        # (as root, another user where it can run this Python: tests/local/test_runas.py).
        key_path = data.resolve() / "cluster-key"
        said = [x for x in cluster.output.splitlines() if str(key_path) in x]
        assert len(said) == 1 and said[0].startswith("sluice: "), cluster.output
        assert f"can read {key_path}" in said[0] or f"cannot read {key_path}" in said[0]
        with client(cluster.endpoint) as c:
            assert c.get("/v1/health").json()["targets"] == 2
            assert c.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
            for i in range(4):
                r = c.put(f"/v1/objects/bkt/dir/o{i}.txt", content=f"hello {i}".encode())
                assert r.status_code == 200, r.text
            assert c.put("/v1/etl", json={"name": "upper", "spec": UPPER}).status_code == 200
            details = wait_running(c, "upper")
            assert [t["target"] for t in details["transformers"]] == ["t0", "t1"]
            assert c.get("/v1/objects/bkt/dir/o3.txt", params={"etl_name": "upper"}).content == (
                b"HELLO 3"
            )
        assert len(transformer_leaders(cluster.pid)) == 2

        # A second `up` on the same data dir is refused, the first one unharmed.
        second = subprocess.run(
            [sys.executable, "-m", "etl_runtime.local", "up", "--data-dir", str(data)]
            + ["--port", "0", "--targets", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and "another 'sluice up'" in second.stderr

        tree = descendants(cluster.pid)
        assert cluster.stop() == 0
    assert cluster.returncode == 0
    assert survivors(tree, data) == []
    assert not list((data / "etl").glob("run/*.json"))

    # Restart: same key, objects and ETLs are back, and transformed again.
    with LocalCluster(data, targets=2, token=TOKEN) as cluster:
        assert (data / "cluster-key").read_text() == key
        with client(cluster.endpoint) as c:
            names = [o["name"] for o in c.get("/v1/buckets/bkt").json()["objects"]]
            assert names == [f"dir/o{i}.txt" for i in range(4)]
            assert [e["name"] for e in c.get("/v1/etl").json()["etls"]] == ["upper"]
            wait_running(c, "upper")
            r = c.get("/v1/objects/bkt/dir/o1.txt", params={"etl_name": "upper"})
            assert r.content == b"HELLO 1"
        tree = descendants(cluster.pid)
        os.kill(cluster.pid, signal.SIGINT)  # Ctrl-C works like SIGTERM
        assert cluster.wait(90) == 0
    assert survivors(tree, data) == []


def test_hard_killed_up_still_stops_its_servers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cluster = LocalCluster(data, targets=1)
    with cluster:
        with httpx.Client(base_url=cluster.endpoint, timeout=30) as c:
            assert c.put("/v1/etl", json={"name": "upper", "spec": UPPER}).status_code == 200
            wait_running(c, "upper")
        tree = descendants(cluster.pid)
        os.kill(cluster.pid, signal.SIGKILL)  # no chance to clean up: the children must notice
        cluster.wait(10)
        deadline = time.monotonic() + 60
        while survivors(tree, data) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert survivors(tree, data) == []
