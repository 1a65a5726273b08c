"""GET throughput through gateway -> target, plain vs ``?etl_name=identity``.

Starts a real local cluster as child processes — a gateway, two targets and,
beside each target, an identity transformer (``python -m etl_runtime.webserver``
with ``def transform(data): return data``) — uploads objects of 16 KiB and
1 MiB, then has several concurrent clients (httpx, following the gateway's 307)
read them for a fixed time, plainly and then through the ETL (``--rounds``
pairs, alternating, so a machine whose load changes affects both alike), and
prints objects/s, MB/s, CPU milliseconds per object of each process role
(client, gateway, target, transformer server, workers: load-independent, unlike
the rates) and the ETL/plain ratio for each size (median over the rounds).

Gateway and targets share a cluster map (``DIR/cluster.json``) as under
``sluice up``, so placement, ownership checks and the map's per-request reads
are measured too. ``SLUICE_LOOP=asyncio|uvloop`` picks the servers' event loop.

The targets learn their transformer from a ``FileRegistry`` directory that this
script writes itself (``DIR/etl/identity.json`` = ``EtlRecord.to_dict()``), so
the measurement covers the data path only, not the local ETL controller.

    .venv/bin/python bench/get_throughput.py [--clients 8] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime import auth  # noqa: E402
from etl_runtime.cluster import EtlRecord, TransformerStatus  # noqa: E402
from etl_runtime.spec import EtlSpec  # noqa: E402
from tests.servers import free_port, serve_process  # noqa: E402

ETL = "identity"
UID = "bench-uid"
SPEC = {"mode": "object", "code": {"source": "def transform(data):\n    return data\n"}}


@contextlib.contextmanager
def local_cluster(workdir: Path, transformer_workers: int) -> Iterator[str]:
    """Gateway + 2 targets + 2 identity transformers; yields the gateway URL."""
    key = auth.new_key()
    base_env = {"SLUICE_CLUSTER_KEY": key, "PYTHONUNBUFFERED": "1"}
    with contextlib.ExitStack() as stack:
        transformers: dict[str, str] = {}
        for tid in ("t0", "t1"):
            port = free_port()
            env = {
                **base_env,
                "SLUICE_ETL_NAME": ETL,
                "SLUICE_ETL_SPEC": json.dumps(SPEC),
                "SLUICE_ETL_TOKEN": auth.transformer_token(key, ETL, UID),
            }
            url = f"http://127.0.0.1:{port}"
            args = [
                "-m",
                "etl_runtime.webserver",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(transformer_workers),
            ]
            stack.enter_context(serve_process(args, f"{url}/health", env=env, timeout=120))
            transformers[tid] = url
        registry_dir = workdir / "etl"
        registry_dir.mkdir(parents=True)
        record = EtlRecord(
            name=ETL,
            uid=UID,
            spec=EtlSpec.from_dict(SPEC),
            phase="Running",
            transformers=tuple(
                TransformerStatus(target=t, endpoint=u, ready=True) for t, u in transformers.items()
            ),
        )
        (registry_dir / f"{ETL}.json").write_text(json.dumps(record.to_dict()))
        targets = []
        for tid in ("t0", "t1"):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            args = [
                "-m",
                "etl_runtime.target",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--id",
                tid,
                "--data-dir",
                str(workdir / "targets" / tid),
                "--registry",
                f"file:{registry_dir}",
                "--cluster-map",
                f"file:{workdir / 'cluster.json'}",
            ]
            stack.enter_context(serve_process(args, f"{url}/v1/health", env=base_env))
            targets.append(f"{tid}={url}")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = [
            "-m",
            "etl_runtime.gateway",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--targets",
            ",".join(targets),
            "--state-dir",
            str(workdir / "gateway-state"),
            "--cluster-map",
            f"file:{workdir / 'cluster.json'}",
        ]
        stack.enter_context(serve_process(args, f"{url}/v1/health", env=base_env))
        yield url


async def upload(client: httpx.AsyncClient, names: list[str], size: int) -> None:
    sem = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with sem:
            r = await client.put(f"/v1/objects/bench/{name}", content=os.urandom(size))
            r.raise_for_status()

    await asyncio.gather(*(one(n) for n in names))


async def measure(
    client: httpx.AsyncClient, names: list[str], size: int, etl: bool, clients: int, seconds: float
) -> tuple[float, float, int]:
    """Objects/s and MB/s over ``seconds`` with ``clients`` concurrent readers."""
    params = {"etl_name": ETL} if etl else {}
    count = 0
    nbytes = 0
    bad = 0
    deadline = 0.0

    async def reader(i: int) -> None:
        nonlocal count, nbytes, bad
        j = i
        while time.perf_counter() < deadline:
            r = await client.get(f"/v1/objects/bench/{names[j % len(names)]}", params=params)
            j += clients
            if r.status_code != 200 or len(r.content) != size:
                bad += 1
                continue
            count += 1
            nbytes += len(r.content)

    deadline = time.perf_counter() + min(1.0, seconds / 4)  # warm-up: connections, caches
    await asyncio.gather(*(reader(i) for i in range(clients)))
    count = nbytes = 0
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(*(reader(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    return count / elapsed, nbytes / elapsed / 1e6, bad


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of this process (``client``) and each cluster process, by role."""
    import psutil  # dev dependency, only needed here

    out: dict[str, float] = {}
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            cmd = " ".join(proc.cmdline())
            t = proc.cpu_times()
        except psutil.Error:
            continue
        if proc.pid == me.pid:
            role = "client"
        elif "multiprocessing" in cmd:  # forkserver and its workers
            role = "worker"
        elif "etl_runtime.webserver" in cmd:
            role = "transformer"
        elif "etl_runtime.target" in cmd:
            role = "target"
        elif "etl_runtime.gateway" in cmd:
            role = "gateway"
        else:
            role = "other"
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


async def run(gateway: str, args: argparse.Namespace) -> None:
    limits = httpx.Limits(
        max_connections=args.clients * 4, max_keepalive_connections=args.clients * 4
    )
    async with httpx.AsyncClient(
        base_url=gateway, follow_redirects=True, timeout=120, limits=limits, trust_env=False
    ) as client:
        r = await client.post("/v1/buckets/bench", json={"action": "create-bck"})
        r.raise_for_status()
        sizes = {"16KiB": (16 << 10, args.small), "1MiB": (1 << 20, args.large)}
        print(
            f"gateway {gateway}; {args.clients} concurrent clients, {args.seconds:.0f}s per row, "
            f"{args.rounds} round(s) alternating plain/etl"
        )
        print(f"{'size':>6} {'mode':>9} {'objects/s':>10} {'MB/s':>9} {'errors':>6}  CPU ms/object")
        ratios: dict[str, list[float]] = {}
        for label, (size, n) in sizes.items():
            names = [f"{label}/obj-{i:05d}" for i in range(n)]
            await upload(client, names, size)
            for _ in range(args.rounds):
                row = {}
                for mode in ("plain", "etl"):
                    before = cpu_by_role()
                    ops, mbs, bad = await measure(
                        client, names, size, mode == "etl", args.clients, args.seconds
                    )
                    after = cpu_by_role()
                    count = max(1.0, ops * args.seconds)
                    spent = {k: (after[k] - before.get(k, 0.0)) * 1e3 / count for k in after}
                    cpu = " ".join(f"{k}={v:.1f}" for k, v in sorted(spent.items()) if v >= 0.05)
                    row[mode] = ops
                    print(
                        f"{label:>6} {mode:>9} {ops:>10.1f} {mbs:>9.1f} {bad:>6}  "
                        f"total={sum(spent.values()):.1f} ({cpu})"
                    )
                ratio = row["etl"] / row["plain"] if row["plain"] else float("nan")
                ratios.setdefault(label, []).append(ratio)
        for label, values in ratios.items():
            each = ", ".join(f"{v:.2f}" for v in values)
            print(
                f"{label}: identity ETL / plain throughput = {statistics.median(values):.2f}"
                + (f" (median of {each})" if len(values) > 1 else "")
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=8, help="concurrent readers")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring time per row")
    p.add_argument("--small", type=int, default=500, help="number of 16 KiB objects")
    p.add_argument("--large", type=int, default=50, help="number of 1 MiB objects")
    p.add_argument("--transformer-workers", type=int, default=1, help="workers per transformer")
    p.add_argument(
        "--rounds", type=int, default=1, help="plain/etl pairs per size (the median ratio is shown)"
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        with local_cluster(Path(tmp), args.transformer_workers) as gateway:
            asyncio.run(run(gateway, args))


if __name__ == "__main__":
    main()
