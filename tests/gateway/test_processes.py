"""The real entry points: ``python -m etl_runtime.storage_target`` / ``.gateway`` as processes.

Flags and environment per docs/processes.md, a token and a cluster key,
objects written and read through the gateway, a transformed read through an
ETL record the targets find in their ``file:`` registry.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import httpx

from etl_runtime.cluster.records import EtlRecord, TransformerStatus
from etl_runtime.core.spec import EtlSpec
from tests.servers import free_port, serve_in_thread, serve_process
from tests.storage_target.fakes import SOURCE, transformer_app


def test_gateway_and_targets_as_processes(tmp_path: Path) -> None:
    key = "process-test-key"
    env = {"SLUICE_CLUSTER_KEY": key, "SLUICE_TOKEN": "tok"}
    registry = tmp_path / "etl"
    registry.mkdir()
    with contextlib.ExitStack() as stack:
        targets = []
        for tid in ("t0", "t1"):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(
                serve_process(
                    [
                        "-m",
                        "etl_runtime.storage_target",
                        "--id",
                        tid,
                        "--data-dir",
                        str(tmp_path / tid),
                        "--registry",
                        f"file:{registry}",
                    ],
                    f"{url}/v1/health",
                    env={**env, "SLUICE_HOST": "127.0.0.1", "SLUICE_PORT": str(port)},
                )
            )
            targets.append(f"{tid}={url}")
        port = free_port()
        gw = f"http://127.0.0.1:{port}"
        stack.enter_context(
            serve_process(
                [
                    "-m",
                    "etl_runtime.gateway",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--state-dir",
                    str(tmp_path / "gw"),
                ],
                f"{gw}/v1/health",
                env={**env, "SLUICE_TARGETS": ",".join(targets)},
            )
        )
        c = stack.enter_context(
            httpx.Client(
                base_url=gw,
                follow_redirects=True,
                timeout=30,
                headers={"Authorization": "Bearer tok"},
            )
        )
        assert c.get("/v1/health").json()["targets"] == 2
        assert [t["alive"] for t in c.get("/v1/cluster").json()["targets"]] == [True, True]
        assert c.post("/v1/buckets/bkt", json={"action": "create-bck"}).status_code == 200
        data = os.urandom(300_000)
        assert c.put("/v1/objects/bkt/d/o.bin", content=data).status_code == 200
        assert c.get("/v1/objects/bkt/d/o.bin").content == data
        assert httpx.put(f"{gw}/v1/objects/bkt/x", content=b"x").status_code == 401

        # a transformer the targets find through their file registry
        tf = stack.enter_context(serve_in_thread(transformer_app("rev", uid="u1", key=key)))
        record = EtlRecord(
            name="rev",
            uid="u1",
            spec=EtlSpec.from_dict({"code": {"source": SOURCE}}),
            phase="Running",
            transformers=tuple(
                TransformerStatus(target=t, endpoint=tf, ready=True) for t in ("t0", "t1")
            ),
        )
        (registry / "rev.json").write_text(json.dumps(record.to_dict()))
        r = c.get("/v1/objects/bkt/d/o.bin", params={"etl_name": "rev"})
        assert r.status_code == 200 and r.content == data[::-1]
        r = c.get("/v1/objects/bkt/d/o.bin", params={"etl_name": "nope"})
        assert r.status_code == 404 and r.json()["kind"] == "EtlNotFound"
