"""Idle TCP connections against one target: are other clients still served? (issue 20)

For each scenario a fresh target process (``python -m etl_runtime.storage_target``
on loopback, default settings unless the scenario says otherwise) gets one
16 KiB object, then:

1. *unloaded*: "other clients" GET it, each on a new connection
   (``Connection: close``), ``--rate`` requests per second for ``--quiet``
   seconds, arrivals on a fixed schedule (a slow answer does not delay the
   next request), each failing after ``--timeout`` seconds;
2. ``--idle`` idle connections are opened and held, half of them never
   sending a byte, half idle after one ``GET /v1/health`` (kept alive), by a
   second process; the loaded phase starts once all are open and the kept
   alive ones have their answer (or waited 10 s for it in vain);
3. *loaded*: the same request stream for ``--seconds`` while they are held.
   With ``--reconnect S`` a holder whose connection the server closed opens a
   new one S seconds later (a sustained attack); by default it does not.

Scenarios (the open-files limit is set in the target's process before it starts):

* ``before``: soft = hard = 1024 files, ``SLUICE_HEADER_TIMEOUT=0`` and
  ``SLUICE_MAX_CONNECTIONS=0``: no header timeout, no cap, and the limit
  cannot be raised: what the servers did before issue 20 (the keep-alive
  timeout is 75 s either way);
* ``hard-1024``: soft = hard = 1024, default settings: the limit cannot be
  raised, so the connection cap (768 by default) and the 10 s header timeout
  do the work;
* ``soft-1024``: soft 1024, hard limit as this process has it, default
  settings: the target raises its soft limit to the hard limit at start.

Printed per scenario and phase: requests, % answered 200 with the whole
object, p50/p99 latency, loaded p99 / unloaded p99, idle connections the
server closed during the loaded phase, and CPU per request of the target and
of the load generator that sends the GETs (process CPU time over the phase /
requests sent; the idle connections are held by a second process, whose CPU
over the loaded phase is printed too, so its events do not delay the measured
GETs). Loopback only; this process raises its own open-files soft limit to
hold the idle connections.

    .venv/bin/python bench/idle_connections.py [--idle 1100] [--rate 20] [--quiet 10]
        [--seconds 20] [--timeout 5] [--reconnect 0] [--scenarios before,hard-1024,soft-1024]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import free_port, serve_process  # noqa: E402

SIZE = 16 << 10
HOST = "127.0.0.1"
OFF = {"SLUICE_HEADER_TIMEOUT": "0", "SLUICE_MAX_CONNECTIONS": "0"}
SCENARIOS: dict[str, tuple[int | None, dict[str, str]]] = {
    # name: (hard open-files limit to set, or None to keep ours; env)
    "before": (1024, OFF),
    "hard-1024": (1024, {}),
    "soft-1024": (None, {}),
}


def fd_limit(hard: int | None) -> Callable[[], None]:
    def limit() -> None:  # in the target's process, before Python starts
        own = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard or own))

    return limit


@contextlib.contextmanager
def target(workdir: Path, name: str) -> Iterator[tuple[int, int]]:
    """The scenario's target process; yields (port, pid)."""
    hard, env = SCENARIOS[name]
    port = free_port()
    args = ["-m", "etl_runtime.storage_target", "--data-dir", str(workdir / name)]
    env = {"SLUICE_HOST": HOST, "SLUICE_PORT": str(port), **env}
    url = f"http://{HOST}:{port}/v1/health"
    with serve_process(args, url, env=env, preexec_fn=fd_limit(hard)) as proc:
        yield port, proc.pid


def limits_of(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        line = next(ln for ln in f if ln.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return f"{soft}/{hard}"


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)  # of the successes
    sent: int = 0
    ok: int = 0
    cpu_gen: float = 0.0
    cpu_target: float = 0.0

    def p(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


async def get_once(port: int, timeout: float) -> float | None:
    """One GET on a new connection; its latency, or None if it failed."""
    start = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(b"GET /v1/objects/b/o HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            answer = await reader.read(-1)
    except (TimeoutError, OSError):
        return None
    finally:
        if writer is not None:
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 ") or len(body) != SIZE:
        return None
    return time.perf_counter() - start


async def stream(port: int, rate: float, seconds: float, timeout: float, pid: int) -> Phase:
    """Requests at ``rate``/s for ``seconds`` (fixed arrival times); waits for the last."""
    phase = Phase()
    me, server = psutil.Process(), psutil.Process(pid)
    cpu0, tcpu0 = sum(me.cpu_times()[:2]), sum(server.cpu_times()[:2])
    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.ensure_future(get_once(port, timeout)))
    for latency in await asyncio.gather(*tasks):
        phase.sent += 1
        if latency is not None:
            phase.ok += 1
            phase.latencies.append(latency)
    phase.cpu_gen = sum(me.cpu_times()[:2]) - cpu0
    phase.cpu_target = sum(server.cpu_times()[:2]) - tcpu0
    return phase


class Holders:
    """``n`` idle connections, half silent, half kept alive after one request."""

    def __init__(self, port: int, n: int, reconnect: float) -> None:
        self.port, self.n, self.reconnect = port, n, reconnect
        self.open = 0
        self.settled = 0  # holders whose first connection is idle (or never got its answer)
        self.closed_by_server = 0
        self.refused = 0
        self.counting = False
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, within: float = 30.0) -> None:
        self.tasks = [asyncio.ensure_future(self._hold(i % 2 == 1)) for i in range(self.n)]
        deadline = time.monotonic() + within
        while self.settled + self.refused < self.n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _hold(self, kept_alive: bool) -> None:
        first = True
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, self.port), 10
                )
            except (TimeoutError, OSError):
                self.refused += 1
                return
            self.open += 1
            try:
                if kept_alive:
                    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
                    with contextlib.suppress(TimeoutError):  # unanswered: held all the same
                        await asyncio.wait_for(reader.readuntil(b"}"), 10)
                self.settled += int(first)
                first = False
                while await reader.read(4096):  # until the server closes it
                    pass
            except (OSError, asyncio.IncompleteReadError):
                self.settled += int(first)
                first = False
            finally:
                self.open -= 1
                writer.close()
            if self.counting:
                self.closed_by_server += 1
            if not self.reconnect:
                return
            await asyncio.sleep(self.reconnect)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def hold(port: int, n: int, reconnect: float, conn: Connection) -> None:
    """The holders' own process (so their events do not delay the measured GETs)."""
    asyncio.run(_holding(port, n, reconnect, conn))


async def _holding(port: int, n: int, reconnect: float, conn: Connection) -> None:
    holders = Holders(port, n, reconnect)
    await holders.start()
    holders.counting = True
    cpu = time.process_time()
    conn.send({"held": holders.open, "refused": holders.refused})
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_reader(conn.fileno(), lambda: stop.done() or stop.set_result(None))
    await stop
    conn.recv()
    cpu = time.process_time() - cpu
    conn.send({"closed": holders.closed_by_server, "open": holders.open, "cpu": cpu})
    await holders.stop()


def scenario(port: int, pid: int, args: argparse.Namespace) -> dict[str, object]:
    quiet = asyncio.run(stream(port, args.rate, args.quiet, args.timeout, pid))
    ours, theirs = multiprocessing.Pipe()
    holder = multiprocessing.get_context("fork").Process(
        target=hold, args=(port, args.idle, args.reconnect, theirs)
    )
    holder.start()
    try:
        start = ours.recv()
        loaded = asyncio.run(stream(port, args.rate, args.seconds, args.timeout, pid))
        ours.send("stop")
        end = ours.recv()
    finally:
        holder.join(timeout=30)
        if holder.is_alive():
            holder.kill()
    return {"quiet": quiet, "loaded": loaded, **start, **end}


def upload(port: int) -> None:
    with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30) as c:
        c.post("/v1/buckets/b", json={"action": "create-bck"}).raise_for_status()
        c.put("/v1/objects/b/o", content=os.urandom(SIZE)).raise_for_status()


def row(name: str, label: str, ph: Phase, base: Phase | None) -> str:
    ok = 100.0 * ph.ok / ph.sent if ph.sent else 0.0
    ratio = f"{ph.p(0.99) / base.p(0.99):5.2f}" if base and ph.latencies else "    -"
    gen = ph.cpu_gen / ph.sent * 1e3 if ph.sent else 0.0
    tgt = ph.cpu_target / ph.sent * 1e3 if ph.sent else 0.0
    return (
        f"{name:<10} {label:<8} {ph.sent:5d} {ok:6.1f}% {ph.p(0.5) * 1e3:8.1f} "
        f"{ph.p(0.99) * 1e3:8.1f} {ratio} {tgt:9.2f} {gen:9.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle", type=int, default=1100, help="idle connections held")
    p.add_argument("--rate", type=float, default=20.0, help="other clients' GETs per second")
    p.add_argument("--quiet", type=float, default=10.0, help="seconds of the unloaded phase")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of the loaded phase")
    p.add_argument("--timeout", type=float, default=5.0, help="a GET fails after this")
    p.add_argument("--reconnect", type=float, default=0.0, help="holders reconnect after S s")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # to hold --idle connections ourselves
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(
        f"{args.idle} idle connections (half silent, half kept alive), other clients "
        f"{args.rate:g} GET/s of {SIZE >> 10} KiB on new connections, timeout {args.timeout:g} s, "
        f"reconnect {args.reconnect or 'off'}; {os.cpu_count()} CPUs\n"
    )
    header = (
        f"{'scenario':<10} {'phase':<8} {'GETs':>5} {'served':>7} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'p99 x':>5} {'tgt ms/GET':>9} {'gen ms/GET':>9}"
    )
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenarios.split(","):
            with target(Path(tmp), name) as (port, pid):
                upload(port)
                limits = limits_of(pid)
                r = scenario(port, pid, args)
            quiet, loaded = r["quiet"], r["loaded"]
            assert isinstance(quiet, Phase) and isinstance(loaded, Phase)
            lines += [row(name, "unloaded", quiet, None), row(name, "loaded", loaded, quiet)]
            lines.append(
                f"{'':<10} target open files {limits} (soft/hard); {r['held']} idle held "
                f"({r['refused']} could not connect), {r['closed']} closed by the target in the "
                f"loaded phase, {r['open']} still open; holders' CPU {r['cpu']:.2f} s"
            )
            print("\n".join([header, *lines[-3:]]), flush=True)
    print("\n" + "\n".join([header, *lines]))


if __name__ == "__main__":
    main()
