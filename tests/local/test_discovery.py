"""StaticTargets: live targets from a fixed list, by probing /v1/health."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Response

from etl_runtime.cluster.local.discovery import StaticTargets, parse_targets
from etl_runtime.cluster.records import TargetInfo
from tests.servers import free_port, serve_in_thread


def health_app(state: dict[str, int]) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/health")
    def health() -> Response:
        return Response(status_code=state["status"])

    return app


def test_parse_targets() -> None:
    got = parse_targets("t0=http://127.0.0.1:9001/, t1=http://127.0.0.1:9002")
    assert got == [
        TargetInfo("t0", "http://127.0.0.1:9001"),
        TargetInfo("t1", "http://127.0.0.1:9002"),
    ]
    with pytest.raises(ValueError, match="ID=URL"):
        parse_targets("t0")
    with pytest.raises(ValueError, match="duplicate"):
        parse_targets("t0=http://a,t0=http://b")


def test_dead_target_drops_out_and_comes_back() -> None:
    state = {"status": 200}
    dead = TargetInfo("t9", f"http://127.0.0.1:{free_port()}")

    async def scenario(url: str) -> None:
        live = TargetInfo("t0", url)
        disco = StaticTargets([live, dead], interval=0.1, timeout=1.0)
        assert disco.targets() == [live, dead]  # optimistic before the first probe
        await disco.start()
        try:
            assert disco.targets() == [live]  # refused connection: out at once
            state["status"] = 503
            await asyncio.sleep(0.6)
            assert disco.targets() == []
            assert not disco.is_alive("t0")
            state["status"] = 200
            await asyncio.sleep(0.4)
            assert disco.targets() == [live]
            assert disco.all_targets() == [live, dead]
        finally:
            await disco.stop()

    with serve_in_thread(health_app(state)) as url:
        asyncio.run(scenario(url))


def test_stopped_server_drops_out() -> None:
    async def scenario() -> None:
        state = {"status": 200}
        with serve_in_thread(health_app(state)) as url:
            disco = StaticTargets([TargetInfo("t0", url)], interval=0.1, timeout=1.0)
            await disco.start()
            assert len(disco.targets()) == 1
        await asyncio.sleep(0.5)
        try:
            assert disco.targets() == []
        finally:
            await disco.stop()

    asyncio.run(scenario())
