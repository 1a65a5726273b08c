"""Durability under kill -9: 20 rounds of killing a random target during concurrent PUTs.

A 3-target ``sluice up``; 4 writer threads PUT 1-8 MiB objects through the
gateway (each writer owns its names, so the order of its versions is known),
a reader thread GETs them all the while, and the main thread kills a random
target with SIGKILL 20 times, each time waiting until ``sluice up`` has brought
it back on its URL. What a storage system must guarantee:

* every acknowledged PUT reads back byte-identical afterwards: each name holds
  its last acknowledged version, or a later one whose PUT was cut off by a kill
  (an unacknowledged write may or may not have landed; it must never be half);
* no half-written object is ever visible: every 200 a reader gets has the md5
  of one of the versions written to that name;
* no temp file is left in ``DATA/targets/*/.tmp``.

Writes that fail while a target is down (503, dropped connections) are fine:
they were not acknowledged.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from etl_runtime import Client
from etl_runtime.local import LocalCluster
from etl_runtime.sdk.errors import NotFound, SluiceError
from tests.local.conftest import pid_gone

SEED = 8
TARGETS = 3
ROUNDS = 20
WRITERS = 4
NAMES_PER_WRITER = 4
MIB = 1024 * 1024
# Seconds a writer / the reader rests between requests: 2 cores run everything,
# and the restarts need their share (a target takes ~1.5 s of CPU to start).
WRITE_PAUSE, READ_PAUSE = 0.4, 0.3
POOL = random.Random(SEED).randbytes(9 * MIB)  # object bodies are slices of this


@dataclass
class History:
    """The versions written to one name, in order: (md5, acknowledged)."""

    versions: list[tuple[str, bool]] = field(default_factory=list)

    def written(self) -> set[str]:
        return {md5 for md5, _ in self.versions}

    def acceptable_now(self) -> set[str] | None:
        """Md5s the name may hold after the run; None: it may also be absent."""
        acked = [i for i, (_, ok) in enumerate(self.versions) if ok]
        if not acked:
            return None
        return {md5 for md5, _ in self.versions[acked[-1] :]}


@dataclass
class Run:
    histories: dict[str, History]
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: int = 0
    failed: int = 0
    reads: int = 0
    violations: list[str] = field(default_factory=list)


def body_for(rng: random.Random) -> bytes:
    size = rng.randint(1 * MIB, 8 * MIB)
    offset = rng.randrange(len(POOL) - size)
    return uuid.uuid4().bytes + POOL[offset : offset + size - 16]


def writer(endpoint: str, run: Run, names: list[str], seed: int) -> None:
    rng = random.Random(seed)
    with Client(endpoint, timeout=30, retries=0) as client:
        bucket = client.bucket("bkt")
        while not run.stop.is_set():
            name = rng.choice(names)
            data = body_for(rng)
            md5 = hashlib.md5(data).hexdigest()
            history = run.histories[name]
            with run.lock:  # known before a byte of it can be on disk
                history.versions.append((md5, False))
                index = len(history.versions) - 1
            try:
                info = bucket.object(name).put_content(data)
            except (SluiceError, httpx.HTTPError):  # the SDK lets a cut-off answer through
                with run.lock:
                    run.failed += 1
                continue
            with run.lock:
                if info.etag not in (None, md5):
                    run.violations.append(f"PUT {name}: acknowledged etag {info.etag} != {md5}")
                history.versions[index] = (md5, True)
                run.acked += 1
            run.stop.wait(WRITE_PAUSE)


def reader(endpoint: str, run: Run, seed: int) -> None:
    rng = random.Random(seed)
    names = sorted(run.histories)
    with Client(endpoint, timeout=30, retries=0) as client:
        bucket = client.bucket("bkt")
        while not run.stop.is_set():
            name = rng.choice(names)
            try:
                data = bucket.object(name).get_bytes()
            except (SluiceError, httpx.HTTPError):
                continue  # absent, or its target is down: no data shown at all
            md5 = hashlib.md5(data).hexdigest()
            run.stop.wait(READ_PAUSE)
            with run.lock:
                run.reads += 1
                if md5 not in run.histories[name].written():
                    run.violations.append(
                        f"GET {name}: {len(data)} bytes with md5 {md5}, not a version written"
                    )


def target_process(cluster: LocalCluster, target_id: str) -> psutil.Process | None:
    for p in psutil.Process(cluster.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
            if "etl_runtime.storage_target" in cmd and cmd[cmd.index("--id") + 1] == target_id:
                return p
        except (psutil.NoSuchProcess, ValueError, IndexError):
            pass
    return None


def wait_healthy(url: str, cluster: LocalCluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not back after {timeout}s; sluice up said:\n{cluster.output}")


def final_content(client: Client, name: str) -> str | None:
    """Md5 of ``name`` through the gateway (None: not found), retrying a target still waking up."""
    for _ in range(50):
        try:
            return hashlib.md5(client.bucket("bkt").object(name).get_bytes()).hexdigest()
        except NotFound:
            return None
        except SluiceError:
            time.sleep(0.2)
    raise AssertionError(f"GET {name} kept failing after the run")


def test_kill9_of_targets_during_writes_loses_and_shows_nothing_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every kill counts as a first crash: 20 kills of 3 targets are not a crash loop.
    monkeypatch.setenv("SLUICE_RESTART_RESET", "1")
    data = tmp_path / "data"
    rng = random.Random(SEED)
    names = [[f"w{w}/o{j}" for j in range(NAMES_PER_WRITER)] for w in range(WRITERS)]
    run = Run(histories={n: History() for group in names for n in group})
    t0, pauses = time.monotonic(), []
    with LocalCluster(data, targets=TARGETS) as cluster:
        t_up = time.monotonic()
        with Client(cluster.endpoint) as client:
            client.bucket("bkt").create()
            urls = {t["id"]: t["url"] for t in client.request_json("GET", "/v1/cluster")["targets"]}
        threads = [
            threading.Thread(target=writer, args=(cluster.endpoint, run, group, SEED + i))
            for i, group in enumerate(names)
        ]
        threads.append(threading.Thread(target=reader, args=(cluster.endpoint, run, SEED)))
        for t in threads:
            t.start()
        try:
            for _ in range(ROUNDS):
                time.sleep(rng.uniform(0.2, 0.6))
                victim = rng.choice(sorted(urls))
                proc = target_process(cluster, victim)
                assert proc is not None, f"target {victim} is not running:\n{cluster.output}"
                proc.kill()
                killed_at = time.monotonic()
                deadline = time.monotonic() + 10
                while not pid_gone(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.02)
                wait_healthy(urls[victim], cluster)
                pauses.append(time.monotonic() - killed_at)
                assert cluster.process is not None and cluster.process.poll() is None
        finally:
            run.stop.set()
            for t in threads:
                t.join(60)
        assert not any(t.is_alive() for t in threads), "a writer or the reader hangs"

        t_rounds = time.monotonic()
        restarts = [ln for ln in cluster.output.splitlines() if "; restarting in" in ln]
        assert len(restarts) == ROUNDS, cluster.output
        assert run.acked > ROUNDS, f"only {run.acked} PUTs acknowledged ({run.failed} failed)"
        assert run.reads > 0
        assert run.violations == []

        for url in urls.values():
            wait_healthy(url, cluster)
        with Client(cluster.endpoint, timeout=30, retries=0) as client:
            deadline = time.monotonic() + 30  # the gateway notices restarted targets
            while not all(t["alive"] for t in client.request_json("GET", "/v1/cluster")["targets"]):
                assert time.monotonic() < deadline, "a target never counted as alive again"
                time.sleep(0.2)
            wrong = []
            for name, history in sorted(run.histories.items()):
                got, ok = final_content(client, name), history.acceptable_now()
                if (ok is None and got is not None and got not in history.written()) or (
                    ok is not None and got not in ok
                ):
                    wrong.append(f"{name}: holds {got}, acknowledged/later versions {ok}")
            assert wrong == [], "acknowledged writes lost or hidden:\n" + "\n".join(wrong)

        leftovers = [str(p) for d in data.glob("targets/*/.tmp") for p in d.iterdir()]
        assert leftovers == [], f"temp files left behind: {leftovers}"
        assert cluster.stop() == 0
    print(
        f"\n{run.acked} PUTs acknowledged, {run.failed} failed, {run.reads} verified reads; "
        f"up {t_up - t0:.1f}s, rounds {t_rounds - t_up:.1f}s, "
        f"checks+stop {time.monotonic() - t_rounds:.1f}s; a target was away for "
        f"{min(pauses):.1f}-{max(pauses):.1f}s"
    )
