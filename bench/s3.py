"""The S3 API's cost: S3 GET ÷ native GET through the same gateway, 16 KiB and 1 MiB.

Starts a real local cluster (``sluice up``, 2 targets), stores N objects of
each size, then reads them round-robin with one client thread, in one run:

* **native** — ``httpx`` GET ``/v1/objects/b/o``, following the gateway's 307
  to the owner (what the SDK and curl do: two requests, bytes straight from
  the target);
* **s3 (httpx)** — ``httpx`` GET ``/s3/b/o`` unsigned (reads are open): the
  gateway proxies the owner's answer; same client library as native, so the
  difference is the server side of the S3 path;
* **s3 (boto3)** — ``get_object`` signed with SigV4 (verified on the gateway):
  what an S3 user sees, boto3's own client cost included.

* **minio (boto3)** — the same ``get_object`` calls, same objects, against
  the project's MinIO test server (``scripts/minio.sh``, one Go process
  reading its own disk) on the same machine: the "boto3 reading Sluice ÷
  boto3 reading MinIO" ratio of issue 22.

Printed per size: requests/s, ms per request, the load generator's CPU ms
per request (this process, ``time.process_time``: httpx or boto3), the
servers' CPU ms per request (psutil, user + system: the gateway and the
targets apart and their sum for Sluice, the one process for MinIO; on a loaded
machine the steadier figure), each path ÷ native (requests/s), and boto3 on
Sluice ÷ boto3 on MinIO. Sequential requests, so the figures are per-request
latency, not cluster throughput. ``--rounds N`` measures every path N times,
in turn, and prints the medians (the machine's noise hits all paths alike).

    .venv/bin/python bench/s3.py [--objects 32] [--seconds 4] [--rounds 3] [--boto3-only]
        [--profile DIR]

``--profile DIR``: the gateway and the targets run under ``cProfile`` while the
rows are measured (a ``sitecustomize`` on their ``PYTHONPATH``), and leave
``DIR/gateway-PID.prof`` and ``DIR/storage_target-PID.prof`` for ``pstats``;
the profiler's own cost is in that run's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import httpx
import psutil
from botocore.config import Config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from etl_runtime.local.api import LocalCluster  # noqa: E402
from tests.providers.minio import MinioServer  # noqa: E402

SIZES = {"16 KiB": 16 << 10, "1 MiB": 1 << 20}
PROFILE_ENV = "BENCH_S3_PROFILE"  # not SLUICE_*: sluice up passes it on
PROFILE_HOOK = f"""
import os, signal, sys
_args = open("/proc/self/cmdline", "rb").read().split(b"\\0")
_role = next((a.decode().split(".")[1] for a in _args
              if a in (b"etl_runtime.gateway", b"etl_runtime.storage_target")), None)
if _role and os.environ.get("{PROFILE_ENV}"):
    import cProfile
    _p = cProfile.Profile()
    def _dump(*_):
        _p.disable()
        _p.dump_stats(os.path.join(os.environ["{PROFILE_ENV}"], f"{{_role}}-{{os.getpid()}}.prof"))
    signal.signal(signal.SIGUSR1, lambda *_: _p.enable())
    signal.signal(signal.SIGUSR2, _dump)
"""


def server_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes so far."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def sluice_pids() -> dict[str, list[int]]:
    """The gateway's and the targets' (children of ``sluice up``, which runs in this one)."""
    out: dict[str, list[int]] = {"gateway": [], "targets": []}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "etl_runtime.storage_target" in cmd:
            out["targets"].append(proc.pid)
        elif "etl_runtime.gateway" in cmd:
            out["gateway"].append(proc.pid)
    return out


def measure(
    get: Callable[[str], bytes],
    names: list[str],
    size: int,
    seconds: float,
    servers: dict[str, list[int]],
) -> dict:
    for n in names[:4]:  # warm connections and page cache
        assert len(get(n)) == size
    count, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
    scpu0 = {role: server_cpu(pids) for role, pids in servers.items()}
    while time.perf_counter() - wall0 < seconds:
        assert len(get(names[count % len(names)])) == size
        count += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    scpu = {role: server_cpu(pids) - scpu0[role] for role, pids in servers.items()}
    return {
        "rps": count / wall,
        "ms": 1000 * wall / count,
        "cpu_ms": 1000 * cpu / count,
        "server_cpu_ms": 1000 * sum(scpu.values()) / count,
        "gateway_ms": 1000 * scpu.get("gateway", 0.0) / count,
        "targets_ms": 1000 * scpu.get("targets", 0.0) / count,
    }


def boto3_client(endpoint: str, access: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def median_run(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=32)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--boto3-only", action="store_true", help="only the two boto3 paths (Sluice, MinIO)"
    )
    p.add_argument("--profile", metavar="DIR", help="cProfile the gateway and targets into DIR")
    args = p.parse_args()
    # No ETL here: the eager zygote's warm-up (seconds of CPU after start) would land on
    # the first rows only. "lazy" starts it with the first ETL, i.e. never in this run.
    os.environ.setdefault("SLUICE_ZYGOTE", "lazy")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if args.profile:  # before sluice up starts: its servers inherit the environment
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            (Path(tmp) / "hook").mkdir()
            (Path(tmp) / "hook" / "sitecustomize.py").write_text(PROFILE_HOOK)
            path = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = f"{tmp}/hook" + (f":{path}" if path else "")
            os.environ[PROFILE_ENV] = str(Path(args.profile).resolve())
        c = stack.enter_context(LocalCluster(Path(tmp) / "d", targets=2))
        (Path(tmp) / "minio").mkdir()
        minio = MinioServer(Path(tmp) / "minio").start()
        try:
            run(c.endpoint.rstrip("/"), minio, args)
        finally:
            minio.stop()


def run(ep: str, minio: MinioServer, args: argparse.Namespace) -> None:
    key = httpx.post(f"{ep}/v1/s3/keys", json={"permission": "write"}).json()
    s3 = boto3_client(f"{ep}/s3", key["access_key"], key["secret_key"])
    ms3 = minio.client()
    for client in (s3, ms3):
        client.create_bucket(Bucket="bench")
    http = httpx.Client(follow_redirects=True, timeout=30)
    print(
        f"cores: {os.cpu_count()}, objects per size: {args.objects}, "
        f"{args.seconds:g} s per path, medians of {args.rounds} round(s)"
    )
    print("CPU in ms per request: load = this process (the client), gw = gateway, tg = targets")
    head = ("size", "path", "req/s", "ms/req", "load", "server", "gw", "tg", "÷ native")
    print(
        f"{head[0]:>7} {head[1]:<14} {head[2]:>8} {head[3]:>7} {head[4]:>6} {head[5]:>7} "
        f"{head[6]:>6} {head[7]:>6} {head[8]:>9}"
    )
    assert minio.process is not None
    ours, theirs = sluice_pids(), {"minio": [minio.process.pid]}
    if args.profile:
        for pid in sum(ours.values(), []):
            os.kill(pid, signal.SIGUSR1)
    for label, size in SIZES.items():
        names = [f"{size}/o{i:03d}" for i in range(args.objects)]
        for n in names:
            data = os.urandom(size)
            s3.put_object(Bucket="bench", Key=n, Body=data)
            ms3.put_object(Bucket="bench", Key=n, Body=data)
        paths: dict[str, Callable[[str], bytes]] = {
            "native": lambda n: http.get(f"{ep}/v1/objects/bench/{n}").content,
            "s3 (httpx)": lambda n: http.get(f"{ep}/s3/bench/{n}").content,
            "s3 (boto3)": lambda n: s3.get_object(Bucket="bench", Key=n)["Body"].read(),
            "minio (boto3)": lambda n: ms3.get_object(Bucket="bench", Key=n)["Body"].read(),
        }
        if args.boto3_only:
            paths = {k: v for k, v in paths.items() if "boto3" in k}
        rounds: dict[str, list[dict]] = {path: [] for path in paths}
        order = list(paths)
        for i in range(args.rounds):
            for path in order[i % len(order) :] + order[: i % len(order)]:  # rotated
                get = paths[path]
                servers = theirs if path.startswith("minio") else ours
                rounds[path].append(measure(get, names, size, args.seconds, servers))
        runs = {path: median_run(r) for path, r in rounds.items()}
        base = runs["native"]["rps"] if "native" in runs else float("nan")
        for path, r in runs.items():
            split = (
                "     -      -"
                if path.startswith("minio")
                else (f"{r['gateway_ms']:>6.2f} {r['targets_ms']:>6.2f}")
            )
            print(
                f"{label:>7} {path:<14} {r['rps']:>8.0f} {r['ms']:>7.2f} {r['cpu_ms']:>6.2f} "
                f"{r['server_cpu_ms']:>7.2f} {split} {r['rps'] / base:>9.2f}"
            )
        ratio = runs["s3 (boto3)"]["rps"] / runs["minio (boto3)"]["rps"]
        print(f"{label:>7} boto3 on Sluice ÷ boto3 on MinIO: {ratio:.2f}")
    if args.profile:
        for pid in sum(ours.values(), []):
            os.kill(pid, signal.SIGUSR2)
        time.sleep(2)  # the dumps
        print(f"profiles: {sorted(p.name for p in Path(args.profile).glob('*.prof'))}")


if __name__ == "__main__":
    main()
