"""Sluice's transformer against AIStore's own Python transformer server, side by side.

The anchor is the ``aistore`` package's ``FastAPIServer`` (it speaks the same
hpush protocol: ``PUT /<bucket>/<object>`` with the object as body, the result
as answer), in two configurations:

* ``ais-best``: ``uvicorn module:app --workers N --loop uvloop --http httptools``
  (the README's deployment, with N workers like Sluice);
* ``ais-default``: ``FastAPIServer().start()``, what its README's examples run
  (one uvicorn process).

Sluice runs as a user gets it, ``python -m etl_runtime.webserver`` with no
flags (``sluice-default``: for object mode, one server per usable CPU running
the code inline, see ``etl_runtime/webserver/sizing.py``), or with
``--servers N --workers N``: N server processes on one port, with one worker
process each (``sluice``, ``--no-inline``) or running the function in their
own thread (``sluice-inline``, ``--inline``). Every server gets the
same function: identity on 1 MiB and on 16 KiB bodies, and a PIL JPEG resize
(1024x768 JPEG in, 224x224 JPEG out). For each transform and concurrency
(1, 16, 64 requests in flight) the load generator (``loadgen``: client
processes with raw HTTP/1.1 connections, CPU per request printed) drives each
server in turn for ``--seconds``; rows print req/s, p50, p99 and the Sluice /
anchor ratio. Goal: ratio >= 1.0 on every row with p99 no worse.

    .venv/bin/python bench/anchor_transformer.py [--servers NCPU] [--seconds 4]
        [--concurrency 1,16,64] [--transforms identity-1MiB,identity-16KiB,jpeg-resize]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from loadgen import Req, Result, run_load, tree_cpu  # noqa: E402

from tests.servers import free_port, wait_http  # noqa: E402

TOKEN = "anchor-token"

IDENTITY = "def transform(data):\n    return data\n"
RESIZE = """\
import io

from PIL import Image


def transform(data):
    image = Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()
"""

AIS_SERVER = """\
import os

from aistore.sdk.etl.webserver.fastapi_server import FastAPIServer

{code}


class Server(FastAPIServer):
    def transform(self, data, path, etl_args):
        return transform(data)


server = Server(host="127.0.0.1", port=int(os.environ.get("AIS_ANCHOR_PORT", "8000")))
app = server.app

if __name__ == "__main__":
    server.start()
"""


def jpeg(width: int = 1024, height: int = 768) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(7)
    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    noise = rng.integers(0, 40, (height, width), dtype=np.uint8)
    r = ((x + y) / 2).astype(np.uint8) + noise
    pixels = np.stack([r, (x + 0 * y).astype(np.uint8), (y + 0 * x).astype(np.uint8)], axis=2)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


TRANSFORMS = {
    "identity-1MiB": (IDENTITY, lambda: os.urandom(1 << 20), True),
    "identity-16KiB": (IDENTITY, lambda: os.urandom(16 << 10), True),
    "jpeg-resize": (RESIZE, jpeg, False),
}


@contextlib.contextmanager
def server(kind: str, code: str, servers: int, workdir: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # AIStore reads AIS_TARGET_URL at start (for hpull, unused here): any URL does.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AIS_TARGET_URL": "http://127.0.0.1:9"}
    if kind.startswith("sluice"):
        spec = {"mode": "object", "code": {"source": code}}
        for var in ("SLUICE_INLINE", "SLUICE_SERVERS", "SLUICE_WORKERS"):
            env.pop(var, None)  # the defaults are what users get
        env.update(SLUICE_ETL_NAME="anchor", SLUICE_ETL_SPEC=json.dumps(spec))
        env["SLUICE_ETL_TOKEN"] = TOKEN
        argv = [sys.executable, "-m", "etl_runtime.webserver", "--host", "127.0.0.1"]
        argv += ["--port", str(port)]
        if kind != "sluice-default":
            argv += ["--servers", str(servers), "--workers", str(servers)]
            argv += ["--inline" if kind == "sluice-inline" else "--no-inline"]
    else:
        module = workdir / "ais_anchor.py"
        module.write_text(AIS_SERVER.format(code=code))
        env["PYTHONPATH"] = os.pathsep.join([str(workdir), env.get("PYTHONPATH", "")])
        if kind == "ais-best":
            argv = [sys.executable, "-m", "uvicorn", "ais_anchor:app", "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--workers", str(servers), "--no-access-log"]
            argv += ["--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
        else:
            env["AIS_ANCHOR_PORT"] = str(port)
            argv = [sys.executable, str(module)]
    log = open(workdir / f"{kind}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        try:
            wait_http(f"{url}/health", timeout=180, proc=proc)
        except Exception:
            log.flush()
            tail = (workdir / f"{kind}.log").read_text(errors="replace")[-3000:]
            print(f"{kind} did not start; its log ends:\n{tail}", file=sys.stderr)
            raise
        if kind != "ais-default":
            time.sleep(1.0)  # every server process up, not just the first to answer
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def requests(url: str, body: bytes, check_len: bool) -> list[Req]:
    auth = (("Authorization", f"Bearer {TOKEN}"),)
    return [
        Req("PUT", f"{url}/bench/obj-{i}", body, auth, len(body) if check_len else None)
        for i in range(64)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--servers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes per server (AIStore's uvicorn --workers; Sluice's but for sluice-default)",
    )
    p.add_argument("--seconds", type=float, default=4.0, help="measured time per row")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--client-procs", type=int, default=4, help="load generator processes")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--transforms", default=",".join(TRANSFORMS))
    p.add_argument(
        "--kinds",
        default="sluice-default,ais-best",
        help="of sluice-default, sluice, sluice-inline, ais-best, ais-default",
    )
    p.add_argument("--rounds", type=int, default=1, help="each kind once per round, in turn")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    print(
        f"{os.cpu_count()} CPUs; {args.servers} processes per server; "
        f"{args.client_procs} client processes; {args.seconds:.0f}s per row"
    )
    header = (
        f"{'transform':<15} {'conc':>4} {'server':<14} {'req/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'err':>4} {'client CPU ms/req':>17} {'server CPU ms/req':>17}"
    )
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sluice-anchor-") as tmp:
        for name in args.transforms.split(","):
            code, make_body, check_len = TRANSFORMS[name]
            body = make_body()
            print(f"\n{name}: body {len(body)} bytes")
            print(header)
            runs: dict[tuple[str, int], list[Result]] = {}
            for round_ in range(args.rounds):
                order = kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]
                for kind in order:
                    with server(kind, code, args.servers, Path(tmp)) as (url, pid):
                        reqs = requests(url, body, check_len)
                        run_load(reqs, 8, 0.5, procs=args.client_procs, warmup=0.3)  # warm up
                        for c in levels:
                            before = tree_cpu(pid)
                            r = run_load(reqs, c, args.seconds, args.client_procs, args.warmup)
                            # the server tree's CPU per request (all its processes)
                            spent = tree_cpu(pid) - before
                            # the warm-up's CPU is in ``spent``: divide by its requests too
                            total = max(1.0, r.rate * (args.seconds + args.warmup))
                            r.server_cpu_ms = spent * 1e3 / total  # type: ignore[attr-defined]
                            runs.setdefault((kind, c), []).append(r)
                            print(
                                f"{name:<15} {c:>4} {kind:<14} {r.rate:>8.1f} {r.p50_ms:>8.2f} "
                                f"{r.p99_ms:>8.2f} {r.errors:>4} {r.client_cpu_ms:>17.3f} "
                                f"{r.server_cpu_ms:>17.3f}"  # type: ignore[attr-defined]
                                + (f"  first error: {r.first_error}" if r.errors else ""),
                                flush=True,
                            )
            # the median round of each row (by rate)
            results = {k: sorted(v, key=lambda r: r.rate)[len(v) // 2] for k, v in runs.items()}
            for c in levels:
                for us, kind in [(u, k) for u in kinds for k in kinds]:
                    ours, theirs = results.get((us, c)), results.get((kind, c))
                    if not us.startswith("sluice") or kind.startswith("sluice"):
                        continue
                    if ours is None or theirs is None or not theirs.rate:
                        continue
                    summary.append(
                        f"| {name} | {c} | {us} vs {kind} | {ours.rate:.0f} | {theirs.rate:.0f} | "
                        f"{ours.rate / theirs.rate:.2f} | {ours.p50_ms:.1f} / {theirs.p50_ms:.1f} "
                        f"| {ours.p99_ms:.1f} / {theirs.p99_ms:.1f} "
                        f"| {ours.server_cpu_ms:.3f} / {theirs.server_cpu_ms:.3f} |"  # type: ignore[attr-defined]
                    )
    print(
        "\n| transform | concurrency | servers | Sluice req/s | anchor req/s | ratio "
        "| p50 ms Sluice / anchor | p99 ms Sluice / anchor | server CPU ms/req Sluice / anchor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
