"""The jobs framework on a real cluster (gateway + 3 targets over HTTP, one map).

A test kind, registered here (the servers run in this process), exercises
what kinds rely on: owned objects, progress, errors, peer sends with a
barrier, abort, and resume after a target stops mid-job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core import auth
from etl_runtime.gateway import create_gateway_app
from etl_runtime.jobs import JobContext, JobFailed, register_kind
from etl_runtime.storage.peers import INTERNAL_HEADER
from etl_runtime.storage_target import create_target_app
from tests.cluster.conftest import Liveness, MapCluster
from tests.gateway.conftest import DictBackend
from tests.servers import serve_in_thread
from tests.storage_target.fakes import CLUSTER_KEY, DictRegistry

pytestmark = pytest.mark.timeout(120)


async def _run(ctx: JobContext) -> None:
    bucket = ctx.spec["bucket"]
    names = [n async for n in ctx.owned_objects(bucket)]
    done = set(ctx.checkpoint.get("done", []))
    for name in names:
        if name in done:
            continue
        ctx.check()
        if name.startswith("bad"):
            ctx.error(f"{bucket}/{name}", "refused by the test kind")
            continue
        size = ctx.store.stat_object(bucket, name).size
        ctx.progress.add(objects=1, bytes=size)
        done.add(name)
        await ctx.save_checkpoint({"done": sorted(done)})
        await asyncio.sleep(float(ctx.spec.get("delay", 0)))
    # Phase 1: tell every member (itself too) which names this target had.
    for t in ctx.members:
        await ctx.send(t, {"from": ctx.target_id}, json.dumps(names).encode())
    await ctx.barrier("sent")
    got = json.loads((ctx.workdir / "got.json").read_text()) if ctx.workdir.exists() else []
    ctx.set_output(received=len(got))
    if ctx.spec.get("fail_on") == ctx.target_id:
        raise JobFailed(f"asked to fail on {ctx.target_id}")


async def _receive(
    ctx: JobContext, sender: str, meta: dict[str, Any], body: AsyncIterator[bytes]
) -> Any:
    data = b"".join([c async for c in body])
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    path = ctx.workdir / "got.json"
    got = json.loads(path.read_text()) if path.exists() else []
    got.extend(json.loads(data))
    path.write_text(json.dumps(got))
    return {"stored": len(got)}


register_kind("test-relay", _run, receive=_receive)


def _start(c: MapCluster, spec: dict[str, Any]) -> str:
    with c.client() as http:
        r = http.post("/v1/jobs", json={"kind": "test-relay", "spec": spec})
        assert r.status_code == 200, r.text
        return str(r.json()["id"])


def _wait(c: MapCluster, job_id: str, timeout: float = 60) -> dict[str, Any]:
    with c.client() as http:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = http.get(f"/v1/jobs/{job_id}").json()
            if view["state"] != "Running":
                return dict(view)
            time.sleep(0.1)
    raise AssertionError(f"job {job_id} still running")


def _cluster(c: MapCluster, n: int = 3, objects: int = 30) -> None:
    for i in range(n):
        c.add_target(f"t{i}")
    c.start_gateway()
    with c.client() as http:
        assert http.post("/v1/buckets/src", json={"action": "create-bck"}).status_code == 200
        for i in range(objects):
            assert http.put(f"/v1/objects/src/o{i:03d}", content=b"x" * (i + 1)).status_code == 200
        http.put("/v1/objects/src/bad1", content=b"?").raise_for_status()


def test_job_runs_everywhere_sends_and_meets_at_barrier(map_cluster: MapCluster) -> None:
    _cluster(map_cluster)
    job_id = _start(map_cluster, {"bucket": "src"})
    view = _wait(map_cluster, job_id)
    assert view["state"] == "Finished", view
    assert view["progress"]["objects"] == 30
    assert view["progress"]["bytes"] == sum(range(1, 31))
    assert view["error_count"] == 1 and view["errors"][0]["object"] == "src/bad1"
    # each of 3 targets received every target's list: 31 names each
    assert view["output"]["received"] == 3 * 31
    assert set(view["targets"]) == {"t0", "t1", "t2"}
    assert all(p["phases"] == ["sent"] for p in view["targets"].values())
    with map_cluster.client() as http:
        listed = http.get("/v1/jobs", params={"kind": "test-relay", "state": "Finished"}).json()
        assert [j["id"] for j in listed["jobs"]] == [job_id]
        r = http.get("/v1/jobs", params={"colour": "red"})
        assert r.status_code == 400 and "colour" in r.json()["error"]
        r = http.get("/v1/jobs/nope-1234")
        assert r.status_code == 404 and "nope-1234" in r.json()["error"]
        r = http.post("/v1/jobs", json={"kind": "nosuch", "spec": {}})
        assert r.status_code == 400 and "nosuch" in r.json()["error"]


def test_one_target_failing_fails_the_job_with_its_reason(map_cluster: MapCluster) -> None:
    _cluster(map_cluster, objects=3)
    view = _wait(map_cluster, _start(map_cluster, {"bucket": "src", "fail_on": "t1"}))
    assert view["state"] == "Failed"
    assert "asked to fail on t1" in view["reason"]


def test_abort_stops_every_target(map_cluster: MapCluster) -> None:
    _cluster(map_cluster, objects=30)
    job_id = _start(map_cluster, {"bucket": "src", "delay": 0.5})
    with map_cluster.client() as http:
        r = http.post(f"/v1/jobs/{job_id}/abort")
        assert r.status_code == 200
        view = _wait(map_cluster, job_id)
    assert view["state"] == "Aborted"
    assert view["progress"]["objects"] < 30
    assert all(p["state"] == "Aborted" for p in view["targets"].values())


def test_target_stopped_mid_job_resumes_from_its_checkpoint(map_cluster: MapCluster) -> None:
    _cluster(map_cluster, objects=30)
    job_id = _start(map_cluster, {"bucket": "src", "delay": 0.2})
    time.sleep(0.5)
    map_cluster.stop_target("t1")
    map_cluster.live.all = [t for t in map_cluster.live.all if t.id != "t1"]
    time.sleep(0.3)
    info = map_cluster.add_target("t1")
    map_cluster.cmap.update(lambda m: type(m)(**{**m.__dict__, "urls": {**m.urls, "t1": info.url}}))
    map_cluster.live.down.discard("t1")
    view = _wait(map_cluster, job_id)
    assert view["state"] == "Finished", view
    assert view["targets"]["t1"]["restarts"] == 1
    assert view["progress"]["objects"] == 30  # nothing done twice, nothing lost


async def _copy_reversed(ctx: JobContext) -> None:
    async def one(name: str) -> None:
        data = ctx.store.stat_object("src", name)
        f, _ = ctx.store.open_object("src", name)
        with f:
            body = f.read()
        size = await ctx.put_object("dst", name, body[::-1])
        ctx.progress.add(objects=1, bytes=size or data.size)

    await ctx.map(ctx.owned_objects("src"), one, workers=2)


register_kind("test-copy", _copy_reversed)


def test_without_a_cluster_map_outputs_land_at_the_gateways_owner(tmp_path: Path) -> None:
    """Kubernetes without a shared map: placement is HRW over the live targets."""
    live, registry = Liveness(), DictRegistry()
    with contextlib.ExitStack() as stack:
        for tid in ("t0", "t1", "t2"):
            app = create_target_app(tid, tmp_path / tid, registry, cluster_key=CLUSTER_KEY)
            live.all.append(TargetInfo(id=tid, url=stack.enter_context(serve_in_thread(app))))
        gw = create_gateway_app(live, DictBackend(registry), cluster_key=CLUSTER_KEY)
        with httpx.Client(
            base_url=stack.enter_context(serve_in_thread(gw)), follow_redirects=True, timeout=30
        ) as http:
            for b in ("src", "dst"):
                http.post(f"/v1/buckets/{b}", json={"action": "create-bck"}).raise_for_status()
            for i in range(20):
                http.put(f"/v1/objects/src/o{i}", content=f"object {i}".encode()).raise_for_status()
            job_id = http.post("/v1/jobs", json={"kind": "test-copy", "spec": {}}).json()["id"]
            deadline = time.monotonic() + 30
            while (view := http.get(f"/v1/jobs/{job_id}").json())["state"] == "Running":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert view["state"] == "Finished" and view["progress"]["objects"] == 20, view
            for i in range(20):  # the gateway finds each output at the owner it computes
                r = http.get(f"/v1/objects/dst/o{i}")
                assert r.status_code == 200 and r.content == f"object {i}".encode()[::-1]


def test_a_target_gone_for_good_fails_the_job_naming_it(
    map_cluster: MapCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_JOB_TARGET_TIMEOUT", "2")
    _cluster(map_cluster, objects=30)
    job_id = _start(map_cluster, {"bucket": "src", "delay": 0.3})
    time.sleep(0.3)
    map_cluster.stop_target("t2")  # never comes back
    view = _wait(map_cluster, job_id, timeout=30)
    assert view["state"] == "Failed"
    assert "'t2'" in view["reason"]
    assert view["targets"]["t2"]["state"] == "Unreachable"


def test_the_monitor_fails_a_job_nobody_reads(
    map_cluster: MapCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a job never ends it; the gateway's job monitor does, unasked: the parts on
    the targets that remain say Failed, naming the target gone, with no GET of the job."""
    monkeypatch.setenv("SLUICE_JOB_TARGET_TIMEOUT", "1")
    _cluster(map_cluster, objects=30)
    job_id = _start(map_cluster, {"bucket": "src", "delay": 0.3})
    map_cluster.stop_target("t2")  # never comes back
    headers = {INTERNAL_HEADER: auth.internal_token(CLUSTER_KEY)}
    url = next(t.url for t in map_cluster.live.all if t.id == "t0")
    deadline = time.monotonic() + 30
    part: dict[str, Any] = {}
    while time.monotonic() < deadline:
        part = httpx.get(f"{url}/v1/_jobs/{job_id}", headers=headers, timeout=10).json()
        if part["state"] != "Running":
            break
        time.sleep(0.2)
    assert part["state"] == "Failed" and "'t2'" in part["reason"], part
    assert "for more than 1s" in part["reason"], part  # the monitor's words
