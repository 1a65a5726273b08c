"""Offline transforms and ETL pipelines on a real local cluster (``sluice up``, 2 targets).

Real transformers (the project's webserver running user code), real
processes, a real ``kill -9`` of a target mid-job; outputs read back through
the SDK and, for the WebDataset pipeline, with the ``webdataset`` library.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
import webdataset as wds

from etl_runtime.local import LocalCluster
from etl_runtime.sdk import Client, Job, JobError
from tests.local.test_up import wait_running
from tests.local.test_up_restarts import healthy, server, wait_for

pytestmark = [
    pytest.mark.timeout(300),
]


def _code(src: str, mode: str = "object") -> dict:
    return {"mode": mode, "workers": 1, "code": {"source": src}}


ETLS = {
    "up": _code("def transform(data):\n    return data.upper()\n"),
    "rev": _code("def transform(data):\n    return data[::-1]\n"),
    # appends "!"; refuses objects starting with "bad"; slow for objects starting with "slow"
    "bang": _code(
        "import time\n"
        "def transform(data):\n"
        "    if b'baddab' in data.lower():\n"
        "        raise ValueError('bad input')\n"
        "    if data.startswith(b'slow'):\n"
        "        time.sleep(0.05)\n"
        "    return data + b'!'\n"
    ),
    "wup": _code("def transform(s):\n    s['txt'] = s['txt'].upper()\n    return s\n", mode="wds"),
    "wtag": _code("def transform(s):\n    s['tag'] = b'tagged'\n    return s\n", mode="wds"),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("jobs") / "data", targets=2) as c:
        http = httpx.Client(base_url=c.endpoint, timeout=30)
        for name, spec in ETLS.items():
            assert http.put("/v1/etl", json={"name": name, "spec": spec}).status_code == 200
        for name in ETLS:
            wait_running(http, name)
        http.close()
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.endpoint) as c:
        yield c


def _fill(client: Client, bucket: str, items: dict[str, bytes]) -> None:
    b = client.bucket(bucket).create()
    for name, data in items.items():
        b.object(name).put_content(data)


def test_pipeline_inline_applies_each_etl_in_order(client: Client) -> None:
    _fill(client, "inl", {"a.txt": b"abc"})
    obj = client.bucket("inl").object("a.txt")
    assert obj.get_bytes(etl_name=["up", "rev", "bang"]) == b"CBA!"
    assert obj.get_bytes(etl_name=["rev", "bang", "up"]) == b"CBA!"
    assert obj.get_bytes(etl_name=["bang", "rev"]) == b"!cba"
    # AIStore's wire shape, through the gateway's redirect
    r = httpx.get(
        f"{client.endpoint}/v1/objects/inl/a.txt",
        params={"etl_name": "up", "etl_pipeline": "rev,bang"},
        follow_redirects=True,
    )
    assert r.status_code == 200 and r.content == b"CBA!"


def test_pipeline_refuses_unknown_etl_and_mode_mismatch_up_front(client: Client) -> None:
    _fill(client, "inl2", {"a.txt": b"abc"})
    url = f"{client.endpoint}/v1/objects/inl2/a.txt"
    r = httpx.get(url, params={"etl_name": "up", "etl_pipeline": "rev,nosuch"})
    assert r.status_code == 404 and "'nosuch'" in r.json()["error"]
    assert r.json()["etl"] == "nosuch"
    r = httpx.get(url, params={"etl_name": "up", "etl_pipeline": "wup"})
    assert r.status_code == 400 and "'wup'" in r.json()["error"] and "mode" in r.json()["error"]
    with pytest.raises(Exception, match="nosuch"):
        client.bucket("inl2").transform(["up", "nosuch"], to_bucket="never")


def test_offline_pipeline_with_skip_existing_is_incremental(client: Client) -> None:
    items = {f"d/{i:03d}.txt": f"item {i}".encode() for i in range(40)}
    items["d/bad.txt"] = b"baddab one"
    items["other.txt"] = b"not under the prefix"
    _fill(client, "src", items)
    job = client.bucket("src").transform(
        ["up", "rev", "bang"], to_bucket="dst", prefix="d/", ext={"txt": "out"}
    )
    assert isinstance(job, Job)
    status = job.wait(timeout=120)
    assert status["progress"]["objects"] == 40
    assert status["error_count"] == 1
    assert status["errors"][0]["object"] == "src/d/bad.txt"
    assert "bad input" in status["errors"][0]["error"]
    dst = client.bucket("dst")
    names = sorted(o.name for o in dst.list_objects())
    assert names == sorted(f"d/{i:03d}.out" for i in range(40))
    assert dst.object("d/007.out").get_bytes() == b"7 METI!"
    assert set(status["targets"]) == {"t0", "t1"}
    assert all(p["progress"]["objects"] > 0 for p in status["targets"].values())

    again = (
        client.bucket("src")
        .transform(
            ["up", "rev", "bang"],
            to_bucket="dst",
            prefix="d/",
            ext={"txt": "out"},
            skip_existing=True,
        )
        .wait(timeout=120)
    )
    assert again["progress"]["objects"] == 0  # nothing transformed twice
    assert again["progress"]["skipped"] == 40
    # an input changed since: only it is transformed again
    client.bucket("src").object("d/003.txt").put_content(b"changed")
    time.sleep(1.1)  # Last-Modified has whole seconds
    client.bucket("src").object("d/004.txt").put_content(b"changed too")
    third = (
        client.bucket("src")
        .transform(
            ["up", "rev", "bang"],
            to_bucket="dst",
            prefix="d/",
            ext={"txt": "out"},
            skip_existing=True,
        )
        .wait(timeout=120)
    )
    assert third["progress"]["objects"] >= 1 and third["progress"]["objects"] <= 2
    assert dst.object("d/004.out").get_bytes() == b"OOT DEGNAHC!"


def test_stop_on_first_error_fails_the_job_with_the_object(client: Client) -> None:
    _fill(client, "strict", {"bad.txt": b"baddab", "good.txt": b"good"})
    job = client.bucket("strict").transform("bang", to_bucket="strict-out", continue_on_error=False)
    with pytest.raises(JobError, match="strict/bad.txt") as e:
        job.wait(timeout=60)
    assert e.value.state == "Failed"


def _shard(n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(n):
            data = f"sample {i}".encode()
            info = tarfile.TarInfo(f"s{i:03d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_offline_wds_pipeline_output_reads_with_webdataset(client: Client) -> None:
    _fill(client, "shards", {f"shard-{i}.tar": _shard(5) for i in range(4)})
    status = (
        client.bucket("shards")
        .transform(["wup", "wtag"], to_bucket="shards-out", template="shard-{0..2}.tar")
        .wait(timeout=120)
    )
    assert status["progress"]["objects"] == 3
    urls = client.bucket("shards-out").list_urls()
    assert len(urls) == 3
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(samples) == 15
    assert {s["txt"] for s in samples} == {f"SAMPLE {i}".encode() for i in range(5)}
    assert all(s["tag"] == b"tagged" for s in samples)


def test_jobs_listing_and_abort(client: Client) -> None:
    _fill(client, "slow", {f"o{i:03d}": b"slow" for i in range(200)})
    job = client.bucket("slow").transform("bang", to_bucket="slow-out", num_workers=1)
    listed = client.jobs(kind="etl-bck", state="Running")
    assert job.id in [j["id"] for j in listed]
    job.abort()
    with pytest.raises(JobError) as e:
        job.wait(timeout=30)
    assert e.value.state == "Aborted"
    assert e.value.last_status["progress"]["objects"] < 200
    assert job.id in [j["id"] for j in client.jobs(state="Aborted")]
    r = httpx.get(f"{client.endpoint}/v1/jobs", params={"sate": "Running"})
    assert r.status_code == 400 and "sate" in r.json()["error"]


def test_job_survives_a_target_kill(cluster: LocalCluster, client: Client) -> None:
    _fill(client, "big", {f"o{i:03d}": b"slow %d" % i for i in range(120)})
    job = client.bucket("big").transform("bang", to_bucket="big-out", num_workers=1)
    wait_for(
        lambda: job.status()["targets"]["t1"]["progress"]["objects"] >= 5, 60, "progress", cluster
    )
    t1 = server(cluster, "etl_runtime.storage_target", "t1")
    t1_url = next(t["url"] for t in client.cluster()["targets"] if t["id"] == "t1")
    t1.kill()  # SIGKILL: no chance to save anything more
    psutil.wait_procs([t1], timeout=10)
    wait_for(lambda: healthy(t1_url), 60, "t1 back", cluster)
    status = job.wait(timeout=180)
    assert status["targets"]["t1"]["restarts"] == 1
    assert status["error_count"] == 0, status["errors"][:5]
    out = client.bucket("big-out")
    assert sorted(o.name for o in out.list_objects()) == [f"o{i:03d}" for i in range(120)]
    for i in (0, 57, 119):
        assert out.object(f"o{i:03d}").get_bytes() == b"slow %d!" % i
    assert status["progress"]["objects"] + status["progress"]["skipped"] >= 120
    assert status["error_count"] == 0


def test_cli_transform_and_job_commands(
    cluster: LocalCluster, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from etl_runtime import cli

    _fill(client, "clisrc", {"a.txt": b"abc", "b.txt": b"xyz"})
    ep = ["--endpoint", cluster.endpoint]
    rc = cli.main([*ep, "transform", "clisrc", "clidst", "--etl", "up,bang", "--wait"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Finished" in out.out and "2 objects" in out.out
    assert client.bucket("clidst").object("a.txt").get_bytes() == b"ABC!"
    job_id = out.out.split()[1]
    assert cli.main([*ep, "job", "ls", "--kind", "etl-bck", "--state", "Finished"]) == 0
    assert job_id in capsys.readouterr().out
    assert cli.main([*ep, "job", "show", job_id]) == 0
    assert "t0:" in capsys.readouterr().out
    assert cli.main([*ep, "job", "wait", "etl-bck-00000000"]) == 1
    assert "etl-bck-00000000" in capsys.readouterr().err


def test_official_aistore_sdk_transform_call(cluster: LocalCluster, client: Client) -> None:
    from aistore.sdk import Client as AisClient

    _fill(client, "aissrc", {"p/a.jpg": b"abc", "p/b.jpg": b"def", "q.jpg": b"not me"})
    ais = AisClient(cluster.endpoint)
    job_id = ais.bucket("aissrc").transform(
        "up",
        to_bck=ais.bucket("aisdst"),
        prefix_filter="p/",
        ext={"jpg": "txt"},
        etl_pipeline=["bang"],
    )
    status = client.job(job_id).wait(timeout=60)
    assert status["progress"]["objects"] == 2
    assert client.bucket("aisdst").object("p/a.txt").get_bytes() == b"ABC!"
