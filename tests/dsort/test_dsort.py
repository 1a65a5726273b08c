"""The seed's dSort workflow, scaled down, on a gateway + 3 targets over real HTTP.

Shards of real JPEGs are written with ``webdataset.ShardWriter`` and uploaded;
the seed's spec shuffles them into ~40 KB shards; the output is read back
through the gateway with ``webdataset``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import webdataset as wds

from tests.cluster.conftest import MapCluster
from tests.dsort.shards import read_samples, write_shards

pytestmark = pytest.mark.timeout(180)

SPEC: dict[str, Any] = {
    "extension": ".tar",
    "bck": {"name": "images", "provider": "ais"},
    "input_format": "shard-{000000..000005}",
    "output_format": "shuffled-%06d.tar",
    "output_shard_size": "40KB",
    "algorithm": {"kind": "shuffle", "seed": "1234"},
    "output_bck": {"name": "shuffled", "provider": "ais"},
    "description": "shuffle the converted shards",
}


def start(http: httpx.Client, spec: dict[str, Any]) -> str:
    r = http.post("/v1/dsort", json=spec)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def wait(http: httpx.Client, job_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = http.get(f"/v1/jobs/{job_id}").json()
        if view["state"] != "Running":
            return dict(view)
        time.sleep(0.1)
    raise AssertionError(f"dsort job {job_id} still running")


def output(http: httpx.Client, bucket: str) -> list[tuple[str, bytes]]:
    names = [e["name"] for e in http.get(f"/v1/buckets/{bucket}").json()["objects"]]
    return [(n, http.get(f"/v1/objects/{bucket}/{n}").content) for n in sorted(names)]


@pytest.fixture
def cluster(map_cluster: MapCluster, tmp_path: Path) -> tuple[MapCluster, dict]:
    for i in range(3):
        map_cluster.add_target(f"t{i}")
    map_cluster.start_gateway()
    samples = write_shards(tmp_path / "shards", shards=6, per_shard=30)
    with map_cluster.client() as http:
        http.post("/v1/buckets/images", json={"action": "create-bck"}).raise_for_status()
        for name in samples:
            data = (tmp_path / "shards" / name).read_bytes()
            http.put(f"/v1/objects/images/{name}", content=data).raise_for_status()
    return map_cluster, samples


def run(c: MapCluster, spec: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    with c.client() as http:
        view = wait(http, start(http, spec))
        assert view["state"] == "Finished", view
        return view, output(http, spec["output_bck"]["name"])


def keys_of(shards: list[tuple[str, bytes]]) -> list[str]:
    return [k for _n, data in shards for k, _f in read_samples(data)]


def test_seed_shuffle_is_global_complete_sized_and_reproducible(
    cluster: tuple[MapCluster, dict],
) -> None:
    c, samples = cluster
    view, shards = run(c, SPEC)
    every = {k: f for recs in samples.values() for k, f in recs.items()}
    input_order = [k for name in sorted(samples) for k in samples[name]]

    # every record exactly once, byte for byte, never split
    got = [(k, f) for _n, data in shards for k, f in read_samples(data)]
    assert sorted(k for k, _f in got) == sorted(every)
    assert all(every[k] == f for k, f in got)
    keys = [k for k, _f in got]
    assert keys != input_order
    # a global shuffle: the first output shard mixes records from several input shards
    first = {int(k[6:]) // 30 for k, _f in read_samples(shards[0][1])}
    assert len(first) >= 3

    # sizes: at least 40 KB, the last excepted
    assert [n for n, _d in shards] == [f"shuffled-{i:06d}.tar" for i in range(len(shards))]
    for _n, data in shards[:-1]:  # closed once 40 KB is reached: at most a record over
        assert 40_000 <= len(data) <= 50_000, len(data)
    assert view["output"]["shards"] == len(shards)
    assert view["progress"]["records"] == len(every) == view["output"]["records"]

    # webdataset reads every output shard through the gateway
    urls = [f"{c.url}/v1/objects/shuffled/{n}" for n, _d in shards]
    ds = wds.WebDataset(urls, shardshuffle=False).decode("pil")
    seen = [(s["__key__"], s["jpg"].size, int(s["cls"])) for s in ds]
    assert [k for k, _s, _c in seen] == keys
    assert all(size == (40, 40) for _k, size, _c in seen)

    # each output shard was built by the target that owns its name
    cmap = c.cmap.get()
    for name, _d in shards:
        owner = cmap.owners("shuffled", name)[0]
        assert name in c.objects_on(owner, "shuffled")

    # the same seed gives the same shards again; another seed another order
    again = {**SPEC, "output_bck": {"name": "again"}}
    _v, shards2 = run(c, again)
    assert shards2 == shards
    other = {**SPEC, "output_bck": {"name": "other"}, "algorithm": {"kind": "shuffle", "seed": "9"}}
    _v, shards3 = run(c, other)
    assert keys_of(shards3) != keys and sorted(keys_of(shards3)) == sorted(keys)


def test_alphanumeric_and_none_orders(cluster: tuple[MapCluster, dict]) -> None:
    c, samples = cluster
    input_order = [k for name in sorted(samples) for k in samples[name]]
    none = {**SPEC, "algorithm": {"kind": "none"}, "output_bck": {"name": "resharded"}}
    none["create_concurrency_max_limit"] = 1  # one shard at a time: the same output
    none["extract_concurrency_max_limit"] = 1
    none["output_shard_size"] = "100KB"
    _v, shards = run(c, none)
    assert keys_of(shards) == input_order
    assert all(abs(len(d) - 100_000) <= 5_000 for _n, d in shards[:-1])
    alpha = {
        **SPEC,
        "input_format": {"objnames": sorted(samples)[::-1]},
        "algorithm": {"kind": "alphanumeric", "decreasing": True},
        "output_bck": {"name": "sorted"},
        "output_format": "sorted-{000..999}",
    }
    _v, shards = run(c, alpha)
    assert keys_of(shards) == sorted(input_order, reverse=True)
    assert shards[0][0] == "sorted-000.tar"


def test_bad_spec_is_a_400_naming_the_field(cluster: tuple[MapCluster, dict]) -> None:
    c, _samples = cluster
    with c.client() as http:
        for change, field in [
            ({"output_shard_size": "huge"}, "output_shard_size"),
            ({"algorithm": {"kind": "random"}}, "algorithm.kind"),
            ({"output_format": "out.tar"}, "output_format"),
            ({"colour": "red"}, "colour"),
        ]:
            r = http.post("/v1/dsort", json={**SPEC, **change})
            assert r.status_code == 400, r.text
            assert r.json()["field"] == field and field in r.json()["error"]
        r = http.post("/v1/dsort", json={**SPEC, "bck": {"name": "nosuch"}})
        assert r.status_code == 404 and "nosuch" in r.json()["error"]
        r = http.post("/v1/dsort", content=b"{not json")
        assert r.status_code == 400


def test_missing_input_shard_fails_the_job_naming_it(cluster: tuple[MapCluster, dict]) -> None:
    c, _samples = cluster
    spec = {**SPEC, "input_format": "shard-{000000..000006}", "output_bck": {"name": "missing-out"}}
    spec["missing_shards"] = "abort"  # the default is AIStore's: ignore
    with c.client() as http:
        view = wait(http, start(http, spec))
        assert view["state"] == "Failed"
        assert "images/shard-000006.tar" in view["reason"]
        http.put("/v1/objects/images/shard-000006.tar", content=b"garbage" * 200)
        view = wait(http, start(http, spec))
        assert view["state"] == "Failed"
        assert "shard-000006.tar" in view["reason"] and "not a valid tar" in view["reason"]
    # with missing_shards: ignore the rest is sorted
    names = [f"shard-{i:06d}.tar" for i in (0, 1, 7)]
    spec = {**SPEC, "input_format": {"objnames": names}, "missing_shards": "ignore"}
    spec["output_bck"] = {"name": "ignored"}
    _v, shards = run(c, spec)
    assert len(keys_of(shards)) == 60
    # ... and so it is with no missing_shards at all (AIStore's default)
    spec = {**SPEC, "input_format": {"objnames": names}, "output_bck": {"name": "default"}}
    _v, shards = run(c, spec)
    assert len(keys_of(shards)) == 60


def test_official_aistore_sdk_starts_and_waits(
    cluster: tuple[MapCluster, dict], tmp_path: Path
) -> None:
    from aistore.sdk import Client

    c, samples = cluster
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({**SPEC, "output_bck": {"name": "via-ais"}}))
    dsort = Client(c.url).dsort()
    job_id = dsort.start(spec_file)
    assert job_id.startswith("dsort-")
    result = dsort.wait(timeout=90, verbose=False)
    assert result.success, result
    info = dsort.get_job_info()
    assert set(info) == {"t0", "t1", "t2"}
    assert sum(int(i.objects) for i in info.values()) >= 1
    dsort.abort()  # a finished job stays finished
    with c.client() as http:
        r = http.delete("/v1/sort/abort", params={"uuid": job_id})
        assert r.json()["state"] == "Finished"
        assert http.delete("/v1/sort/abort").status_code == 400
        assert http.delete("/v1/sort/abort", params={"uuid": "dsort-nope"}).status_code == 404
    with c.client() as http:
        assert len(keys_of(output(http, "via-ais"))) == 6 * 30
        # AIStore's SDK refuses nothing it sends, and Sluice refuses what it cannot do
        r = http.post("/v1/sort", json={**SPEC, "ekm_file": "http://x/ekm.json"})
        assert r.status_code == 400 and r.json()["field"] == "ekm_file"


def test_cli_starts_a_dsort_and_prints_the_job_id(
    cluster: tuple[MapCluster, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from etl_runtime.cli.commands import main

    c, _samples = cluster
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({**SPEC, "output_bck": {"name": "via-cli"}}))
    assert main(["--endpoint", c.url, "dsort", "start", "-f", str(spec_file), "--wait"]) == 0
    out, err = capsys.readouterr()
    job_id = out.strip()
    assert job_id.startswith("dsort-") and "Finished" in err
    with c.client() as http:
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "Finished"
        assert len(keys_of(output(http, "via-cli"))) == 6 * 30
    bad = {**SPEC, "algorithm": {"kind": "bogo"}}
    assert main(["--endpoint", c.url, "dsort", "start", json.dumps(bad)]) == 1
    assert "algorithm.kind" in capsys.readouterr().err
    assert main(["--endpoint", c.url, "dsort", "start", "-f", str(tmp_path / "no.json")]) == 1
    assert "no.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dsort", "--help"])
    assert "shuffled-%06d.tar" in capsys.readouterr().out


def test_target_restart_mid_job_resumes_to_the_same_output(
    cluster: tuple[MapCluster, dict],
) -> None:
    c, samples = cluster
    with c.client() as http:
        view = wait(http, start(http, {**SPEC, "output_bck": {"name": "before"}}))
        assert view["state"] == "Finished"
        expected = output(http, "before")
        job_id = start(http, {**SPEC, "output_bck": {"name": "after"}})
        c.stop_target("t1")
        c.live.all = [t for t in c.live.all if t.id != "t1"]
        info = c.add_target("t1")
        c.cmap.update(lambda m: type(m)(**{**m.__dict__, "urls": {**m.urls, "t1": info.url}}))
        c.live.down.discard("t1")
        view = wait(http, job_id)
        assert view["state"] == "Finished", view
        assert view["targets"]["t1"]["restarts"] == 1
        assert output(http, "after") == expected


def test_sdk_dsort_returns_a_job(cluster: tuple[MapCluster, dict]) -> None:
    from etl_runtime.sdk import Client, JobError, SluiceError

    c, _samples = cluster
    client = Client(c.url)
    job = client.dsort({**SPEC, "output_bck": {"name": "via-sdk"}})
    status = job.wait(timeout=90)
    assert status["state"] == "Finished" and status["kind"] == "dsort"
    assert status["output"]["total"] == status["output"]["shards"] == status["progress"]["objects"]
    assert status["output"]["seed"] == "1234"
    names = [o.name for o in client.bucket("via-sdk").list_objects()]
    assert len(names) == status["output"]["shards"]
    with pytest.raises(SluiceError) as e:
        client.dsort({**SPEC, "output_shard_size": "-1"})
    assert e.value.status == 400 and "output_shard_size" in str(e.value)
    missing = {"input_format": "nope-{0..1}", "missing_shards": "abort"}
    bad = client.dsort({**SPEC, **missing, "output_bck": {"name": "bad-out"}})
    with pytest.raises(JobError, match=r"images/nope-[01]\.tar does not exist"):
        bad.wait(timeout=90)
    # a shuffle without a seed gets one, shown in the job, so it can be repeated
    job = client.dsort({**SPEC, "algorithm": {"kind": "shuffle"}, "output_bck": {"name": "seeded"}})
    seed = job.wait(timeout=90)["spec"]["algorithm"]["seed"]
    assert seed and job.status()["output"]["seed"] == seed
