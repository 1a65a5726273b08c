"""Batch jobs: offline transform vs inline GETs, and GETs served during a job.

One run starts a real local cluster (``sluice up`` as a child: gateway,
``--targets`` targets, a transformer per target) and runs each section
(``--only`` picks some):

``transform``
    Uploads ``--objects`` objects of ``--size`` bytes to bucket ``src`` and an
    equal set to bucket ``serve``, then, alternating for ``--rounds``:

    * offline: ``bucket("src").transform(ETL, to_bucket=...)`` until Finished;
    * inline: ``--clients`` concurrent clients GET each object of ``src``
      through the ETL and PUT the result into another bucket (the same end
      state: a transformed bucket), also timed GET-only;

    and prints objects/s of each and offline ÷ inline (goal >= 1.0). Then a
    reader (``--reader-clients`` concurrent plain GETs of ``serve``) runs
    once alone and once during an offline transform of the same duration;
    GET/s during ÷ alone says how much serving a job takes away. The load
    generator's CPU per request is printed for the inline and reader runs.

``dsort``
    ``bench/dsort.py``'s comparison on the same cluster: ``--dsort-mb`` of
    shards shuffled by dSort ÷ one process with webdataset + ShardWriter, and
    a reader's GET/s during the job ÷ without (one round; ``bench/dsort.py``
    alone runs more rounds).

    .venv/bin/python bench/jobs.py [--only transform] [--targets 3] [--objects 600]
        [--job-workers N]   # the job's objects in flight per target beside the reader
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.local import LocalCluster  # noqa: E402
from etl_runtime.sdk import Client  # noqa: E402

ETL = "bench-xor"
# Touches every byte (a small, real transform): XOR with 0x5a via bytes.translate.
SPEC = {
    "mode": "object",
    "code": {
        "source": "T = bytes(b ^ 0x5A for b in range(256))\n"
        "def transform(data):\n"
        "    return data.translate(T)\n"
    },
}


def wait_etl(http: httpx.Client, name: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while http.get(f"/v1/etl/{name}").json().get("phase") != "Running":
        if time.monotonic() > deadline:
            raise SystemExit(f"ETL {name} did not reach Running")
        time.sleep(0.3)


async def upload(endpoint: str, bucket: str, names: list[str], size: int) -> None:
    data = os.urandom(size)
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=endpoint, follow_redirects=True, timeout=60) as c:
        (await c.post(f"/v1/buckets/{bucket}", json={"action": "create-bck"})).raise_for_status()

        async def one(n: str) -> None:
            async with sem:
                (await c.put(f"/v1/objects/{bucket}/{n}", content=data)).raise_for_status()

        await asyncio.gather(*(one(n) for n in names))


async def inline(endpoint: str, names: list[str], clients: int, put_to: str | None) -> float:
    """Seconds for ``clients`` workers to GET every name through the ETL (and PUT it)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for n in names:
        queue.put_nowait(n)
    async with httpx.AsyncClient(
        base_url=endpoint,
        follow_redirects=True,
        timeout=120,
        limits=httpx.Limits(max_connections=clients * 2),
    ) as c:
        if put_to:
            await c.post(f"/v1/buckets/{put_to}", json={"action": "create-bck"})

        async def worker() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                r = await c.get(f"/v1/objects/src/{n}", params={"etl_name": ETL})
                r.raise_for_status()
                if put_to:
                    (await c.put(f"/v1/objects/{put_to}/{n}", content=r.content)).raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - start


def offline(client: Client, to_bucket: str, workers: int = 0) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    job = client.bucket("src").transform(ETL, to_bucket=to_bucket, num_workers=workers)
    status = job.wait(timeout=1800, poll=0.1)
    return time.perf_counter() - start, status


async def reader(endpoint: str, names: list[str], clients: int, stop: Callable[[], bool]) -> dict:
    """Plain GETs of bucket ``serve`` until ``stop()``; GET/s and CPU per GET here."""
    count = 0
    errors = 0
    async with httpx.AsyncClient(
        base_url=endpoint,
        follow_redirects=True,
        timeout=60,
        limits=httpx.Limits(max_connections=64),
    ) as c:

        async def worker(i: int) -> None:
            nonlocal count, errors
            while not stop():
                r = await c.get(f"/v1/objects/serve/{names[(count + i) % len(names)]}")
                if r.status_code == 200:
                    count += 1
                else:
                    errors += 1

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "gets_per_s": count / wall,
        "errors": errors,
        "cpu_ms_per_get": 1000 * cpu / max(1, count),
    }


def section_transform(cluster: LocalCluster, args: argparse.Namespace) -> None:
    endpoint = cluster.endpoint.rstrip("/")
    names = [f"o{i:05d}" for i in range(args.objects)]
    http = httpx.Client(base_url=endpoint, timeout=60)
    http.put("/v1/etl", json={"name": ETL, "spec": SPEC}).raise_for_status()
    wait_etl(http, ETL)
    asyncio.run(upload(endpoint, "src", names, args.size))
    asyncio.run(upload(endpoint, "serve", names[: args.objects // 2], args.size))
    mb = args.objects * args.size / 1e6
    client = Client(endpoint, timeout=120)
    rows: dict[str, list[float]] = {"offline": [], "inline_get_put": [], "inline_get": []}
    for r in range(args.rounds):
        secs, status = offline(client, f"off-{r}")
        assert status["progress"]["objects"] == args.objects, status
        rows["offline"].append(args.objects / secs)
        cpu0 = time.process_time()
        secs = asyncio.run(inline(endpoint, names, args.clients, f"inl-{r}"))
        cpu_inline = 1000 * (time.process_time() - cpu0) / (2 * args.objects)
        rows["inline_get_put"].append(args.objects / secs)
        secs = asyncio.run(inline(endpoint, names, args.clients, None))
        rows["inline_get"].append(args.objects / secs)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n== offline transform vs inline ({args.objects} x {args.size} B = {mb:.0f} MB) ==")
    for k, v in med.items():
        print(
            f"{k:>16}: {v:8.1f} objects/s  {v * args.size / 1e6:7.1f} MB/s  (rounds: "
            + ", ".join(f"{x:.1f}" for x in rows[k])
            + ")"
        )
    print(f"inline load generator CPU per request: {cpu_inline:.2f} ms")
    print(
        f"offline / inline GET+PUT ({args.clients} clients): "
        f"{med['offline'] / med['inline_get_put']:.2f}  (goal >= 1.0)"
    )
    print(f"offline / inline GET only:           {med['offline'] / med['inline_get']:.2f}")

    # A reader alone, then during a job.
    serve = names[: args.objects // 2]
    secs, _ = offline(client, "probe", args.job_workers)  # how long a job takes now
    t_end = time.monotonic() + secs
    alone = asyncio.run(
        reader(endpoint, serve, args.reader_clients, lambda: time.monotonic() > t_end)
    )
    job = client.bucket("src").transform(ETL, to_bucket="during", num_workers=args.job_workers)
    done = {"flag": False}

    def finished() -> bool:
        if not done["flag"]:
            done["flag"] = client.job(job.id).status()["state"] != "Running"
        return done["flag"]

    async def during_job() -> dict:
        stop_at = {"t": 0.0}

        def stop() -> bool:
            now = time.monotonic()
            if now - stop_at["t"] > 0.2:  # poll the job at most 5x/s
                stop_at["t"] = now
                return finished()
            return False

        return await reader(endpoint, serve, args.reader_clients, stop)

    during = asyncio.run(during_job())
    print(
        f"\n== GETs of a concurrent reader ({args.reader_clients} clients, plain GET), "
        f"job num_workers={args.job_workers or 4} =="
    )
    print(f"   alone: {alone['gets_per_s']:8.1f} GET/s, {alone['cpu_ms_per_get']:.2f} ms CPU/GET")
    print(
        f"  during: {during['gets_per_s']:8.1f} GET/s, {during['cpu_ms_per_get']:.2f} ms CPU/GET, "
        f"{during['errors']} errors"
    )
    print(f"during / alone: {during['gets_per_s'] / alone['gets_per_s']:.2f}")
    client.close()
    http.close()


def section_dsort(cluster: LocalCluster, args: argparse.Namespace) -> None:
    """dSort shuffle ÷ a single-process webdataset shuffle, and a reader during it."""
    from bench.dsort import run_section

    print(f"\n== dSort shuffle of {args.dsort_mb} MB vs one process (bench/dsort.py) ==")
    with tempfile.TemporaryDirectory(prefix="sluice-bench-dsort-") as tmp:
        run_section(cluster, Path(tmp), args.dsort_mb, 10, args.dsort_shard_mb, 1, 4, 5.0)


SECTIONS: dict[str, Callable[[LocalCluster, argparse.Namespace], None]] = {
    "transform": section_transform,
    "dsort": section_dsort,
}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", action="append", choices=sorted(SECTIONS), help="run only these")
    p.add_argument("--targets", type=int, default=3)
    p.add_argument("--objects", type=int, default=600)
    p.add_argument("--size", type=int, default=64 << 10)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--reader-clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dsort-mb", type=int, default=200, help="dsort: input size (issue: 1000)")
    p.add_argument("--dsort-shard-mb", type=int, default=20, help="dsort: output shard size")
    p.add_argument("--job-workers", type=int, default=0, help="the job beside the reader (0: 4)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-jobs-") as tmp:
        with LocalCluster(Path(tmp) / "data", targets=args.targets) as cluster:
            print(f"cluster: {args.targets} targets at {cluster.endpoint}, cpus={os.cpu_count()}")
            for name in args.only or list(SECTIONS):
                SECTIONS[name](cluster, args)


if __name__ == "__main__":
    main()
