"""GetBatch vs individual GETs of the same objects, at the same client concurrency.

Starts ``sluice up`` (``LocalCluster``, ``--targets`` targets), stores
``--small-count`` objects of 10 KiB and ``--large-count`` of 1 MiB, then for
each size measures, alternating (``--rounds`` pairs, medians reported):

* ``get``: ``--clients`` connections, each reading one object after another
  (``GET /v1/objects/...`` to the gateway, then the target it redirects to);
* ``batch``: ``--clients`` connections, each reading one GetBatch of
  ``--batch`` objects after another (``GET /v1/ml/moss/...``, ``strm``, the
  TAR stream read to its end; the gateway's 307 to the target it designates
  to assemble the batch is followed with the body, as the SDKs do).

Two clients do the reading. ``raw``: ``bench/loadgen.py`` (processes x threads
of plain sockets that follow the 307; the batch's TAR is read but not parsed),
so the client is not the bottleneck and the servers' costs show. ``sdk``: the
official ``aistore`` SDK in ``--clients`` forked processes, as a training job
would read (``obj.get_reader().read_all()`` vs ``client.batch(...).get()``,
every item extracted). For each it prints items/s, MB/s, the client's CPU per
item and the servers' (gateway, targets: psutil over ``sluice up``'s
processes, the warm-up share included) and the batch / get ratios.

    .venv/bin/python bench/batch.py [--clients 8] [--batch 64] [--large-batch 16]
        [--seconds 4] [--rounds 2] [--etl-sizes 10KiB] [--rss-gb 2]

With an object ETL (``--etl-sizes``, default 10 KiB; raw client): the same
pair through ETL ``bench-rev`` (an object ETL that reverses the bytes):
``get`` is ``GET /v1/objects/...?etl_name=bench-rev`` (the gateway's 307,
then the target's 307 to its transformer, as any client follows it), ``batch``
is ``GET /v1/ml/moss/...?etl_name=bench-rev`` (every item transformed on its
own target, through the target's share). The transformers' CPU is shown too.

``--rss-gb 2`` then reads one GetBatch of 2 GB (8 MiB objects) to its end and
prints the gateway's and the largest target's RSS before and at their peak
(``--sizes ""`` for that alone); ``--rss-etl`` then reads the same batch
through ETL ``bench-rev`` (and prints the largest transformer process's own
memory, USS, too).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aistore.sdk import Client  # noqa: E402  (before the clients fork: imported once)

from etl_runtime import Client as SluiceClient  # noqa: E402
from etl_runtime.local import LocalCluster  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import Req, run_load  # noqa: E402

SIZES = {"10KiB": 10 << 10, "1MiB": 1 << 20}
BUCKET = "bench"


def cpu_by_pid() -> dict[tuple[str, int], float]:
    """CPU seconds of each server process, by (role, pid)."""
    out: dict[tuple[str, int], float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            t = proc.cpu_times()
        except psutil.Error:
            continue
        role = (
            "target"
            if "etl_runtime.storage_target" in cmd
            else "gateway"
            if "etl_runtime.gateway" in cmd
            else "transformer"
            if "etl_runtime.webserver" in cmd
            else None
        )
        if role:
            out[(role, proc.pid)] = t.user + t.system
    return out


def settle(quiet: float = 1.0, limit: float = 90.0) -> float:
    """Wait until the servers are idle (under 5% of a core over ``quiet`` s): the
    zygote's warm-up (imports of seconds of CPU after ``sluice up``) landed on the
    first row measured, and made its GETs look slower than they are. The wait."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        before = cpu_by_pid()
        time.sleep(quiet)
        if sum(cpu_spent(before).values()) < 0.05 * quiet:
            break
    return time.monotonic() - t0


def cpu_spent(before: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU seconds per role since ``before``, of the processes alive then and now (a
    process that started in between, such as a zygote's fork, counts from zero)."""
    out: dict[str, float] = {}
    for (role, pid), t in cpu_by_pid().items():
        out[role] = out.get(role, 0.0) + t - before.get((role, pid), t)
    return out


def rss_by_role() -> dict[str, int]:
    """Resident memory: the gateway's, the largest target's; for the transformers, the
    largest memory of a server's own (USS: they are forked from a zygote that
    preloads libraries and whose pages they share; the zygote itself is left out)."""
    out: dict[str, int] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            own = "etl_runtime.webserver" in cmd
            if own and "etl_runtime.webserver" not in " ".join(proc.parent().cmdline()):
                continue  # the zygote
            rss = proc.memory_full_info().uss if own else proc.memory_info().rss
        except (psutil.Error, AttributeError):
            continue
        for role in ("gateway", "storage_target", "webserver"):
            if f"etl_runtime.{role}" in cmd:
                out[role] = max(out.get(role, 0), rss)
    return out


def rss_check(url: str, gigabytes: float, etl: str = "") -> None:
    """One GetBatch of ``gigabytes`` (8 MiB objects, 16 of them over and over), read
    to its end while the servers' RSS is sampled every 0.1 s (through ``etl``: every
    item transformed on its target, whose outputs past its memory budget go to disk)."""
    size, names = 8 << 20, [f"rss/{i:02d}" for i in range(16)]
    if not etl:
        upload(url, names, size)
    n = int(gigabytes * 1e9) // size
    body = json.dumps({"in": [{"objname": names[i % 16]} for i in range(n)], "strm": True})
    before = rss_by_role()
    peak = dict(before)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for k, v in rss_by_role().items():
                peak[k] = max(peak.get(k, 0), v)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    got, t0 = 0, time.perf_counter()
    try:
        with httpx.stream(
            "GET",
            f"{url}/v1/ml/moss/{BUCKET}" + (f"?etl_name={etl}" if etl else ""),
            content=body.encode(),
            headers={"Content-Type": "application/json"},
            timeout=300,
            follow_redirects=True,  # to the target the gateway designates
        ) as r:
            r.raise_for_status()
            for chunk in r.iter_raw(1 << 20):
                got += len(chunk)
    finally:
        stop.set()
        sampler.join()
    secs = time.perf_counter() - t0
    if got != tar_size([size] * n):
        raise SystemExit(f"RSS check: {got} bytes, expected {tar_size([size] * n)}")
    print(
        f"# RSS over one GetBatch{' through ETL ' + etl if etl else ''} of {got / 1e9:.2f} GB "
        f"({n} x 8 MiB, {got / secs / 1e6:.0f} "
        f"MB/s): gateway {before['gateway'] >> 20} -> peak {peak['gateway'] >> 20} MiB, "
        f"largest target {before['storage_target'] >> 20} -> peak "
        f"{peak['storage_target'] >> 20} MiB"
        + (
            f", largest transformer server (USS) {before['webserver'] >> 20} -> peak "
            f"{peak['webserver'] >> 20} MiB"
            if etl and "webserver" in before
            else ""
        ),
        flush=True,
    )


def tar_size(sizes: list[int]) -> int:
    return sum(512 + -(-s // 512) * 512 for s in sizes) + 1024


def upload(url: str, names: list[str], size: int) -> None:
    data = bytes(range(256)) * (size // 256)
    with httpx.Client(base_url=url, timeout=120) as c, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: c.put(f"/v1/objects/{BUCKET}/{n}", content=data), names))


# -- the SDK client: forked processes, each timing its own CPU ----------------------


def _sdk_proc(
    url: str,
    names: list[str],
    mode: str,
    args: argparse.Namespace,
    first: int,
    start: object,
    q: object,
) -> None:
    ais = Client(url, timeout=(10, 120))
    bck = ais.bucket(BUCKET)
    start.wait()  # type: ignore[attr-defined]  # every client is up: the clock starts
    t0 = time.perf_counter() + args.warmup
    t1 = t0 + args.seconds
    i, items, nbytes, cpu0 = first * args.batch, 0, 0, None
    while (now := time.perf_counter()) < t1:
        if cpu0 is None and now >= t0:
            r = resource.getrusage(resource.RUSAGE_SELF)
            cpu0, items, nbytes = r.ru_utime + r.ru_stime, 0, 0
        if mode == "get":
            data = bck.object(names[i % len(names)]).get_reader().read_all()
            items, nbytes, i = items + 1, nbytes + len(data), i + 1
        else:
            b = ais.batch(bucket=bck, cont_on_err=False)
            for k in range(args.batch):
                b.add(names[(i + k) % len(names)])
            for _, data in b.get():
                items, nbytes = items + 1, nbytes + len(data)
            i += args.batch
    r = resource.getrusage(resource.RUSAGE_SELF)
    q.put((items, nbytes, r.ru_utime + r.ru_stime - (cpu0 or 0.0)))  # type: ignore[attr-defined]


def run_sdk(
    url: str, names: list[str], mode: str, args: argparse.Namespace
) -> tuple[int, int, float]:
    ctx = multiprocessing.get_context("fork")
    q, start = ctx.Queue(), ctx.Barrier(args.clients)
    procs = [
        ctx.Process(target=_sdk_proc, args=(url, names, mode, args, k, start, q))
        for k in range(args.clients)
    ]
    for p in procs:
        p.start()
    got = [q.get(timeout=args.seconds + args.warmup + 300) for _ in procs]
    for p in procs:
        p.join()
    return sum(g[0] for g in got), sum(g[1] for g in got), sum(g[2] for g in got)


# -- the raw client: bench/loadgen.py ------------------------------------------------


def rev(data: bytes) -> bytes:
    """The ETL of the ETL rows: cheap, so the data path's costs show."""
    return data[::-1]


def run_raw(
    url: str, names: list[str], size: int, mode: str, args: argparse.Namespace, etl: str = ""
) -> tuple[int, int, float]:
    q = f"?etl_name={etl}" if etl else ""
    if mode == "get":
        reqs = [Req("GET", f"{url}/v1/objects/{BUCKET}/{n}{q}", expect_len=size) for n in names]
        per = 1
    else:
        per = args.batch
        reqs = []
        for k in range(0, len(names) - per + 1, per):
            body = json.dumps({"in": [{"objname": n} for n in names[k : k + per]], "strm": True})
            reqs.append(
                Req(
                    "GET",
                    f"{url}/v1/ml/moss/{BUCKET}{q}",
                    body=body.encode(),
                    headers=(("Content-Type", "application/json"),),
                    expect_len=tar_size([size] * per),
                )
            )
    res = run_load(reqs, args.clients, args.seconds, args.client_procs, args.warmup)
    if res.errors:
        raise SystemExit(f"{mode}: {res.errors} errors, first: {res.first_error}")
    return res.requests * per, res.nbytes, res.client_cpu


def measure(
    kind: str, url: str, names: list[str], size: int, mode: str, args: argparse.Namespace
) -> dict[str, float]:
    before = cpu_by_pid()
    if kind in ("raw", "etl"):
        etl = "bench-rev" if kind == "etl" else ""
        items, nbytes, client_cpu = run_raw(url, names, size, mode, args, etl)
    else:
        items, nbytes, client_cpu = run_sdk(url, names, mode, args)
    spent = cpu_spent(before)
    n = max(1, items)
    return {
        "items/s": items / args.seconds,
        "MB/s": nbytes / args.seconds / 1e6,
        "client_ms": client_cpu * 1e3 / n,
        **{f"{k}_ms": v * 1e3 / n for k, v in spent.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8, help="connections (or SDK processes)")
    ap.add_argument("--client-procs", type=int, default=2, help="raw client processes")
    ap.add_argument("--batch", type=int, default=64, help="objects per GetBatch (10 KiB)")
    ap.add_argument("--large-batch", type=int, default=16, help="objects per GetBatch (1 MiB)")
    ap.add_argument("--small-count", type=int, default=1024)
    ap.add_argument("--large-count", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients-kinds", default="raw,sdk", help="raw, sdk or both")
    ap.add_argument("--sizes", default=",".join(SIZES), help="of " + ", ".join(SIZES))
    ap.add_argument("--etl-sizes", default="10KiB", help="sizes also read through an ETL")
    ap.add_argument("--rss-gb", type=float, default=0, help="then one batch this big: RSS")
    ap.add_argument("--rss-etl", action="store_true", help="and the same through an ETL")
    args = ap.parse_args()
    kinds = [k for k in args.clients_kinds.split(",") if k]
    counts = {"10KiB": args.small_count, "1MiB": args.large_count}
    print(
        f"# {psutil.cpu_count()} CPUs, {args.targets} targets, {args.clients} clients, "
        f"batch {args.batch} (1 MiB: {args.large_batch}), {args.seconds}s x {args.rounds} rounds",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp) / "data", targets=args.targets) as cluster,
    ):
        url = cluster.endpoint.rstrip("/")
        httpx.post(f"{url}/v1/buckets/{BUCKET}", json={"action": "create-bck"}).raise_for_status()
        etl_sizes = set(filter(None, args.etl_sizes.split(",")))
        if etl_sizes:
            SluiceClient(url).etl("bench-rev").init_code(transform=rev, timeout=300)
        header = f"{'size':6} {'client':6} {'mode':6} {'items/s':>9} {'MB/s':>8} "
        print(
            header + f"{'client ms':>10} {'gateway ms':>11} {'targets ms':>11} "
            f"{'etl ms':>8}  per item"
        )
        for label in filter(None, args.sizes.split(",")):
            size = SIZES[label]
            names = [f"{label}/{i:05d}" for i in range(counts[label])]
            upload(url, names, size)
            print(f"# servers idle after {settle():.1f}s", flush=True)
            # a 1 MiB batch of 64 would last seconds: few of them in the window, too coarse
            per = args.large_batch if size >= 1 << 20 else args.batch
            sargs = argparse.Namespace(**{**vars(args), "batch": per})
            for kind in kinds + (["etl"] if label in etl_sizes else []):
                rows: dict[str, list[dict[str, float]]] = {"get": [], "batch": []}
                for _ in range(args.rounds):
                    for mode in ("get", "batch"):
                        rows[mode].append(measure(kind, url, names, size, mode, sargs))
                med = {
                    m: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    for m, rs in rows.items()
                }
                for mode, r in med.items():
                    print(
                        f"{label:6} {kind:6} {mode:6} {r['items/s']:9.0f} {r['MB/s']:8.1f} "
                        f"{r['client_ms']:10.3f} {r.get('gateway_ms', 0):11.3f} "
                        f"{r.get('target_ms', 0):11.3f} {r.get('transformer_ms', 0):8.3f}",
                        flush=True,
                    )
                g, b = med["get"], med["batch"]
                roles = ("gateway_ms", "target_ms", "transformer_ms")
                servers_b = sum(b.get(k, 0) for k in roles)
                servers_g = sum(g.get(k, 0) for k in roles)
                print(
                    f"{label:6} {kind:6} batch/get: items/s "
                    f"{b['items/s'] / max(g['items/s'], 1e-9):.2f}, client CPU per item "
                    f"{b['client_ms'] / max(g['client_ms'], 1e-9):.2f}, servers' CPU per item "
                    f"{servers_b / max(servers_g, 1e-9):.2f}",
                    flush=True,
                )
        if args.rss_gb:
            rss_check(url, args.rss_gb)
            if args.rss_etl:
                SluiceClient(url).etl("bench-rev").init_code(transform=rev, timeout=300)
                rss_check(url, args.rss_gb, "bench-rev")


if __name__ == "__main__":
    threading.excepthook = lambda a: None  # a client thread's error is reported by its count
    main()
