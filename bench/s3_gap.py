"""The servers' CPU per S3 GET, back to back and with a client's own time between requests.

``bench/s3.py`` reads with boto3, one request at a time: between two requests
the client spends about 2 ms of its own CPU, and the servers sleep. This
bench replays one boto3-signed ``GetObject`` (16 KiB; SigV4 allows a replay
within its 15 minutes) on a raw keep-alive socket, so the client costs almost
nothing, and measures the servers' CPU per request (psutil: the gateway, the
targets) in two ways, in turn:

* **back to back**: the next request leaves as soon as the answer is in;
* **gap**: the client spins ``--gap`` ms (default 2, about boto3's own CPU per
  request) on this machine's cores before the next one, as boto3 does.

The difference is what waking up costs the servers: on a VM with 2 cores
their caches are cold after the client's work, and each wake-up is a vCPU
that halted. It explains why Sluice's 16 KiB row against MinIO (one Go
process, whose scheduler spins before it parks) moves less than the code's
cost per request did (docs/benchmarks.md, "S3 API").

    .venv/bin/python bench/s3_gap.py [--requests 1500] [--gap 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from s3 import boto3_client  # noqa: E402

from etl_runtime.local.api import LocalCluster  # noqa: E402

SIZE = 16 << 10


def cpu(pids: list[int]) -> float:
    return sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids)


def signed_request(ep: str) -> tuple[bytes, tuple[str, int]]:
    """One boto3 GetObject of ``bench/o`` as raw bytes, and the address to send it to."""
    key = httpx.post(f"{ep}/v1/s3/keys", json={"permission": "write"}).json()
    s3 = boto3_client(f"{ep}/s3", key["access_key"], key["secret_key"])
    s3.create_bucket(Bucket="bench")
    s3.put_object(Bucket="bench", Key="o", Body=os.urandom(SIZE))
    seen: dict[str, Any] = {}

    def grab(request: Any, **_: Any) -> None:
        seen["headers"], seen["url"] = dict(request.headers), request.url

    s3.meta.events.register("before-send.s3.GetObject", grab)
    s3.get_object(Bucket="bench", Key="o")["Body"].read()
    url = urlsplit(seen["url"])
    lines = [f"GET {url.path} HTTP/1.1", f"Host: {url.netloc}"]
    for k, v in seen["headers"].items():
        lines.append(f"{k}: {v.decode() if isinstance(v, bytes) else v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), (url.hostname or "", url.port or 80)


def get(sock: socket.socket, request: bytes) -> None:
    sock.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(1 << 16)
    head, _, body = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"the GET failed: {head[:200]!r}")
    while len(body) < SIZE:
        body += sock.recv(1 << 16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--gap", type=float, default=2.0, help="ms the client spins between requests")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("SLUICE_ZYGOTE", "lazy")  # no ETL: no zygote warm-up CPU
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp) / "d", targets=2) as c:
        request, addr = signed_request(c.endpoint.rstrip("/"))
        procs = psutil.Process().children(recursive=True)
        roles = {"gateway": "etl_runtime.gateway", "targets": "etl_runtime.storage_target"}
        pids = {
            role: [q.pid for q in procs if module in " ".join(q.cmdline())]
            for role, module in roles.items()
        }
        sock = socket.create_connection(addr)
        for _ in range(200):
            get(sock, request)
        print(f"16 KiB signed S3 GETs, {args.requests} per row, one connection, 2 targets")
        print(f"{'client':>14} {'req/s':>7} {'gateway ms/req':>15} {'targets ms/req':>15}")
        for _ in range(args.rounds):
            for gap in (0.0, args.gap / 1000):
                before = {role: cpu(p) for role, p in pids.items()}
                t0 = time.perf_counter()
                for _ in range(args.requests):
                    get(sock, request)
                    spin = time.perf_counter()
                    while time.perf_counter() - spin < gap:
                        pass
                wall = time.perf_counter() - t0
                n = args.requests
                ms = {role: 1000 * (cpu(p) - before[role]) / n for role, p in pids.items()}
                label = "back to back" if not gap else f"{args.gap:g} ms gap"
                print(
                    f"{label:>14} {args.requests / wall:>7.0f} {ms['gateway']:>15.3f} "
                    f"{ms['targets']:>15.3f}"
                )


if __name__ == "__main__":
    main()
