"""Rebalance 3 -> 4 targets: how long it takes, and GET throughput while it runs.

Starts ``sluice up --targets 3`` on a fresh data dir, uploads ``--total-mb`` of
1 MiB objects, measures GET throughput (plain GETs of random objects through
the gateway's 307) for ``--seconds``, stops the cluster and starts it again
with ``--targets 4`` on the same data dir, which starts a rebalance. It then
measures GET throughput *during* the rebalance, the rebalance's duration
(first target's start to last target's end, from each target's
``/v1/_rebalance``), and GET throughput after it. Prints objects/s, MB/s, the
load generator's CPU per GET (it must stay small next to the servers'), and
the ratio during/before (goal >= 0.7).

The load generator is ``--clients`` processes, each with ``--threads`` threads
and one pooled ``httpx.Client``, so one Python process is not the limit.

    .venv/bin/python bench/rebalance.py [--total-mb 2048] [--seconds 10] [--clients 4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.local import LocalCluster  # noqa: E402

OBJECT_SIZE = 1 << 20


def _client(ep: str, n: int, seconds: float, threads: int, out: mp.Queue) -> None:
    stop = time.monotonic() + seconds
    counts = [0] * threads
    errors = [0] * threads
    cpu0 = time.process_time()

    def run(i: int) -> None:
        rng = random.Random(os.getpid() * 100 + i)
        with httpx.Client(timeout=60, follow_redirects=True) as c:
            while time.monotonic() < stop:
                r = c.get(f"{ep}/v1/objects/bench/obj-{rng.randrange(n):06d}")
                if r.status_code == 200 and len(r.content) == OBJECT_SIZE:
                    counts[i] += 1
                else:
                    errors[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((sum(counts), sum(errors), time.process_time() - cpu0))


def measure(ep: str, n: int, seconds: float, clients: int, threads: int) -> dict[str, float]:
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_client, args=(ep, n, seconds, threads, q)) for _ in range(clients)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    ok = sum(r[0] for r in results)
    return {
        "gets_per_s": ok / wall,
        "mb_per_s": ok * OBJECT_SIZE / wall / 1e6,
        "errors": sum(r[1] for r in results),
        "client_cpu_ms_per_get": 1000 * sum(r[2] for r in results) / max(ok, 1),
    }


def upload(ep: str, n: int) -> None:
    def put(i: int) -> None:
        body = random.Random(i).randbytes(OBJECT_SIZE)
        with httpx.Client(timeout=120, follow_redirects=True) as c:
            r = c.put(f"{ep}/v1/objects/bench/obj-{i:06d}", content=body)
            r.raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(n)))


def rebalance_window(ep: str) -> tuple[float, dict]:
    """Wait for the rebalance to end; its duration from the targets' own clocks."""
    while True:
        view = httpx.get(f"{ep}/v1/cluster", timeout=30).json()
        if view["rebalance"]["state"] == "idle":
            break
        time.sleep(0.5)
    statuses = [t["rebalance"] for t in view["targets"] if t.get("rebalance")]
    started = min(s["started"] for s in statuses if s.get("started"))
    finished = max(s["finished"] or time.time() for s in statuses if s.get("started"))
    return finished - started, view["rebalance"]


def show(label: str, m: dict[str, float]) -> None:
    print(
        f"{label:<28} {m['gets_per_s']:8.1f} GET/s {m['mb_per_s']:8.1f} MB/s "
        f"errors {int(m['errors']):3d}  client CPU {m['client_cpu_ms_per_get']:.2f} ms/GET",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    n = args.total_mb
    data = Path(args.data_dir or tempfile.mkdtemp(prefix="sluice-rebalance-")) / "data"
    print(f"machine: {os.cpu_count()} cores; {n} x 1 MiB objects; data in {data}", flush=True)
    with LocalCluster(data, targets=3) as cluster:
        ep = cluster.endpoint
        httpx.post(f"{ep}/v1/buckets/bench", json={"action": "create-bck"}).raise_for_status()
        t0 = time.monotonic()
        upload(ep, n)
        print(f"uploaded {n} MiB in {time.monotonic() - t0:.1f}s", flush=True)
        before = measure(ep, n, args.seconds, args.clients, args.threads)
        show("before (3 targets)", before)
    with LocalCluster(data, targets=4) as cluster:
        ep = cluster.endpoint
        during = measure(ep, n, args.seconds, args.clients, args.threads)
        show("during rebalance (4 targets)", during)
        took, totals = rebalance_window(ep)
        still = httpx.get(f"{ep}/v1/cluster").json()
        print(
            f"rebalance 3 -> 4: {took:.1f}s, {totals['objects_moved']} objects / "
            f"{totals['bytes_moved'] / 1e6:.0f} MB moved, {totals['errors']} errors "
            f"(limit {os.environ.get('SLUICE_REBALANCE_MBPS', '128')} MiB/s per target); "
            f"members {still['members']}",
            flush=True,
        )
        after = measure(ep, n, args.seconds, args.clients, args.threads)
        show("after (4 targets)", after)
    ratio = during["gets_per_s"] / before["gets_per_s"]
    print(f"GET throughput during / before rebalance: {ratio:.2f} (goal >= 0.7)")
    same = during["gets_per_s"] / after["gets_per_s"]
    print(f"GET throughput during / after rebalance (same 4 targets): {same:.2f}")
    if took < args.seconds:
        print(f"note: the rebalance ({took:.1f}s) ended inside the {args.seconds:g}s window")


if __name__ == "__main__":
    main()
