"""Plain GET from one target, sent by ``os.sendfile`` or read and copied, side by side.

Starts one target process (``python -m etl_runtime.storage_target``) per event loop
and per ``SLUICE_SENDFILE`` (``1``: zero-copy, the default; ``0``: the
objects are read into Python and written, as before), uploads the same
objects to each, then reads them with ``--clients`` concurrent GETs straight
from the target for ``--seconds``, the two switches alternating ``--rounds``
times per size so a machine whose load changes affects both alike. It prints
objects/s, MiB/s, p50/p99 latency, the target's CPU milliseconds per object
and the load generator's (``bench/loadgen.py``: ``--client-procs`` processes
with raw HTTP/1.1 connections), then per loop and size the medians of
sendfile ÷ copy for throughput and for target CPU per object. Each target's
``sluice_sendfile_bytes_total`` is checked: all bytes with ``1``, none with ``0``.

    .venv/bin/python bench/sendfile.py [--loops asyncio,uvloop] [--sizes 16K,1M,16M]
        [--clients 16] [--client-procs 4] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import free_port, serve_process  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from loadgen import Req, run_load  # noqa: E402

SWITCHES = {"sendfile": "1", "copy": "0"}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def label(size: int) -> str:
    for unit, n in reversed(UNITS.items()):
        if size >= n and size % n == 0:
            return f"{size // n} {unit}iB"
    return f"{size} B"


@contextlib.contextmanager
def targets(workdir: Path, loops: list[str]) -> Iterator[dict[tuple[str, str], tuple[str, int]]]:
    """(loop, mode) -> (URL, pid) of a running target."""
    out: dict[tuple[str, str], tuple[str, int]] = {}
    with contextlib.ExitStack() as stack:
        for loop in loops:
            for mode, switch in SWITCHES.items():
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                proc = stack.enter_context(
                    serve_process(
                        [
                            "-m",
                            "etl_runtime.storage_target",
                            "--data-dir",
                            str(workdir / f"{loop}-{mode}"),
                        ],
                        f"{url}/v1/health",
                        env={
                            "SLUICE_HOST": "127.0.0.1",
                            "SLUICE_PORT": str(port),
                            "SLUICE_LOOP": loop,
                            "SLUICE_SENDFILE": switch,
                        },
                    )
                )
                out[(loop, mode)] = (url, proc.pid)
        yield out


def upload(url: str, sizes: list[int], count: int) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    with httpx.Client(base_url=url, timeout=120) as c:
        c.post("/v1/buckets/bench", json={"action": "create-bck"}).raise_for_status()
        for size in sizes:
            data = os.urandom(size)
            n = max(2, min(count, (256 << 20) // size))  # at most 256 MiB per size
            names[size] = [f"{size}/{i}" for i in range(n)]
            for name in names[size]:
                c.put(f"/v1/objects/bench/{name}", content=data).raise_for_status()
    return names


def sendfile_bytes(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    m = re.search(r"^sluice_sendfile_bytes_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def measure(url: str, pid: int, names: list[str], size: int, args: argparse.Namespace) -> dict:
    reqs = [Req("GET", f"{url}/v1/objects/bench/{n}", expect_len=size) for n in names]
    proc = psutil.Process(pid)
    before = sum(proc.cpu_times()[:2])
    result = run_load(reqs, args.clients, args.seconds, args.client_procs, args.warmup)
    spent = sum(proc.cpu_times()[:2]) - before
    # CPU over the warm-up too, divided by the measured requests: the same bound
    # for both switches (as in bench/get_throughput.py).
    scale = args.seconds / (args.seconds + args.warmup + 0.3)
    count = max(1, result.requests)
    if result.errors:
        raise SystemExit(f"{url}: {result.errors} errors, first: {result.first_error}")
    return {
        "rate": result.rate,
        "mibs": result.nbytes / result.seconds / (1 << 20),
        "p50": result.p50_ms,
        "p99": result.p99_ms,
        "target_ms": spent * scale * 1e3 / count,
        "client_ms": result.client_cpu_ms,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--loops", default="asyncio,uvloop", help="event loops, comma-separated")
    p.add_argument("--sizes", default="16K,1M,16M", help="object sizes, comma-separated")
    p.add_argument("--objects", type=int, default=64, help="objects per size (at most 256 MiB)")
    p.add_argument("--clients", type=int, default=16, help="concurrent requests")
    p.add_argument("--client-procs", type=int, default=4, help="load generator processes")
    p.add_argument("--seconds", type=float, default=4.0, help="measuring time per row")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each row")
    p.add_argument("--rounds", type=int, default=3, help="sendfile/copy pairs per loop and size")
    args = p.parse_args()
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    sizes = [parse_size(x) for x in args.sizes.split(",") if x.strip()]
    print(
        f"{os.cpu_count()} CPUs; {args.clients} concurrent GETs from {args.client_procs} processes"
    )
    with (
        tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp,
        targets(Path(tmp), loops) as ts,
    ):
        names = {key: upload(url, sizes, args.objects) for key, (url, _) in ts.items()}
        head = (
            "| loop | size | body sent by | objects/s | MiB/s | p50 ms | p99 ms "
            "| target CPU ms/object | client CPU ms/object |"
        )
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        ratios: list[str] = []
        for loop in loops:
            for size in sizes:
                rows: dict[str, list[dict]] = {mode: [] for mode in SWITCHES}
                for _ in range(args.rounds):
                    for mode in SWITCHES:
                        url, pid = ts[(loop, mode)]
                        row = measure(url, pid, names[(loop, mode)][size], size, args)
                        rows[mode].append(row)
                        print(
                            f"| {loop} | {label(size)} | {mode} | {row['rate']:.0f} | "
                            f"{row['mibs']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                            f"{row['target_ms']:.3f} | {row['client_ms']:.3f} |",
                            flush=True,
                        )
                speed = [
                    s["rate"] / c["rate"]
                    for s, c in zip(rows["sendfile"], rows["copy"], strict=True)
                ]
                cpu = [
                    s["target_ms"] / c["target_ms"]
                    for s, c in zip(rows["sendfile"], rows["copy"], strict=True)
                ]
                ratios.append(
                    f"| {loop} | {label(size)} | {statistics.median(speed):.2f} "
                    f"({', '.join(f'{x:.2f}' for x in speed)}) | {statistics.median(cpu):.2f} "
                    f"({', '.join(f'{x:.2f}' for x in cpu)}) |"
                )
        print()
        print("| loop | size | objects/s sendfile ÷ copy | target CPU per object sendfile ÷ copy |")
        print("|---|---|---|---|")
        print("\n".join(ratios))
        print()
        for (loop, mode), (url, _) in ts.items():
            print(f"{loop} {mode}: sluice_sendfile_bytes_total = {sendfile_bytes(url):.0f}")
            if (sendfile_bytes(url) > 0) != (mode == "sendfile"):
                raise SystemExit(f"{loop} {mode}: the sendfile counter says otherwise")


if __name__ == "__main__":
    main()
