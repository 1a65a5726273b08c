"""``etl_runtime.pytorch`` figures, each as a ratio measured in one run.

1. ``DynamicBatchSampler`` over 1,000,000 synthetic sizes: seconds to plan and
   walk every batch; with the ``aistore`` package importable, the same for
   ``aistore.pytorch.DynamicBatchSampler`` on the same sizes, and the ratio
   (goal: Sluice ≤ 0.05 of it, under 1.5 s).
2. ``ShardReader`` samples/s ÷ ``wds.WebDataset(urls)`` samples/s over the same
   shards on a local cluster, both in a ``DataLoader(num_workers=4)`` (goal ≥ 1).
3. ``ObjectDataset`` in a ``DataLoader(num_workers=8)`` ÷ single-thread GETs,
   1 KiB objects (worker start-up included).

4. ``--loaders`` (alone): Sluice's ``ShardReader``, ``wds.WebDataset`` over the
   same URLs and LitData's ``StreamingDataset`` reading the same JPEGs through
   Sluice's S3 API (in its own format, written by ``litdata.optimize()``),
   samples/s and client CPU per sample, ETL off and on
   (``bench/pytorch_loaders.py``), ``--rounds`` rounds. LitData is a dev
   dependency. Mosaic's ``streaming`` is not compared: its dependencies
   (transformers, the azure, oci and google-cloud SDKs, CUDA torch wheels) do
   not belong in this project's lock (``docs/benchmarks.md``).

Run: ``.venv/bin/python bench/pytorch.py`` (``--quick`` for a smaller run);
``.venv/bin/python bench/pytorch.py --loaders --rounds 3``.
The ``aistore`` SDK (a test dependency) gives figure 1 its baseline.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from etl_runtime import Client  # noqa: E402
from etl_runtime.local.up import LocalCluster  # noqa: E402
from etl_runtime.pytorch import DynamicBatchSampler, ObjectDataset, ShardReader  # noqa: E402


def best_of(runs: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu}), load average {load}; Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def bench_sampler(n: int) -> None:
    sizes = np.random.default_rng(0).integers(1_000, 1_000_000, n)
    limit = 16_000_000  # ~32 samples of 500 kB on average per batch

    def sluice() -> int:
        return sum(1 for _ in DynamicBatchSampler(sizes, limit, shuffle=True, seed=1))

    def sluice_unshuffled() -> int:
        return sum(1 for _ in DynamicBatchSampler(sizes, limit))

    t_sluice, batches = best_of(3, sluice)
    t_plain, plain_batches = best_of(3, sluice_unshuffled)
    print(f"DynamicBatchSampler, {n:,} sizes, max 16 MB")
    print(f"  sluice   shuffled   {t_sluice:7.3f} s  ({batches:,} batches)")
    print(f"  sluice   in order   {t_plain:7.3f} s  ({plain_batches:,} batches)")
    try:
        from aistore.pytorch import DynamicBatchSampler as AisSampler
    except ImportError:
        print("  aistore: not importable here, no comparison (see the module docstring)")
        return
    objs = [
        SimpleNamespace(name=str(i), props_cached=SimpleNamespace(size=int(s)))
        for i, s in enumerate(sizes)
    ]
    source = SimpleNamespace(get_obj_list=lambda: objs)

    def aistore(shuffle: bool) -> int:
        return sum(1 for _ in AisSampler(source, limit, shuffle=shuffle))  # type: ignore[arg-type]

    t_ais_plain, ais_plain = best_of(1, lambda: aistore(False))
    t_ais, ais_batches = best_of(1, lambda: aistore(True))
    same = [len(b) for b in DynamicBatchSampler(sizes, limit)] == [
        len(b)
        for b in AisSampler(source, limit)  # type: ignore[arg-type]
    ]
    print(f"  aistore  shuffled   {t_ais:7.3f} s  ({ais_batches:,} batches)")
    print(f"  aistore  in order   {t_ais_plain:7.3f} s  ({ais_plain:,} batches)")
    print(f"  same batches in order: {same}")
    ratios = f"shuffled {t_sluice / t_ais:.3f}, in order {t_plain / t_ais_plain:.3f}"
    print(f"  ratio sluice/aistore: {ratios}")


def count(loader: DataLoader) -> int:
    return sum(1 for _ in loader)


def bench_shards(client: Client, shards: int, per_shard: int) -> None:
    bucket = client.bucket("bench-shards").create()
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(shards):
            path = Path(tmp) / f"shard-{s:03d}.tar"
            with wds.TarWriter(str(path)) as w:
                for i in range(per_shard):
                    w.write(
                        {
                            "__key__": f"s{s}_{i:05d}",
                            "bin": rng.bytes(int(rng.integers(2_000, 30_000))),
                            "cls": i % 10,
                        }
                    )
            bucket.object(path.name).put_file(path)
    urls = bucket.object_urls(f"shard-{{000..{shards - 1:03d}}}.tar")
    reader = ShardReader(bucket)
    webdataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    total = shards * per_shard
    t_wds, n_wds = best_of(2, lambda: count(DataLoader(webdataset, num_workers=4, batch_size=None)))
    t_sr, n_sr = best_of(2, lambda: count(DataLoader(reader, num_workers=4, batch_size=None)))
    assert n_sr == n_wds == total, (n_sr, n_wds, total)
    print(f"ShardReader vs wds.WebDataset(urls), {shards} shards x {per_shard} samples, 4 workers")
    print(f"  ShardReader        {total / t_sr:9.0f} samples/s")
    print(f"  wds.WebDataset     {total / t_wds:9.0f} samples/s")
    print(f"  ratio              {t_wds / t_sr:9.2f}")


def bench_objects(client: Client, objects: int) -> None:
    bucket = client.bucket("bench-small").create()
    payload = os.urandom(1024)
    for i in range(objects):
        bucket.object(f"o-{i:06d}").put_content(payload)
    dataset = ObjectDataset(bucket)

    def single() -> int:
        with Client(client.endpoint) as c:
            b = c.bucket("bench-small")
            return sum(len(b.object(name).get_bytes()) for name in dataset.names)

    def workers() -> int:
        loader = DataLoader(dataset, num_workers=8, batch_size=64, collate_fn=list)
        return sum(len(batch) for batch in loader)

    t_single, _ = best_of(2, single)
    t_workers, n = best_of(2, workers)
    assert n == objects
    print(f"ObjectDataset, {objects:,} objects of 1 KiB")
    print(f"  single-thread GETs {objects / t_single:9.0f} objects/s")
    print(f"  8 workers          {objects / t_workers:9.0f} objects/s")
    print(f"  ratio              {t_single / t_workers:9.2f}")


def make_images(n: int) -> list[tuple[str, bytes, int]]:
    """``n`` JPEGs of 160 x 160 (smooth gradients plus noise: a photo's size, ~8 KB)."""
    from PIL import Image

    rng = np.random.default_rng(4)
    ramp = np.linspace(0, 255, 160)
    out = []
    for i in range(n):
        base = np.stack([np.add.outer(ramp * rng.random(), ramp * rng.random()) / 2] * 3, -1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
        out.append((f"img{i:06d}", buf.getvalue(), i % 10))
    return out


def lit_item(item: tuple[str, bytes, int]) -> dict[str, Any]:
    return {"key": item[0], "jpg": item[1], "cls": item[2]}


def bench_loaders(
    client: Client, images: int, workers: int, rounds: int, args: argparse.Namespace, pid: int
) -> None:
    """ShardReader, wds.WebDataset and LitData on the same images, ETL off and on."""
    import cloudpickle
    import httpx
    import pytorch_loaders as loaders  # bench/pytorch_loaders.py: what the measuring child runs

    cloudpickle.register_pickle_by_value(loaders)  # the ETL's code travels by value
    data = make_images(images)
    per_shard = 128
    shards = (images + per_shard - 1) // per_shard
    bucket = client.bucket("bench-loaders").create()
    etl = client.etl("bench-resize")
    etl.init_code(transform=loaders.resize_sample, mode="wds", workers=2, wait=False)
    for s in range(shards):
        buf = io.BytesIO()
        with wds.TarWriter(buf) as w:
            for key, jpg, cls in data[s * per_shard : (s + 1) * per_shard]:
                w.write({"__key__": key, "jpg": jpg, "cls": cls})
        bucket.object(f"shard-{s:03d}.tar").put_content(buf.getvalue())
    etl.wait_until_running(300)
    config: dict[str, Any] = {
        "endpoint": client.endpoint,
        "bucket": bucket.name,
        "template": f"shard-{{000..{shards - 1:03d}}}.tar",
        "etl": "bench-resize",
        "workers": workers,
        "rounds": rounds,
        "cluster_pid": pid,
        "no_read_ahead": args.no_read_ahead,
        "etl_rows": {"both": [False, True], "on": [True], "off": [False]}[args.etl],
    }
    key = httpx.post(f"{client.endpoint}/v1/s3/keys", json={"permission": "write"}).json()
    options = {
        "endpoint_url": f"{client.endpoint}/s3",
        "aws_access_key_id": key["access_key"],
        "aws_secret_access_key": key["secret_key"],
        "region_name": "us-east-1",
    }
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": key["access_key"],
        "AWS_SECRET_ACCESS_KEY": key["secret_key"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",  # LitData downloads chunks with obstore: http needs this
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if not args.no_litdata:
                config["litdata"] = litdata_over_s3(data, Path(tmp), options)
        except ImportError as exc:
            print(f"  litdata: not importable here ({exc}), no comparison")
        child = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("pytorch_loaders.py")),
                json.dumps(config),
            ],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
    results = json.loads(child.stdout)
    size = sum(len(j) for _, j, _ in data) / len(data)
    print(
        f"Loaders, {images} JPEGs of 160x160 ({size / 1024:.1f} KiB), {shards} wds shards, "
        f"DataLoader(num_workers={workers}), {rounds} rounds (median; each round's)"
    )
    print("  CPU: ms per sample, client | gateway, targets, transformers (the servers')")
    head = f"  {'loader':40s} {'samples/s':>9s} {'client':>7s} {'gw':>5s} {'tgt':>5s} {'etl':>5s}"
    print(f"{head}   rounds (samples/s; client ms)")

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    for key, runs in results.items():
        failed = [r["error"] for r in runs if "error" in r]
        if failed:
            print(f"  {key:40s} failed: {failed[0]}")
            continue
        assert all(r["samples"] == images for r in runs), (key, runs)
        rate = median([r["samples"] / r["seconds"] for r in runs])
        ms = [
            median([1000 * r[role] / r["samples"] for r in runs])
            for role in ("cpu", "gateway", "targets", "transformers")
        ]
        each = ", ".join(
            f"{r['samples'] / r['seconds']:.0f}; {1000 * r['cpu'] / r['samples']:.2f}" for r in runs
        )
        figures = f"{rate:9.0f} {ms[0]:7.2f} {ms[1]:5.2f} {ms[2]:5.2f} {ms[3]:5.2f}"
        print(f"  {key:40s} {figures}   {each}")


def upload(directory: Path, bucket: str, options: dict[str, Any]) -> None:
    """Every file of ``directory`` to ``s3://bucket/ds/``, through Sluice's S3 API (boto3)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", **options, config=Config(s3={"addressing_style": "path"}))
    s3.create_bucket(Bucket=bucket)
    for path in sorted(directory.iterdir()):
        s3.upload_file(str(path), bucket, f"ds/{path.name}")


def litdata_over_s3(data: list, tmp: Path, options: dict[str, Any]) -> dict[str, Any]:
    """The images in LitData's format (``optimize()``), uploaded through Sluice's S3 API."""
    import litdata

    out = tmp / "litdata"
    litdata.optimize(
        fn=lit_item, inputs=data, output_dir=str(out), chunk_bytes="4MB", num_workers=1
    )
    upload(out, "bench-litdata", options)
    return {"url": "s3://bench-litdata/ds", "storage_options": options, "cache": str(tmp / "lc")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data (a smoke run)")
    parser.add_argument("--targets", type=int, default=2)
    parser.add_argument(
        "--loaders", action="store_true", help="only the loaders side by side (ShardReader, ...)"
    )
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--etl", choices=("both", "on", "off"), default="both", help="--loaders: which rows"
    )
    parser.add_argument(
        "--no-litdata", action="store_true", help="--loaders: leave LitData out (a shorter run)"
    )
    parser.add_argument(
        "--no-read-ahead",
        action="store_true",
        help="--loaders: add ShardReader(read_ahead=False) rows, the baseline of read-ahead",
    )
    args = parser.parse_args()
    print(f"machine: {machine()}")
    if args.loaders:
        with (
            tempfile.TemporaryDirectory() as data,
            LocalCluster(Path(data), targets=args.targets, port=0) as cluster,
            Client(str(cluster.endpoint)) as client,
        ):
            print(f"cluster: local, {args.targets} targets")
            bench_loaders(client, args.images, args.workers, args.rounds, args, cluster.pid)
        return
    bench_sampler(1_000_000)
    with (
        tempfile.TemporaryDirectory() as data,
        LocalCluster(Path(data), targets=args.targets, port=0) as cluster,
        Client(str(cluster.endpoint)) as client,
    ):
        print(f"cluster: local, {args.targets} targets")
        bench_shards(client, 8 if args.quick else 16, 100 if args.quick else 400)
        bench_objects(client, 500 if args.quick else 3000)


if __name__ == "__main__":
    main()
