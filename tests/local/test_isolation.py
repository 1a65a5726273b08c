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

Nor can it read another bucket's objects: a target's ``buckets`` is closed to
the ETL uids, and a transformer gets the files it is sent from its target's
file broker (``storage_target/fdbroker.py``) for grants only the target can
sign (``etl/grants.py``). The hostile ETL tries the path, the directory, and
the broker with a forged grant, one signed with its own token, the victim's,
one for another object, an expired one and another target's; the victims (a
function in threads, one in worker processes, an AIStore class that takes
the file's path, a WebDataset one) still transform by object GET (the signed 307 to the
transformer), GetBatch and the target's hpush ``PUT``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import httpx
import psutil
import pytest
from aistore.sdk import Client
from aistore.sdk.etl import ETLConfig
from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer

from etl_runtime.core import auth
from etl_runtime.etl import grants
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

VICTIM_WDS = """
def transform(sample):
    sample["txt"] = sample["txt"].upper()
    return sample
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
    if "broker" in plan:
        found["broker"] = _broker(plan["broker"], mine)
    return json.dumps(found).encode()

def _broker(plan, mine):
    import hashlib, hmac, socket
    out = {"by path": _read(plan["secret"])[:80]}
    try:
        out["listing"] = sorted(os.listdir(plan["buckets"]))
    except OSError as e:
        out["listing"] = "refused: " + type(e).__name__
    exp = str(int(plan["now"]) + 60)
    forged = hmac.new(mine.encode(), ("hostile\n%s\n%s" % (plan["secret"], exp)).encode(),
                      hashlib.sha256).hexdigest()[:40]  # signed with what ETL code holds
    asks = dict(plan["asks"], **{"own token": [plan["secret"], exp + "." + forged]})
    for name, (path, grant) in asks.items():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(os.environ["SLUICE_FD_BROKER"])
            sock.send(json.dumps({"files": [[path, grant]]}).encode())
            msg, fds, _, _ = socket.recv_fds(sock, 65536, 4)
            if fds:
                out[name] = "handed: " + os.read(fds[0], 40).decode(errors="replace")
            else:
                out[name] = "refused: " + json.loads(msg)["files"][0]
        except OSError as e:
            out[name] = "error: " + type(e).__name__
        finally:
            sock.close()
    return out
"""


class FqnUpper(FastAPIServer):
    """An AIStore class that takes the object's file by path (``direct_file_access``)."""

    def transform(self, data: bytes | str, path: str, etl_args: str) -> bytes:
        if not isinstance(data, str):
            return data.upper() + b"|bytes"
        with open(data, "rb") as f:  # /proc/<pid>/fd/N: the file the target handed
            return f.read().upper() + (b"|handed" if data.startswith("/proc/") else b"|path")


cloudpickle.register_pickle_by_value(sys.modules[__name__])
WORKERS = {"SLUICE_INLINE": "0"}  # worker processes, not the server's threads


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
            sluice.etl("victim-w").init_spec(source=VICTIM, timeout=120, env=WORKERS)
            sluice.etl("victim-wds").init_spec(source=VICTIM_WDS, mode="wds", timeout=120)
            ais = Client(c.endpoint)
            ais.etl("victim-fqn").init_class(direct_file_access=True)(FqnUpper)
            for bucket in ("private", "plans"):
                ais.bucket(bucket).create(exist_ok=True)
            ais.bucket("private").object("secret.txt").get_writer().put_content(b"team b's data")
            for i in range(SECRETS):  # some on every target
                ais.bucket("private").object(f"s{i}").get_writer().put_content(secret(i))
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


SECRETS = 12


def secret(i: int) -> bytes:
    return f"team b's secret {i}".encode()


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


def test_etl_code_reaches_no_file_of_the_targets_but_their_brokers(up: LocalCluster) -> None:
    """The data group may traverse a target's data dir to its file broker's socket;
    objects, the ETL output cache and temp files stay the servers'."""
    for t in sorted((up.data_dir / "targets").iterdir()):
        assert oct(t.stat().st_mode & 0o777) == "0o710", t
        for entry in t.iterdir():
            want = 0o666 if entry.name == "fd.sock" else 0o700
            assert entry.stat().st_mode & 0o777 == want, entry
        assert (t / "fd.sock").is_socket(), t  # its file broker
    assert (up.data_dir / "cluster-key").stat().st_mode & 0o777 == 0o600


def owner_of(up: LocalCluster, bucket: str, name: str) -> str:
    """The target whose data dir holds ``bucket/name``'s file."""
    found = [
        t.name
        for t in (up.data_dir / "targets").iterdir()
        if (t / "buckets" / bucket / name).is_file()
    ]
    assert len(found) == 1, found
    return found[0]


def test_a_hostile_etl_opens_no_other_bucket_object_through_path_or_broker(
    up: LocalCluster,
) -> None:
    ais = Client(up.endpoint)
    probe = ais.bucket("plans").object("probe.json")
    probe.get_writer().put_content(b"{}")
    tid = owner_of(up, "plans", "probe.json")  # the hostile transformer beside it runs
    for i in range(SECRETS):
        ais.bucket("plans").object(f"p{i}").get_writer().put_content(b"the hostile's own")
    ours = [i for i in range(SECRETS) if owner_of(up, "plans", f"p{i}") == tid]
    theirs = [i for i in range(SECRETS) if owner_of(up, "private", f"s{i}") == tid]
    assert ours and theirs, "the probe's target holds none of the objects"
    buckets = (up.data_dir / "targets" / tid / "buckets").resolve()
    victim_file = str(buckets / "private" / f"s{theirs[0]}")
    own = str(buckets / "plans" / f"p{ours[0]}")
    key = (up.data_dir / "cluster-key").read_text().strip()
    here, there = grants.grant_key(key, tid), grants.grant_key(key, "t1" if tid == "t0" else "t0")
    old = time.time() - 2 * grants.TTL_SECONDS
    asks = {
        "forged": [victim_file, "9999999999." + "0" * 40],
        "no grant": [victim_file, None],
        "the victim's": [victim_file, grants.sign(here, "victim", victim_file)],
        "another object's": [victim_file, grants.sign(here, "hostile", own)],
        "expired": [victim_file, grants.sign(here, "hostile", victim_file, now=old)],
        "another target's": [victim_file, grants.sign(there, "hostile", victim_file)],
        "its own object": [own, grants.sign(here, "hostile", own)],  # the control
    }
    broker = {"secret": victim_file, "buckets": str(buckets), "asks": asks, "now": time.time()}
    plan = {"victim_pids": [], "targets": [], "bucket": "private", "object": "secret.txt",
            "data_dir": str(up.data_dir), "files": [], "broker": broker}  # fmt: skip
    probe.get_writer().put_content(json.dumps(plan).encode())
    found = json.loads(probe.get_reader(etl=ETLConfig("hostile")).read_all())["broker"]

    assert found["by path"] == "refused: PermissionError", found
    assert found["listing"] == "refused: PermissionError", found
    assert found["no grant"] == "refused: no grant from the target", found
    for name in ("forged", "the victim's", "another object's", "another target's", "own token"):
        assert found[name].startswith("refused: the grant is not the target's"), (name, found)
    assert found["expired"] == "refused: the grant expired; ask the gateway again", found
    assert found["its own object"] == "handed: the hostile's own", found
    assert "team b's" not in json.dumps(found)


def test_the_victims_transform_the_files_their_targets_hand_them(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    sluice = SluiceClient(up.endpoint)
    names = [f"s{i}" for i in range(SECRETS)]
    tail = {"victim": b"", "victim-w": b"", "victim-fqn": b"|handed"}
    for etl, extra in tail.items():
        for name in names[:3]:  # a GET: the target's signed 307 to the transformer
            got = ais.bucket("private").object(name).get_reader(etl=ETLConfig(etl)).read_all()
            assert got == secret(int(name[1:])).upper() + extra, (etl, name, got)
        batch = list(sluice.get_batch([("private", n) for n in names], etl_name=etl))
        assert [(b.name, b.data) for b in batch] == [
            (n, secret(int(n[1:])).upper() + extra) for n in names
        ], etl


def test_a_grant_travels_with_etl_fqn_and_nothing_opens_without_one(up: LocalCluster) -> None:
    """The direct 307 carries the grant; without it, or with another's, the transformer
    answers 403 naming the object (no path); so does the target's hpush PUT."""
    url = f"{up.endpoint}/v1/objects/private/s0"
    with httpx.Client(timeout=60, follow_redirects=False) as http:
        r = http.get(url, params={"etl_name": "victim"})
        while r.status_code == 307 and "etl_fqn" not in r.headers["location"]:
            r = http.get(r.headers["location"])
        assert r.status_code == 307, r.text
        location = httpx.URL(r.headers["location"])
        assert location.params.get(grants.PARAM), location
        assert http.get(location).content == secret(0).upper()
        fqn = location.params["etl_fqn"]
        for grant in ("", "9999999999." + "0" * 40):
            bad = http.get(location.copy_set_param(grants.PARAM, grant))
            assert bad.status_code == 403, bad.text
            body = bad.json()
            assert body["kind"] == "FileRefused" and body["object"] == "s0", body
            assert "private/s0" in body["error"] and fqn not in bad.text, body

        # the hpush PUT a target sends, with the ETL's token
        record = json.loads((up.data_dir / "etl" / "victim.json").read_text())
        key = (up.data_dir / "cluster-key").read_text().strip()
        token = auth.transformer_token(key, "victim", record["uid"])
        endpoint = str(location.copy_with(query=None)).rsplit("/private/", 1)[0]
        tid = owner_of(up, "private", "s0")
        grant = grants.sign(grants.grant_key(key, tid), "victim", fqn)
        head = {"Authorization": f"Bearer {token}"}
        for g, status in (
            (grant, 200),
            (grants.sign(grants.grant_key(key, tid), "hostile", fqn), 403),
        ):
            put = http.put(
                f"{endpoint}/private/s0",
                params={"etl_fqn": fqn, grants.PARAM: g},
                headers=head,
            )
            assert put.status_code == status, put.text
            if status == 200:
                assert put.content == secret(0).upper()
            else:
                assert put.json()["kind"] == "FileRefused" and fqn not in put.text


def tar_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_wds_victim_transforms_the_shard_its_target_hands_it(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    shard = tar_of({f"k{i}.txt": secret(i) for i in range(3)})
    ais.bucket("private").object("shard.tar").get_writer().put_content(shard)
    got = ais.bucket("private").object("shard.tar").get_reader(etl=ETLConfig("victim-wds"))
    with tarfile.open(fileobj=io.BytesIO(got.read_all())) as tar:
        out = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert out == {f"k{i}.txt": secret(i).upper() for i in range(3)}
