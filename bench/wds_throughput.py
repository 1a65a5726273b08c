"""Per-sample throughput of a CPU-bound transform: transformer vs. a local Pool.

The same function (decode JPEG with PIL, resize, re-encode) runs on the same
shards twice in one run: through a real transformer (``python -m
etl_runtime.webserver``, wds mode, N workers) over loopback, one shard at a time
so all parallelism is inside a shard; and by a plain ``multiprocessing.Pool(N)``
fed by ``webdataset`` in this process. Prints samples/s and the ratio (goal,
issue 23: at least 1.0 on 2 cores, 1.15 on 16). Run:
``.venv/bin/python bench/wds_throughput.py [--workers N]``; without
``--workers`` the transformer runs at its defaults (what users get: one
worker per usable CPU) and the Pool gets as many processes.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import numpy as np
import PIL.Image
import webdataset as wds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from etl_runtime.core.spec import runtime_python_version  # noqa: E402
from etl_runtime.webserver.sizing import usable_cpus  # noqa: E402
from tests.servers import free_port, wait_http  # noqa: E402


def resize(sample: dict[str, Any]) -> dict[str, Any]:
    import io

    import PIL.Image

    image = PIL.Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    image = image.resize((320, 240), PIL.Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return {"__key__": sample["__key__"], "jpg": out.getvalue(), "cls": sample["cls"]}


def make_shards(directory: Path, shards: int, per_shard: int) -> list[Path]:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    paths = []
    for s in range(shards):
        path = directory / f"shard-{s:03d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(per_shard):
                pixels = np.roll(base, i * 7 + s, axis=1)
                buf = io.BytesIO()
                PIL.Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
                w.write({"__key__": f"s{s}_{i:05d}", "jpg": buf.getvalue(), "cls": i})
        paths.append(path)
    return paths


def run_transformer(url: str, paths: list[Path]) -> tuple[int, float]:
    samples = 0
    start = time.perf_counter()
    with httpx.Client(timeout=600) as client:
        for path in paths:
            r = client.put(f"{url}/bench/{path.name}", content=path.read_bytes())
            r.raise_for_status()
            samples += r.content.count(b".jpg\x00")  # one member per sample
    return samples, time.perf_counter() - start


def run_local(pool: Any, paths: list[Path]) -> tuple[int, float]:
    start = time.perf_counter()
    samples = 0
    for path in paths:
        dataset = wds.WebDataset(str(path), shardshuffle=False)
        for _ in pool.imap(resize, dataset, chunksize=2):
            samples += 1
    return samples, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=None, help="default: the transformer's own")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--samples", type=int, default=100, help="samples per shard")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    flags = [] if args.workers is None else ["--workers", str(args.workers)]
    args.workers = args.workers or usable_cpus()

    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    paths = make_shards(tmp, args.shards, args.samples)
    size = sum(path.stat().st_size for path in paths) / 1e6
    print(f"{args.shards} shards x {args.samples} samples ({size:.1f} MB), {args.workers} workers")

    spec = {
        "mode": "wds",
        "code": {
            "pickled": base64.b64encode(cloudpickle.dumps(resize)).decode(),
            "pythonVersion": runtime_python_version(),
        },
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SLUICE_ETL_NAME": "bench", "SLUICE_ETL_SPEC": json.dumps(spec)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etl_runtime.webserver",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{url}/health", timeout=180, proc=server)
        with multiprocessing.get_context("forkserver").Pool(args.workers) as pool:
            run_local(pool, paths[:1])  # warm up both
            run_transformer(url, paths[:1])
            local: list[float] = []
            remote: list[float] = []
            for r in range(args.rounds):
                n, t = run_local(pool, paths)
                local.append(n / t)
                print(f"round {r}: local Pool      {n} samples in {t:6.2f}s = {n / t:7.1f}/s")
                n, t = run_transformer(url, paths)
                remote.append(n / t)
                print(f"round {r}: transformer     {n} samples in {t:6.2f}s = {n / t:7.1f}/s")
                print(f"round {r}: ratio transformer/local = {remote[-1] / local[-1]:.2f}")
    finally:
        server.terminate()
        server.wait()
    best_local, best_remote = max(local), max(remote)
    ratios = sorted(b / a for a, b in zip(local, remote, strict=True))
    print(
        f"best: local {best_local:.1f}/s, transformer {best_remote:.1f}/s, "
        f"ratio transformer/local = {best_remote / best_local:.2f}; median of the rounds' "
        f"ratios {ratios[len(ratios) // 2]:.2f} (goal >= 1.0 on 2 cores, 1.15 on 16)"
    )


if __name__ == "__main__":
    main()
