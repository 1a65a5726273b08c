"""Cost of the ``/metrics`` middleware on a target's plain GET of 16 KiB objects.

Starts two identical targets as child processes (``run_server``, as
``python -m etl_runtime.storage_target`` does) over their own data dirs: one as
``create_target_app`` builds it, one with ``MetricsMiddleware`` taken out of
its middleware list before it serves. Uploads the same objects to both, then
has ``--clients`` concurrent readers (httpx) GET them from one target, then the
other, for ``--seconds`` each, ``--rounds`` times alternating, so load from
elsewhere on the machine hits both alike. Prints GET/s and each target
process's CPU microseconds per GET (load-independent, unlike the rate) and the
with/without ratios (median over the rounds). Then, in-process, the
middleware's own cost: the same ASGI call (a 16 KiB answer of a route
template) with and without it, on a bare app, so no server noise is in it.

    .venv/bin/python bench/metrics_overhead.py [--clients 8] [--seconds 5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import free_port, serve_process  # noqa: E402

SIZE = 16 << 10
OBJECTS = 64


def serve(port: int, data_dir: str, metrics: bool) -> None:
    """The child: one target, with or without the metrics middleware."""
    from etl_runtime.core.metrics import MetricsMiddleware
    from etl_runtime.storage_target import create_target_app
    from etl_runtime.wire.http.serving import run_server
    from tests.storage_target.fakes import DictRegistry

    app = create_target_app("t0", data_dir, DictRegistry())
    if not metrics:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not MetricsMiddleware]
    run_server(app, "127.0.0.1", port)


@contextlib.contextmanager
def target(workdir: Path, metrics: bool) -> Iterator[tuple[str, int]]:
    """A target child process; yields its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir = workdir / ("with" if metrics else "without")
    args = [__file__, "serve", str(port), str(data_dir), "on" if metrics else "off"]
    with serve_process(args, f"{url}/v1/health") as proc:
        yield url, proc.pid


def cpu_seconds(pid: int) -> float:
    import psutil  # dev dependency, only needed here

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def measure(url: str, clients: int, seconds: float) -> tuple[int, float]:
    """GETs done and seconds taken by ``clients`` concurrent readers."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        done = 0
        deadline = 0.0

        async def reader(i: int) -> None:
            nonlocal done
            j = i
            while time.perf_counter() < deadline:
                r = await client.get(f"/v1/objects/bench/o{j % OBJECTS}")
                if r.status_code != 200 or len(r.content) != SIZE:
                    raise RuntimeError(f"GET answered {r.status_code}, {len(r.content)} bytes")
                done += 1
                j += clients

        deadline = time.perf_counter() + 0.5  # warm-up: connections, caches
        await asyncio.gather(*(reader(i) for i in range(clients)))
        done = 0
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(reader(i) for i in range(clients)))
        return done, time.perf_counter() - start


def upload(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/buckets/bench", json={"action": "create-bck"}).raise_for_status()
        for i in range(OBJECTS):
            c.put(f"/v1/objects/bench/o{i}", content=os.urandom(SIZE)).raise_for_status()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = {m: stack.enter_context(target(Path(tmp), m)) for m in (True, False)}
        for url, _ in servers.values():
            upload(url)
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for metrics in order:
                url, pid = servers[metrics]
                cpu = cpu_seconds(pid)
                done, elapsed = asyncio.run(measure(url, args.clients, args.seconds))
                cpu_us = (cpu_seconds(pid) - cpu) / done * 1e6
                results[metrics].append((done / elapsed, cpu_us))
                label = "with" if metrics else "without"
                rate = done / elapsed
                print(f"round {r + 1} {label:>7}: {rate:8.1f} GET/s  {cpu_us:6.0f} µs/GET")
    print(f"\nplain GET of {SIZE >> 10} KiB, {args.clients} clients, median of {args.rounds}:")
    for metrics in (False, True):
        rate = statistics.median(x for x, _ in results[metrics])
        cpu = statistics.median(c for _, c in results[metrics])
        print(f"  {'with' if metrics else 'without'} metrics: {rate:8.1f} GET/s  {cpu:6.0f} µs/GET")
    rate_ratio = statistics.median(x for x, _ in results[True]) / statistics.median(
        x for x, _ in results[False]
    )
    cpu_ratio = statistics.median(c for _, c in results[True]) / statistics.median(
        c for _, c in results[False]
    )
    print(f"  with/without: GET/s x{rate_ratio:.3f}, target CPU per GET x{cpu_ratio:.3f}")
    bare, wrapped = asyncio.run(middleware_cost())
    print(
        f"\nin-process ASGI call, median of 5 x {CALLS}: bare {bare:.2f} µs, "
        f"with MetricsMiddleware {wrapped:.2f} µs: +{wrapped - bare:.2f} µs per request"
    )


CALLS = 100_000


async def middleware_cost() -> tuple[float, float]:
    """µs per call of a bare ASGI app answering 16 KiB, without and with the middleware."""
    from prometheus_client import CollectorRegistry
    from starlette.routing import Route

    from etl_runtime.core.metrics import HttpMetrics, MetricsMiddleware

    route = Route("/v1/objects/{bucket}/{name:path}", lambda request: None)
    body = bytes(SIZE)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = route  # as Starlette's router sets it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    wrapped = MetricsMiddleware(app, HttpMetrics(CollectorRegistry(), "target"))
    times: dict[str, list[float]] = {"bare": [], "with": []}
    for _ in range(5):
        for name, asgi in (("bare", app), ("with", wrapped)):
            start = time.perf_counter()
            for _ in range(CALLS):
                scope = {"type": "http", "method": "GET", "query_string": b"", "path": "/"}
                await asgi(scope, receive, send)
            times[name].append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(times["bare"]), statistics.median(times["with"])


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "on")
    else:
        main()
