"""LocalEtlBackend: ETL records in, transformer processes out, status back.

Runs real transformer processes (``python -m etl_runtime.webserver`` once it
exists, else a stand-in speaking the same start-up contract) and checks what
a user of the gateway or a target would see: phases, endpoints in the record
file, processes that appear and disappear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from etl_runtime.cluster.local.registry import FileRegistry
from etl_runtime.cluster.records import EtlRecord
from etl_runtime.core import auth
from etl_runtime.core.spec import CodeSpec, EtlSpec
from etl_runtime.local.controller import LocalEtlBackend
from tests.local.conftest import STANDIN, FakeTargets, pid_gone, transformer_pids, wait_until

KEY = "k" * 64


def spec(source: str = "def transform(data):\n    return data.upper()\n", **kw) -> EtlSpec:
    return EtlSpec(code=CodeSpec(source=source), workers=1, **kw)


@contextlib.asynccontextmanager
async def running(
    state: Path, targets: FakeTargets, command: tuple[str, ...]
) -> AsyncIterator[LocalEtlBackend]:
    backend = LocalEtlBackend(state, targets, KEY, interval=0.2, grace=5.0, command=command)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def on_disk(state: Path, name: str) -> EtlRecord | None:
    return FileRegistry(state).get(name)


def must(state: Path, name: str) -> EtlRecord:
    rec = on_disk(state, name)
    assert rec is not None, f"no record for {name}"
    return rec


async def phase_is(state: Path, name: str, phase: str, ready: int | None = None) -> None:
    def check() -> bool:
        rec = on_disk(state, name)
        if rec is None or rec.phase != phase:
            return False
        return ready is None or rec.ready_count == ready

    try:
        await wait_until(check, timeout=90, what=f"{name} {phase}")
    except AssertionError:
        rec = on_disk(state, name)
        raise AssertionError(f"{name} not {phase}: {rec and rec.to_dict()}") from None


def endpoints(state: Path, name: str) -> dict[str, str | None]:
    rec = on_disk(state, name)
    assert rec is not None
    return {t.target: t.endpoint for t in rec.transformers}


async def health(endpoint: str) -> int:
    async with httpx.AsyncClient(timeout=5) as c:
        return (await c.get(f"{endpoint}/health")).status_code


def test_lifecycle_init_change_stop_start_delete(tmp_path: Path, transformer_command) -> None:
    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0", "t1"]), transformer_command) as be:
            rec = await be.init("upper", spec())
            assert rec.phase == "Initializing" and len(rec.uid) == 32
            assert [(t.target, t.ready) for t in rec.transformers] == [("t0", False), ("t1", False)]
            await phase_is(state, "upper", "Running", ready=2)
            first = endpoints(state, "upper")
            assert sorted(first) == ["t0", "t1"]
            assert all(ep and ep.startswith("http://127.0.0.1:") for ep in first.values())
            assert {await health(ep) for ep in first.values() if ep} == {200}
            pids = transformer_pids("upper")
            assert len(pids) == 2
            assert (state / "logs" / "etl-upper-t0.log").exists()

            # A spec change replaces every transformer; the uid (and so the token) stays.
            rec2 = await be.init("upper", spec("def transform(data):\n    return data[::-1]\n"))
            assert rec2.uid == rec.uid
            await wait_until(lambda: transformer_pids("upper").isdisjoint(pids), what="old gone")
            await phase_is(state, "upper", "Running", ready=2)
            second = endpoints(state, "upper")
            assert set(second.values()).isdisjoint(first.values())
            assert len(transformer_pids("upper")) == 2

            # Stop: phase Stopped at once, processes gone soon after.
            stopped = await be.set_stopped("upper", True)
            assert stopped.phase == "Stopped" and must(state, "upper").phase == "Stopped"
            await wait_until(lambda: not transformer_pids("upper"), what="stopped processes gone")
            assert must(state, "upper").transformers == ()

            await be.set_stopped("upper", False)
            await phase_is(state, "upper", "Running", ready=2)
            assert len(transformer_pids("upper")) == 2

            live = transformer_pids("upper")
            await be.delete("upper")
            assert not (state / "upper.json").exists()
            assert all(pid_gone(p) for p in live)
            assert await be.get("upper") is None and await be.list() == []
            with pytest.raises(KeyError):
                await be.delete("upper")
            with pytest.raises(KeyError):
                await be.set_stopped("upper", True)

    asyncio.run(scenario())


def test_killed_transformer_is_recreated(tmp_path: Path, transformer_command) -> None:
    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0", "t1"]), transformer_command) as be:
            await be.init("upper", spec())
            await phase_is(state, "upper", "Running", ready=2)
            before = endpoints(state, "upper")
            victim = next(
                p
                for p in transformer_pids("upper")
                if f":{before['t0']}".endswith(f":{_port_of(p)}")
            )
            os.kill(victim, signal.SIGKILL)
            await wait_until(
                lambda: (
                    endpoints(state, "upper")["t0"] != before["t0"]
                    and must(state, "upper").phase == "Running"
                ),
                timeout=90,
                what="t0 transformer recreated",
            )
            after = endpoints(state, "upper")
            assert after["t1"] == before["t1"]  # the healthy one was left alone
            assert len(transformer_pids("upper")) == 2
            assert not transformer_pids(leaders_only=False) & {victim}

    asyncio.run(scenario())


def test_crash_budget_resets_after_a_healthy_run(
    tmp_path: Path, transformer_command, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 #4: the 6th kill -9 of a transformer left the ETL in Error for good,
    even with 40 s of healthy service between kills. A run of HEALTHY_SECONDS
    (30 s; 2 s here) starts a fresh budget: after every kill it serves again."""
    from etl_runtime.cluster import reconcile

    monkeypatch.setattr(reconcile, "HEALTHY_SECONDS", 2.0)

    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0"]), transformer_command) as be:
            await be.init("upper", spec())
            await phase_is(state, "upper", "Running", ready=1)
            for kill in range(reconcile.MAX_RESTARTS + 1):
                before = endpoints(state, "upper")["t0"]
                await asyncio.sleep(2.5)  # a healthy run
                for pid in transformer_pids("upper"):
                    os.kill(pid, signal.SIGKILL)
                await wait_until(
                    lambda b=before: (
                        endpoints(state, "upper")["t0"] not in (None, b)
                        and must(state, "upper").phase == "Running"
                    ),
                    timeout=60,
                    what=f"serving again after kill {kill + 1}",
                )
                assert await health(endpoints(state, "upper")["t0"] or "") == 200

    asyncio.run(scenario())


def test_a_dead_transformer_is_unready_in_the_record_at_once(
    tmp_path: Path, transformer_command
) -> None:
    """Issue 20 #4b: the record said "ready" until the next reconcile pass, so for up
    to a second targets sent clients to the dead port (288 ConnectErrors under a
    read loop). The controller now acts on the exit itself: with passes a minute
    apart, the record says not ready well before the next one."""

    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0"]), transformer_command) as be:
            await be.init("upper", spec())
            await phase_is(state, "upper", "Running", ready=1)
            be.interval = 60.0
            await asyncio.sleep(1.0)  # the loop now waits for a minute between passes
            for pid in transformer_pids("upper"):
                os.kill(pid, signal.SIGKILL)
            await wait_until(
                lambda: must(state, "upper").transformers[0].ready is False,
                timeout=20,
                what="the record to say t0's transformer is not ready",
            )
            tf = must(state, "upper").transformers[0]
            assert "SIGKILL" in (tf.message or ""), tf

    asyncio.run(scenario())


def test_an_adopted_process_s_exit_is_seen_at_once(tmp_path: Path) -> None:
    """Adopted transformers are no children of the controller: a pidfd tells of the exit."""
    import subprocess
    import sys

    from etl_runtime.local.processes import TransformerProcess, process_start_time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        p = TransformerProcess(
            etl="e", target="t0", name="etl-e-t0", spec_hash="h", port=1, pid=child.pid,
            log_path=tmp_path / "log", start_time=process_start_time(child.pid),
        )  # fmt: skip

        async def scenario() -> None:
            waiter = asyncio.create_task(p.exited())
            await asyncio.sleep(0.3)
            assert not waiter.done() and not p.poll()
            child.kill()
            await asyncio.wait_for(waiter, 10)
            assert p.poll() and not p.ready

        asyncio.run(scenario())
    finally:
        child.kill()
        child.wait()


def _port_of(pid: int) -> int:
    import psutil

    cmd = psutil.Process(pid).cmdline()
    return int(cmd[cmd.index("--port") + 1])


def test_bad_code_is_error_without_crash_loop(tmp_path: Path, transformer_command) -> None:
    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0", "t1"]), transformer_command) as be:
            await be.init("bad", spec("raise RuntimeError('boom')\n"))
            await phase_is(state, "bad", "Error")
            rec = on_disk(state, "bad")
            assert rec is not None and rec.message is not None
            assert "sluice: ETL 'bad'" in rec.message, rec.message
            assert rec.ready_count == 0
            await asyncio.sleep(3)  # several reconcile passes
            log = (state / "logs" / "etl-bad-t0.log").read_text()
            assert log.count("sluice: starting") == 1, log
            assert must(state, "bad").phase == "Error"

            # Fixing the code recovers.
            await be.init("bad", spec())
            await phase_is(state, "bad", "Running", ready=2)

    asyncio.run(scenario())


def test_restarted_controller_adopts_or_recreates_without_duplicates(
    tmp_path: Path, transformer_command
) -> None:
    async def scenario() -> None:
        state = tmp_path / "etl"
        targets = FakeTargets(["t0", "t1"])
        # 1. Graceful restart: transformers stop with the controller, come back after.
        async with running(state, targets, transformer_command) as be:
            await be.init("upper", spec())
            await be.init("paused", spec(stopped=True))
            await phase_is(state, "upper", "Running", ready=2)
        assert not transformer_pids()
        assert must(state, "upper").transformers == ()
        async with running(state, targets, transformer_command) as be:
            await phase_is(state, "upper", "Running", ready=2)
            assert len(transformer_pids("upper")) == 2
            assert not transformer_pids("paused")
            assert [r.name for r in await be.list()] == ["paused", "upper"]
            kept = transformer_pids("upper")
            # 2. Crash: the controller vanishes without stopping its children.
            assert be._task is not None
            be._task.cancel()
            be._procs.clear()
        # (the context's stop() had nothing left to stop)
        assert transformer_pids("upper") == kept
        async with running(state, targets, transformer_command) as be:
            await phase_is(state, "upper", "Running", ready=2)
            await asyncio.sleep(1.0)
            assert transformer_pids("upper") == kept  # adopted, not duplicated
        assert all(pid_gone(p) for p in kept)

    asyncio.run(scenario())


def test_target_set_changes(tmp_path: Path, transformer_command) -> None:
    async def scenario() -> None:
        state = tmp_path / "etl"
        targets = FakeTargets(["t0", "t1"])
        async with running(state, targets, transformer_command) as be:
            await be.init("upper", spec())
            await phase_is(state, "upper", "Running", ready=2)
            gone = targets.live.pop()
            be.kick()
            await phase_is(state, "upper", "Running", ready=1)
            assert sorted(endpoints(state, "upper")) == ["t0"]
            await wait_until(lambda: len(transformer_pids("upper")) == 1, what="t1 stopped")
            targets.live.append(gone)
            await phase_is(state, "upper", "Running", ready=2)

    asyncio.run(scenario())


def test_environment_carries_token_not_cluster_secrets(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_CLUSTER_KEY", KEY)
    monkeypatch.setenv("SLUICE_TOKEN", "user-secret")

    async def scenario() -> None:
        state = tmp_path / "etl"
        async with running(state, FakeTargets(["t0"]), STANDIN) as be:
            rec = await be.init("envy", spec(env=(("USER_GREETING", "hi"),)))
            await phase_is(state, "envy", "Running", ready=1)
            ep = endpoints(state, "envy")["t0"]
            async with httpx.AsyncClient() as c:
                env = (await c.get(f"{ep}/env")).json()
        assert env["SLUICE_ETL_TOKEN"] == auth.transformer_token(KEY, "envy", rec.uid)
        assert env["SLUICE_CLUSTER_KEY"] is None
        assert env["USER_GREETING"] == "hi"
        assert env["SLUICE_DEPS_DIR"].startswith(str(state))
        assert json.loads((state / "envy.json").read_text())["uid"] == rec.uid

    asyncio.run(scenario())


def test_a_foreign_server_on_the_port_is_never_taken_for_ready(
    tmp_path: Path, transformer_command, monkeypatch
) -> None:
    """Port race: the picked port is taken before the transformer binds it.

    ``free_port()`` closes its socket before the child binds, so another server
    (a transformer of another ETL or cluster) can take the port first; the new
    transformer then dies on EADDRINUSE, but before it does, that *other*
    server answers ``/health``. Taking that for "ready" made the ETL Running
    with an endpoint that refuses our token (401): webdataset's ``curl -f``
    then printed nothing and webdataset said "empty file".
    """
    from fastapi import FastAPI

    from etl_runtime.local import processes
    from tests.servers import serve_in_thread

    foreign = FastAPI()

    @foreign.get("/health")
    async def foreign_health() -> dict[str, object]:
        return {"status": "ok", "etl": "someone-else", "mode": "object", "workers": 1, "pid": 1}

    real_free_port = processes.free_port
    with serve_in_thread(foreign) as foreign_url:
        port = int(foreign_url.rsplit(":", 1)[1])
        ports = iter([port])
        monkeypatch.setattr(
            processes,
            "free_port",
            lambda host="127.0.0.1": next(ports, None) or real_free_port(host),
        )

        async def scenario() -> None:
            state = tmp_path / "etl"
            seen: list[tuple[str, str | None, bool]] = []
            async with running(state, FakeTargets(["t0"]), transformer_command) as be:
                await be.init("victim", spec())

                def check() -> bool:
                    rec = on_disk(state, "victim")
                    if rec is not None:
                        seen.extend((rec.phase, t.endpoint, t.ready) for t in rec.transformers)
                    return rec is not None and rec.phase == "Running"

                await wait_until(check, timeout=90, what="victim Running")
            assert (("Running", foreign_url, True)) not in seen
            assert not any(ep == foreign_url and ready for _, ep, ready in seen), seen

        asyncio.run(scenario())
