"""GET throughput through gateway -> target, plain vs ``?etl_name=identity``.

Starts a real local cluster as child processes — a gateway, two targets and,
beside each target, an identity transformer (``python -m etl_runtime.webserver``
with ``def transform(data): return data``) — uploads objects of 16 KiB and
1 MiB, then has ``--clients`` concurrent readers read them for a fixed time,
plainly and then through the ETL (``--rounds`` pairs, alternating, so a machine
whose load changes affects both alike), and prints objects/s, MB/s, CPU
milliseconds per object of each process role (client, gateway, target,
transformer server, workers: load-independent, unlike the rates), the ETL/plain
ratio for each size (median over the rounds) and the servers' CPU per ETL GET
over that per plain GET.

The readers are ``bench/loadgen.py``: ``--client-procs`` processes with raw
HTTP/1.1 connections that follow the gateway's 307, so the client is not the
bottleneck (its CPU per object is printed as ``client``). ``--direct`` adds a
row per size that skips gateway and target: hpush with ``etl_fqn`` straight to
a transformer, the most a "307 to the transformer" answer path could gain.
Targets pass ``etl_fqn`` as under ``sluice up`` (``SLUICE_ETL_FQN=always``);
``--no-fqn`` sends the object bytes instead. ``--redirect-bytes`` sets the
targets' ``SLUICE_ETL_REDIRECT_BYTES``: objects at least that big are answered
by a 307 from the target to its transformer, which serves the client itself
(``0``, the targets' default: every object; ``off``: the target relays every
answer).

Gateway and targets share a cluster map (``DIR/cluster.json``) as under
``sluice up``, so placement, ownership checks and the map's per-request reads
are measured too. ``SLUICE_LOOP=asyncio|uvloop`` picks the servers' event loop.

The targets learn their transformer from a ``FileRegistry`` directory that this
script writes itself (``DIR/etl/identity.json`` = ``EtlRecord.to_dict()``), so
the measurement covers the data path only, not the local ETL controller.

    .venv/bin/python bench/get_throughput.py [--clients 16] [--client-procs 4]
        [--seconds 5] [--rounds 3] [--transformer-servers 2 --transformer-workers 2 --inline]
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
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.cluster.records import EtlRecord, TransformerStatus  # noqa: E402
from etl_runtime.core import auth  # noqa: E402
from etl_runtime.core.spec import EtlSpec  # noqa: E402
from tests.servers import free_port, serve_process  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import Req, Result, run_load  # noqa: E402

ETL = "identity"
UID = "bench-uid"
SPEC = {"mode": "object", "code": {"source": "def transform(data):\n    return data\n"}}


@contextlib.contextmanager
def local_cluster(workdir: Path, args: argparse.Namespace) -> Iterator[tuple[str, dict[str, str]]]:
    """Gateway + 2 targets + 2 identity transformers; yields the gateway URL and
    the transformers' {target id: URL}."""
    key = auth.new_key()
    os.environ["BENCH_CLUSTER_KEY"] = key  # for --direct requests
    base_env = {"SLUICE_CLUSTER_KEY": key, "PYTHONUNBUFFERED": "1"}
    target_env = {**base_env, "SLUICE_ETL_FQN": "never" if args.no_fqn else "always"}
    if args.redirect_bytes is not None:
        target_env["SLUICE_ETL_REDIRECT_BYTES"] = args.redirect_bytes
    with contextlib.ExitStack() as stack:
        transformers: dict[str, str] = {}
        for tid in ("t0", "t1"):
            port = free_port()
            env = {
                **base_env,
                "SLUICE_ETL_NAME": ETL,
                "SLUICE_ETL_SPEC": json.dumps(SPEC),
                "SLUICE_ETL_TOKEN": auth.transformer_token(key, ETL, UID),
                "SLUICE_DATA_ROOTS": str(workdir / "targets" / tid),
                "SLUICE_SERVERS": str(args.transformer_servers),
                "SLUICE_INLINE": "1" if args.inline else "",
            }
            url = f"http://127.0.0.1:{port}"
            argv = [
                "-m",
                "etl_runtime.webserver",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(args.transformer_workers),
            ]
            stack.enter_context(serve_process(argv, f"{url}/health", env=env, timeout=120))
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
            argv = [
                "-m",
                "etl_runtime.storage_target",
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
            stack.enter_context(serve_process(argv, f"{url}/v1/health", env=target_env))
            targets.append(f"{tid}={url}")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [
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
        stack.enter_context(serve_process(argv, f"{url}/v1/health", env=base_env))
        yield url, transformers


async def upload(client: httpx.AsyncClient, names: list[str], size: int) -> None:
    sem = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with sem:
            r = await client.put(f"/v1/objects/bench/{name}", content=os.urandom(size))
            r.raise_for_status()

    await asyncio.gather(*(one(n) for n in names))


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of each cluster process, by role (clients report their own)."""
    import psutil  # dev dependency, only needed here

    out: dict[str, float] = {}
    me = psutil.Process()
    for proc in me.children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            name = proc.name()
            t = proc.cpu_times()
        except psutil.Error:
            continue
        # workers and their helper are forks of the transformer, named by prctl
        if name in ("sluice-worker", "sluice-forker") or "multiprocessing" in cmd:
            role = "worker"
        elif "etl_runtime.webserver" in cmd:
            role = "transformer"
        elif "etl_runtime.storage_target" in cmd:
            role = "target"
        elif "etl_runtime.gateway" in cmd:
            role = "gateway"
        else:
            continue  # load generator processes: they count their own CPU
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


SERVER_ROLES = ("gateway", "target", "transformer", "worker")


def measure_row(reqs: list[Req], args: argparse.Namespace) -> tuple[Result, dict[str, float]]:
    before = cpu_by_role()
    result = run_load(reqs, args.clients, args.seconds, args.client_procs, args.warmup)
    after = cpu_by_role()
    count = max(1, result.requests)
    # CPU over the warm-up too, divided by the measured requests: an upper bound,
    # the same for every row (warm-up share = warmup / (warmup + seconds)).
    scale = args.seconds / (args.seconds + args.warmup + 0.3)
    spent = {k: (after[k] - before.get(k, 0.0)) * scale * 1e3 / count for k in after}
    spent["client"] = result.client_cpu_ms
    return result, spent


async def prepare(gateway: str, args: argparse.Namespace) -> dict[str, list[str]]:
    async with httpx.AsyncClient(base_url=gateway, follow_redirects=True, timeout=120) as client:
        r = await client.post("/v1/buckets/bench", json={"action": "create-bck"})
        r.raise_for_status()
        out = {}
        for label, (size, n) in sizes(args).items():
            names = [f"{label}/obj-{i:05d}" for i in range(n)]
            await upload(client, names, size)
            out[label] = names
        return out


def sizes(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """{label: (object size, count)}: ``--small`` objects below 1 MiB, ``--large`` from it."""
    out = {}
    for size in (int(x) for x in args.sizes.split(",")):
        label = f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"
        out[label] = (size, args.small if size < 1 << 20 else args.large)
    return out


def direct_requests(
    workdir: Path, transformers: dict[str, str], names: list[str], size: int
) -> list[Req]:
    """hpush with etl_fqn straight to the transformer beside the target holding each object."""
    from etl_runtime.storage.store import ObjectStore

    key = os.environ["BENCH_CLUSTER_KEY"]
    auth_header = (("Authorization", f"Bearer {auth.transformer_token(key, ETL, UID)}"),)
    reqs = []
    for name in names:
        for tid, url in transformers.items():
            try:
                path = ObjectStore(workdir / "targets" / tid).object_file("bench", name)
            except Exception:
                continue
            reqs.append(Req("PUT", f"{url}/bench/{name}?etl_fqn={path}", b"", auth_header, size))
            break
    return reqs


def run(
    gateway: str, transformers: dict[str, str], workdir: Path, args: argparse.Namespace
) -> None:
    objects = asyncio.run(prepare(gateway, args))
    print(
        f"{os.cpu_count()} CPUs; gateway {gateway}; {args.clients} concurrent requests from "
        f"{args.client_procs} client processes, {args.seconds:.0f}s per row, {args.rounds} "
        f"round(s) alternating plain/etl; transformers: {args.transformer_servers} server(s), "
        f"{args.transformer_workers} worker(s){', inline' if args.inline else ''}; "
        f"etl_fqn {'off' if args.no_fqn else 'on'}; redirect bytes "
        f"{args.redirect_bytes or 'default (0)'}"
    )
    print(
        f"{'size':>6} {'mode':>9} {'objects/s':>10} {'MB/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'errors':>6}  CPU ms/object"
    )
    ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    for label, (size, _) in sizes(args).items():
        names = objects[label]
        modes = {
            "plain": [
                Req("GET", f"{gateway}/v1/objects/bench/{n}", expect_len=size) for n in names
            ],
            "etl": [
                Req("GET", f"{gateway}/v1/objects/bench/{n}?etl_name={ETL}", expect_len=size)
                for n in names
            ],
        }
        if args.direct:
            modes["direct"] = direct_requests(workdir, transformers, names, size)
        for _ in range(args.rounds):
            row: dict[str, tuple[Result, dict[str, float]]] = {}
            for mode, reqs in modes.items():
                result, spent = measure_row(reqs, args)
                row[mode] = (result, spent)
                cpu = " ".join(f"{k}={v:.2f}" for k, v in sorted(spent.items()) if v >= 0.005)
                server = sum(v for k, v in spent.items() if k in SERVER_ROLES)
                mbs = result.nbytes / args.seconds / 1e6
                print(
                    f"{label:>6} {mode:>9} {result.rate:>10.1f} {mbs:>9.1f} "
                    f"{result.p50_ms:>7.2f} {result.p99_ms:>7.2f} {result.errors:>6}  "
                    f"server={server:.2f} ({cpu})"
                    + (f"  first error: {result.first_error}" if result.errors else ""),
                    flush=True,
                )
            plain, etl = row["plain"], row["etl"]
            if plain[0].rate:
                ratios.setdefault(label, []).append(etl[0].rate / plain[0].rate)
            server_plain = sum(v for k, v in plain[1].items() if k in SERVER_ROLES)
            server_etl = sum(v for k, v in etl[1].items() if k in SERVER_ROLES)
            if server_plain:
                cpu_ratios.setdefault(label, []).append(server_etl / server_plain)
    for label, values in ratios.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        cpu = cpu_ratios.get(label, [float("nan")])
        print(
            f"{label}: identity ETL / plain throughput = {statistics.median(values):.2f}"
            + (f" (median of {each})" if len(values) > 1 else "")
            + f"; server CPU per ETL GET / per plain GET = {statistics.median(cpu):.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=16, help="concurrent requests")
    p.add_argument("--client-procs", type=int, default=4, help="load generator processes")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring time per row")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each row")
    p.add_argument("--small", type=int, default=500, help="objects of each size under 1 MiB")
    p.add_argument("--large", type=int, default=50, help="objects of each size from 1 MiB")
    p.add_argument(
        "--sizes", default="16384,1048576", help="object sizes in bytes, comma-separated"
    )
    p.add_argument("--transformer-workers", type=int, default=1, help="workers per transformer")
    p.add_argument("--transformer-servers", type=int, default=1, help="server processes each")
    p.add_argument("--inline", action="store_true", help="transformers run the code inline")
    p.add_argument("--no-fqn", action="store_true", help="targets send object bytes, not etl_fqn")
    p.add_argument("--direct", action="store_true", help="also hpush etl_fqn to transformers")
    p.add_argument(
        "--redirect-bytes",
        default=None,
        help="targets' SLUICE_ETL_REDIRECT_BYTES (0: 307 every ETL GET to the transformer, "
        "off: relay all)",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="plain/etl pairs per size (the median ratio is shown)"
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        with local_cluster(Path(tmp), args) as (gateway, transformers):
            run(gateway, transformers, Path(tmp), args)


if __name__ == "__main__":
    main()
