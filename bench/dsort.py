"""dSort shuffle on a 3-target local cluster ÷ a single-process webdataset shuffle.

Builds ``--size-mb`` of WebDataset shards (real JPEGs of noise, plus ``.cls``
and ``.json``, written with ``webdataset.ShardWriter``, ~``--input-shard-mb``
each), starts ``sluice up --targets 3`` (real processes, as a user would) and
uploads them. Then, ``--rounds`` times, alternating:

* **baseline** — one process reads every shard through the gateway with
  ``wds.WebDataset`` (no decoding), shuffles the samples in memory and writes
  them with ``wds.ShardWriter(maxsize=output shard size)`` to local disk;
* **dSort** — ``POST /v1/dsort`` with the seed's spec (shuffle, ``--shard-mb``
  output shards) and poll ``GET /v1/jobs/{id}`` until ``Finished``.

Then the GET throughput of a concurrent reader (``--clients`` httpx clients
reading 64 KiB objects of another bucket) while a dSort runs ÷ the same
reader without a job. Prints both times, the ratio baseline/dSort (> 1: dSort
is faster), the cluster's CPU seconds for the job (psutil over ``sluice up``'s
process tree) against the baseline's, the reader ratio and the reader's CPU
milliseconds per GET (the load generator's own cost).

    .venv/bin/python bench/dsort.py [--size-mb 200] [--shard-mb 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import webdataset as wds
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.local import LocalCluster  # noqa: E402


def make_shards(directory: Path, size_mb: int, shard_mb: int) -> list[Path]:
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    i = 0
    pattern = str(directory / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_mb * 1_000_000, verbose=0) as sink:
        while total < size_mb * 1_000_000:
            side = int(rng.integers(96, 192))
            img = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=85)
            jpg = buf.getvalue()
            sink.write(
                {
                    "__key__": f"sample{i:08d}",
                    "jpg": jpg,
                    "cls": str(i % 10).encode(),
                    "json": json.dumps({"i": i}).encode(),
                }
            )
            total += len(jpg) + 1536
            i += 1
    return sorted(directory.glob("shard-*.tar"))


def cluster_cpu(pid: int) -> float:
    """CPU seconds used so far by ``sluice up`` and all its children."""
    total = 0.0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def baseline(url: str, names: list[str], out: Path, shard_bytes: int) -> float:
    """Read every shard with webdataset, shuffle in memory, write with ShardWriter."""
    t0 = time.perf_counter()
    urls = [f"{url}/v1/objects/images/{n}" for n in names]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    random.Random(1).shuffle(samples)
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "base-%06d.tar"), maxsize=shard_bytes, verbose=0) as sink:
        for s in samples:
            sink.write({k: v for k, v in s.items() if k != "__url__"})
    return time.perf_counter() - t0


def run_dsort(http: httpx.Client, names: int, shard_mb: int, out_bck: str) -> dict[str, Any]:
    spec = {
        "extension": ".tar",
        "bck": {"name": "images", "provider": "ais"},
        "input_format": f"shard-{{000000..{names - 1:06d}}}",
        "output_format": "shuffled-%06d.tar",
        "output_shard_size": f"{shard_mb}MB",
        "algorithm": {"kind": "shuffle", "seed": "42"},
        "output_bck": {"name": out_bck},
        "description": "bench",
    }
    t0 = time.perf_counter()
    r = http.post("/v1/dsort", json=spec)
    r.raise_for_status()
    job_id = r.json()["id"]
    while True:
        view = http.get(f"/v1/jobs/{job_id}").json()
        if view["state"] != "Running":
            break
        time.sleep(0.05)
    view["seconds"] = time.perf_counter() - t0
    if view["state"] != "Finished":
        raise SystemExit(f"dsort job {job_id} {view['state']}: {view.get('reason')}")
    return dict(view)


class Reader:
    """``clients`` concurrent GET loops over small objects, in a thread of their own."""

    def __init__(self, url: str, names: list[str], clients: int) -> None:
        self.url, self.names, self.clients = url, names, clients
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        cpu0 = time.thread_time()
        async with httpx.AsyncClient(base_url=self.url, follow_redirects=True) as http:

            async def loop(k: int) -> None:
                i = k
                while not self.stop.is_set():
                    r = await http.get(f"/v1/objects/small/{self.names[i % len(self.names)]}")
                    r.raise_for_status()
                    self.count += 1
                    i += self.clients

            await asyncio.gather(*(loop(k) for k in range(self.clients)))
        self.cpu = time.thread_time() - cpu0

    def __enter__(self) -> Reader:
        self.t0 = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.seconds = time.perf_counter() - self.t0

    @property
    def rate(self) -> float:
        return self.count / self.seconds


def run_section(
    cluster: LocalCluster,
    work: Path,
    size_mb: int,
    input_shard_mb: int,
    shard_mb: int,
    rounds: int,
    clients: int,
    reader_seconds: float,
) -> None:
    """The whole comparison on a running cluster (``bench/jobs.py`` calls it too)."""
    t = time.perf_counter()
    shards = make_shards(work / "in", size_mb, input_shard_mb)
    size = sum(p.stat().st_size for p in shards)
    print(f"data: {len(shards)} shards, {size / 1e6:.0f} MB ({time.perf_counter() - t:.0f}s)")
    url = cluster.endpoint.rstrip("/")
    http = httpx.Client(base_url=url, timeout=120, follow_redirects=True)
    for b in ("images", "small"):
        http.post(f"/v1/buckets/{b}", json={"action": "create-bck"}).raise_for_status()
    for p in shards:
        http.put(f"/v1/objects/images/{p.name}", content=p.read_bytes()).raise_for_status()
    small = [f"o{i:04d}" for i in range(200)]
    blob = bytes(64 * 1024)
    for n in small:
        http.put(f"/v1/objects/small/{n}", content=blob).raise_for_status()

    base_t, dsort_t, base_cpu, dsort_cpu = [], [], [], []
    for r in range(rounds):
        c0 = time.process_time()
        base_t.append(baseline(url, [p.name for p in shards], work / f"b{r}", shard_mb * 10**6))
        base_cpu.append(time.process_time() - c0)
        c0 = cluster_cpu(cluster.pid)
        view = run_dsort(http, len(shards), shard_mb, f"out{r}")
        dsort_cpu.append(cluster_cpu(cluster.pid) - c0)
        dsort_t.append(view["seconds"])
        print(
            f"round {r}: baseline {base_t[-1]:.1f}s, dsort {dsort_t[-1]:.1f}s "
            f"({view['output']['shards']} shards, {view['progress']['records']} records)"
        )
    b, d = statistics.median(base_t), statistics.median(dsort_t)
    bc, dc = statistics.median(base_cpu), statistics.median(dsort_cpu)
    print(f"baseline (1 process, webdataset + ShardWriter): {b:.1f}s, CPU {bc:.1f}s")
    print(f"dsort (3 targets):                  {d:.1f}s, cluster CPU {dc:.1f}s")
    print(f"ratio baseline/dsort: {b / d:.2f}  (>= 1.0: dSort is at least as fast)")

    with Reader(url, small, clients) as idle:
        time.sleep(reader_seconds)
    with Reader(url, small, clients) as busy:
        run_dsort(http, len(shards), shard_mb, "during")
    print(
        f"reader GETs/s: without a job {idle.rate:.0f}, during dsort {busy.rate:.0f} "
        f"({busy.seconds:.1f}s) -> ratio {busy.rate / idle.rate:.2f}; reader CPU "
        f"{1000 * idle.cpu / idle.count:.2f} / {1000 * busy.cpu / busy.count:.2f} ms/GET"
    )
    http.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=200, help="input data (default 200)")
    ap.add_argument("--input-shard-mb", type=int, default=10)
    ap.add_argument("--shard-mb", type=int, default=20, help="output shard size in MB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="concurrent reader clients")
    ap.add_argument("--reader-seconds", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-dsort-") as tmp:
        with LocalCluster(Path(tmp) / "cluster", targets=3) as cluster:
            run_section(
                cluster,
                Path(tmp),
                args.size_mb,
                args.input_shard_mb,
                args.shard_mb,
                args.rounds,
                args.clients,
                args.reader_seconds,
            )


if __name__ == "__main__":
    main()
