"""What TLS costs: the same reads over ``sluice up`` and ``sluice up --tls``, side by side.

Two local clusters run at once (``--targets`` targets each, an identity ETL,
the same objects of 16 KiB and 1 MiB), one plain and one with ``--tls``;
``--clients`` threads read from one of them for ``--seconds`` per row, the
rows alternating plain / TLS so a machine whose load changes affects both
alike, ``--rounds`` times, for each event loop (``SLUICE_LOOP``: asyncio,
uvloop; both clusters are started again for each), with ``SLUICE_ZYGOTE=off``
(its warm-up would be counted as the servers' CPU). Four reads:

* ``GET``: the SDK's plain GET (gateway 307 -> target);
* ``ETL GET``: ``?etl_name=identity`` (gateway -> target -> transformer);
* ``S3 GET``: an unsigned ``GET /s3/B/K`` (the gateway relays the owner's answer);
* ``GetBatch``: the SDK's ``get_batch`` of 8 objects (its designated target assembles).

Every client keeps its connections (one SDK client per thread, TLS sessions
reused as a real client's are). Printed per row: requests/s and MB/s, the
servers' CPU milliseconds per request (every process of the cluster: the
load-independent figure; the gateway's and the targets' also apart), the load
generator's own CPU milliseconds per request (its TLS decrypt shares the
machine's cores), and per (loop, read, size) the
median TLS ÷ plain of the rates and TLS's CPU per request over plain's.

    .venv/bin/python bench/tls.py [--seconds 3] [--rounds 3] [--clients 8] [--loops asyncio,uvloop]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.core import tls  # noqa: E402
from etl_runtime.local import LocalCluster  # noqa: E402
from etl_runtime.sdk import Client  # noqa: E402

SIZES = {"16KiB": 16 << 10, "1MiB": 1 << 20}
IDENTITY = "def transform(data):\n    return data\n"
READS = ("GET", "ETL GET", "S3 GET", "GetBatch")
BATCH = 8


@contextlib.contextmanager
def cluster(workdir: Path, tls: bool, targets: int, objects: int) -> Iterator[LocalCluster]:
    with LocalCluster(workdir / ("tls" if tls else "plain"), targets=targets, tls=tls) as c:
        with Client(c.endpoint, ca=c.ca if tls else None) as sdk:
            bucket = sdk.bucket("bench")
            bucket.create(exist_ok=True)
            for label, size in SIZES.items():
                data = os.urandom(size)
                for i in range(objects):
                    bucket.object(f"{label}/{i}").put_content(data)
            sdk.etl("identity").init_spec(IDENTITY)
        yield c


ROLES = ("gateway", "targets", "other")


def _role(proc: psutil.Process) -> str:
    argv = " ".join(proc.cmdline())
    if "etl_runtime.gateway" in argv:
        return "gateway"
    if "etl_runtime.storage_target" in argv:
        return "targets"
    return "other"  # sluice up itself, transformers, zygotes


def server_cpu(c: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of every process of the cluster (``sluice up`` and below), by
    role: the gateway, the targets, the rest (``sluice up``, transformers)."""
    total = dict.fromkeys(ROLES, 0.0)
    root = psutil.Process(c.pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            role = "other" if proc.pid == root.pid else _role(proc)
            total[role] += t.user + t.system + t.children_user + t.children_system
    return total


def reader(c: LocalCluster, read: str, label: str, objects: int) -> Callable[[int], int]:
    """A function of a counter that does one request and returns the bytes it read."""
    sdk = Client(c.endpoint, ca=c.ca if c.tls else None, retries=0)
    http = httpx.Client(verify=tls.client_context(c.ca) if c.tls else True, timeout=60)
    bucket = sdk.bucket("bench")

    def one(i: int) -> int:
        name = f"{label}/{i % objects}"
        if read == "GET":
            return len(bucket.object(name).get_bytes())
        if read == "ETL GET":
            return len(bucket.object(name).get_bytes(etl_name="identity"))
        if read == "S3 GET":
            r = http.get(f"{c.endpoint}/s3/bench/{name}")
            r.raise_for_status()
            return len(r.content)
        items = [("bench", f"{label}/{(i + k) % objects}") for k in range(BATCH)]
        return sum(len(g.data or b"") for g in sdk.get_batch(items))

    return one


def measure(c: LocalCluster, read: str, label: str, args: argparse.Namespace) -> dict[str, float]:
    fns = [reader(c, read, label, args.objects) for _ in range(args.clients)]
    counts = [0] * len(fns)
    nbytes = [0] * len(fns)
    stop = threading.Event()
    measuring = threading.Event()

    def loop(k: int) -> None:
        i = k * 1000
        while not stop.is_set():
            got = fns[k](i)
            i += 1
            if measuring.is_set():
                counts[k] += BATCH if read == "GetBatch" else 1
                nbytes[k] += got

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(len(fns))]
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    me = psutil.Process()
    cpu0, t0, mine0 = server_cpu(c), time.monotonic(), sum(me.cpu_times()[:2])
    measuring.set()
    time.sleep(args.seconds)
    measuring.clear()
    cpu1, t1, mine1 = server_cpu(c), time.monotonic(), sum(me.cpu_times()[:2])
    stop.set()
    for t in threads:
        t.join()
    n = sum(counts)
    per = {role: (cpu1[role] - cpu0[role]) * 1000 / max(n, 1) for role in ROLES}
    return {
        "objects/s": n / (t1 - t0),
        "MB/s": sum(nbytes) / (t1 - t0) / 1e6,
        "server ms/object": sum(per.values()),
        "gateway ms/object": per["gateway"],
        "targets ms/object": per["targets"],
        # The load generator's own CPU (its TLS decrypt shares the machine's cores).
        "client ms/object": (mine1 - mine0) * 1000 / max(n, 1),
    }


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(x[key] for x in rows)


def row(
    loop: str, read: str, label: str, rows: dict[tuple[str, str, bool], list[dict[str, float]]]
) -> str:
    """One line of the summary: medians of the rounds, and of TLS ÷ plain round by round."""
    a, b = rows[(read, label, False)], rows[(read, label, True)]
    rate = statistics.median(y["objects/s"] / x["objects/s"] for x, y in zip(a, b, strict=True))
    cpu = statistics.median(
        y["server ms/object"] / x["server ms/object"] for x, y in zip(a, b, strict=True)
    )
    cells = [loop, read, label, f"{_med(a, 'MB/s'):.1f}", f"{_med(b, 'MB/s'):.1f}", f"{rate:.2f}"]
    cells += [f"{_med(a, 'server ms/object'):.2f}", f"{_med(b, 'server ms/object'):.2f}"]
    cells.append(f"{cpu:.2f}")
    for role in ("gateway", "targets"):
        key = f"{role} ms/object"
        cells.append(f"{_med(a, key):.2f} → {_med(b, key):.2f}")
    cells += [f"{_med(a, 'client ms/object'):.2f}", f"{_med(b, 'client ms/object'):.2f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--targets", type=int, default=2)
    p.add_argument("--objects", type=int, default=32, help="objects of each size")
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--reads", default=",".join(READS))
    args = p.parse_args()
    reads = [r.strip() for r in args.reads.split(",")]
    # No zygote: its warm-up (torch imports, about ten CPU seconds per target) would
    # run during the first rows and be counted as the servers' CPU per request. The
    # identity ETL's transformers start afresh; their data path is the same.
    os.environ.setdefault("SLUICE_ZYGOTE", "off")
    summary: list[str] = []
    for loop in args.loops.split(","):
        os.environ["SLUICE_LOOP"] = loop
        with tempfile.TemporaryDirectory(prefix="sluice-bench-tls-") as tmp:
            work = Path(tmp)
            with (
                cluster(work, False, args.targets, args.objects) as plain,
                cluster(work, True, args.targets, args.objects) as secure,
            ):
                rows: dict[tuple[str, str, bool], list[dict[str, float]]] = {}
                for rnd in range(args.rounds):
                    for read in reads:
                        for label in SIZES:
                            for c in (plain, secure) if rnd % 2 == 0 else (secure, plain):
                                got = measure(c, read, label, args)
                                rows.setdefault((read, label, c.tls), []).append(got)
                                print(
                                    f"{loop:8} round {rnd + 1} {read:9} {label:6} "
                                    f"{'TLS' if c.tls else 'plain':5} "
                                    f"{got['objects/s']:8.0f} obj/s {got['MB/s']:8.1f} MB/s "
                                    f"{got['server ms/object']:6.2f} server ms/obj "
                                    f"(gateway {got['gateway ms/object']:5.2f} "
                                    f"targets {got['targets ms/object']:5.2f}) "
                                    f"{got['client ms/object']:6.2f} client ms/obj",
                                    flush=True,
                                )
                for read in reads:
                    for label in SIZES:
                        summary.append(row(loop, read, label, rows))
    print()
    print(
        "| loop | read | size | plain MB/s | TLS MB/s | TLS ÷ plain (rate) "
        "| plain server ms/obj | TLS server ms/obj | TLS ÷ plain (CPU/obj) "
        "| gateway ms/obj plain → TLS | targets ms/obj plain → TLS "
        "| plain client ms/obj | TLS client ms/obj |"
    )
    print("| --- | --- | --- |" + " ---: |" * 10)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
