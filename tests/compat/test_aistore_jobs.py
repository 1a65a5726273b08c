"""The official ``aistore`` SDK's job, cluster-map and direct-read calls against ``sluice up``.

``Job.wait()``/``status()``/``get_details()`` of offline transforms and dSort
jobs, running and finished; ``Cluster.is_ready()`` and the Smap; direct reads
(the SDK places objects itself, with AIStore's HRW, and the target that gets a
read it does not own redirects to the owner). docs/aistore.md.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from etl_runtime import Client as SluiceClient
from etl_runtime.cluster.clustermap import hrw_order
from etl_runtime.local import LocalCluster
from tests.cluster.test_pause import target_pid
from tests.dsort.shards import write_shards

aistore = pytest.importorskip("aistore")
from aistore.sdk import Client  # noqa: E402
from aistore.sdk.errors import ErrObjNotFound  # noqa: E402
from aistore.sdk.etl import ETLConfig  # noqa: E402

pytestmark = pytest.mark.timeout(300)
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def upper(data: bytes) -> bytes:
    return data.upper()


def slow_upper(data: bytes) -> bytes:
    import time

    time.sleep(0.4)
    return data.upper()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("aisjobs") / "data", targets=2) as c:
        sluice = SluiceClient(c.endpoint)
        sluice.etl("upcase").init_code(transform=upper)
        sluice.etl("slowup").init_code(transform=slow_upper)
        yield c


def fill(ais: Client, bucket: str, count: int) -> None:
    bck = ais.bucket(bucket)
    bck.create(exist_ok=True)
    for i in range(count):
        bck.object(f"o{i:02d}.txt").get_writer().put_content(f"object {i}".encode())


def test_is_ready_smap_and_direct_reads(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    cluster = ais.cluster()
    assert cluster.is_ready()
    smap = cluster.get_info()
    assert sorted(smap.tmap) == ["t0", "t1"]
    assert all(n.daemon_type == "target" and n.flags == 0 for n in smap.tmap.values())
    assert smap.proxy_si.daemon_type == "proxy" and list(smap.pmap) == ["gateway"]
    assert cluster.get_primary_url() == up.endpoint
    assert int(smap.version) >= 1

    fill(ais, "direct", 16)
    bck = ais.bucket("direct")
    placed_elsewhere = 0
    for i in range(16):
        obj = bck.object(f"o{i:02d}.txt")
        sdk_pick = smap.get_target_for_object(obj.uname).daemon_id
        placed_elsewhere += sdk_pick != hrw_order(["t0", "t1"], f"direct/{obj.name}")[0]
        assert obj.get_reader(direct=True).read_all() == f"object {i}".encode()
    # the SDK's placement is AIStore's, not Sluice's: some reads took the target's 307
    assert 0 < placed_elsewhere < 16
    obj = bck.object("o03.txt")
    assert obj.get_reader(direct=True, etl=ETLConfig("upcase")).read_all() == b"OBJECT 3"
    assert obj.get_reader(direct=True, byte_range="bytes=2-4").read_all() == b"jec"
    assert obj.get_reader(direct=True).head().size == len(b"object 3")
    with pytest.raises(ErrObjNotFound):
        bck.object("nope").get_reader(direct=True).read_all()


def test_what_values_not_answered_are_400(up: LocalCluster) -> None:
    with httpx.Client(base_url=up.endpoint, timeout=30) as http:
        for path, what in (("/v1/cluster", "bogus"), ("/v1/daemon", "snode")):
            r = http.get(path, params={"what": what})
            assert r.status_code == 400 and r.json()["kind"] == "InvalidRequest", r.text
            assert repr(what) in r.json()["error"] and r.json()["what"] == what
        r = http.get("/v1/daemon")
        assert r.status_code == 400 and "what=" in r.json()["error"]
        r = http.put("/v1/cluster", json={"action": "start", "value": {"Kind": "lru"}})
        assert r.status_code == 400 and "'start'" in r.json()["error"]
        query = {"ID": "etl-bck-00000000"}
        r = http.request("GET", "/v1/cluster", params={"what": "status"}, json=query)
        assert r.status_code == 404 and r.json()["kind"] == "JobNotFound"
        view = http.get("/v1/cluster").json()  # Sluice's own view, as before
        assert view["members"] == ["t0", "t1"] and "targets" in view
        assert http.get("/v1/health", params={"prr": "true"}).status_code == 200
        assert http.get("/v1/health", params={"nope": "1"}).status_code == 400


def test_transform_job_finished(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "tsrc", 6)
    job_id = ais.bucket("tsrc").transform("upcase", to_bck=ais.bucket("tdst"))
    result = ais.job(job_id).wait(timeout=60, verbose=False)  # resolves the kind by id
    assert result.success and not result.error and result.end_time is not None
    job = ais.job(job_id, job_kind="etl-bck")
    assert job.wait(timeout=60, verbose=False).success  # with the kind: no 60 s timeout
    status = job.status()
    assert status.uuid == job_id and status.end_time > 0 and not status.aborted
    assert status.err == ""
    details = job.get_details()
    assert sorted(details.root) == ["t0", "t1"]
    snaps = details.list_snapshots()
    assert {s.kind for s in snaps} == {"etl-bck"} and all(s.is_idle for s in snaps)
    assert sum(s.stats.objects for s in snaps if s.stats) == 6
    assert all(s.end_time != GO_ZERO_TIME for s in snaps)
    assert {s.source_bck.name for s in snaps if s.source_bck} == {"tsrc"}
    assert {s.destination_bck.name for s in snaps if s.destination_bck} == {"tdst"}
    assert job.wait_for_idle(timeout=30, verbose=False).success
    assert job.get_total_time() is not None
    assert ais.bucket("tdst").object("o04.txt").get_reader().read_all() == b"OBJECT 4"
    assert job_id in [s.uuid for s in ais.cluster().list_jobs_status(job_kind="etl-bck")]
    assert not any(job_id in j for j in ais.cluster().list_running_jobs())


def test_transform_job_running_then_done_and_aborted(up: LocalCluster) -> None:
    ais = Client(up.endpoint)
    fill(ais, "ssrc", 8)
    job_id = ais.bucket("ssrc").transform("slowup", to_bck=ais.bucket("sdst"), num_workers=1)
    job = ais.job(job_id)
    status = job.status()
    assert status.uuid == job_id and status.end_time == 0 and not status.aborted
    snaps = job.get_details().list_snapshots()
    assert snaps and all(s.end_time == GO_ZERO_TIME and not s.is_idle for s in snaps)
    assert f"etl-bck[{job_id}]" in ais.cluster().list_running_jobs(job_kind="etl-bck")
    result = job.wait(timeout=60, verbose=False)
    assert result.success, result
    assert ais.bucket("sdst").object("o07.txt").get_reader().read_all() == b"OBJECT 7"

    job_id = ais.bucket("ssrc").transform("slowup", to_bck=ais.bucket("sdst2"), num_workers=1)
    job = ais.job(job_id, job_kind="etl-bck")
    job.abort()
    result = job.wait(timeout=30, verbose=False)
    assert not result.success and "aborted" in (result.error or ""), result
    status = job.status()
    assert status.aborted and status.end_time > 0
    assert all(s.aborted and s.abort_err for s in job.get_details().list_snapshots())


def test_dsort_job_running_and_finished(up: LocalCluster, tmp_path: Path) -> None:
    ais = Client(up.endpoint)
    bck = ais.bucket("images")
    bck.create(exist_ok=True)
    write_shards(tmp_path / "shards", shards=4, per_shard=10)
    for f in sorted((tmp_path / "shards").iterdir()):
        bck.object(f.name).get_writer().put_file(str(f))
    spec = {
        "extension": ".tar",
        "bck": {"name": "images", "provider": "ais"},
        "input_format": "shard-{000000..000003}",
        "output_format": "shuffled-%06d.tar",
        "output_shard_size": "20KB",
        "algorithm": {"kind": "shuffle", "seed": "7"},
        "output_bck": {"name": "shuffled", "provider": "ais"},
    }
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    job_id = ais.dsort().start(spec_file)
    pid = target_pid(up.data_dir, "t1")
    os.kill(pid, signal.SIGSTOP)  # the job cannot finish while t1 is frozen
    try:
        job = ais.job(job_id)
        status = job.status()
        assert status.uuid == job_id and status.end_time == 0 and not status.aborted
        snaps = job.get_details().root
        assert snaps["t0"][0].kind == "dsort" and snaps["t0"][0].end_time == GO_ZERO_TIME
        assert snaps["t0"][0].source_bck.name == "images"
    finally:
        os.kill(pid, signal.SIGCONT)
    result = job.wait(timeout=90, verbose=False)
    assert result.success, result
    status = ais.job(job_id, job_kind="dsort").status()
    assert status.end_time > 0 and not status.aborted
    snaps = job.get_details().list_snapshots()
    assert len(snaps) == 2 and all(s.end_time != GO_ZERO_TIME and not s.aborted for s in snaps)
    assert {s.destination_bck.name for s in snaps if s.destination_bck} == {"shuffled"}
    assert ais.job(job_id, job_kind="dsort").wait(timeout=30, verbose=False).success
