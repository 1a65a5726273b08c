"""``etl_runtime.pytorch`` figures, each as a ratio measured in one run.

1. ``DynamicBatchSampler`` over 1,000,000 synthetic sizes: seconds to plan and
   walk every batch; with the ``aistore`` package importable, the same for
   ``aistore.pytorch.DynamicBatchSampler`` on the same sizes, and the ratio
   (goal: Sluice ≤ 0.05 of it, under 1.5 s).
2. ``ShardReader`` samples/s ÷ ``wds.WebDataset(urls)`` samples/s over the same
   shards on a local cluster, both in a ``DataLoader(num_workers=4)`` (goal ≥ 1).
3. ``ObjectDataset`` in a ``DataLoader(num_workers=8)`` ÷ single-thread GETs,
   1 KiB objects (worker start-up included).

Run: ``.venv/bin/python bench/pytorch.py`` (``--quick`` for a smaller run).
aistore is not a Sluice dependency; to compare against it, make it importable,
e.g. ``pip install --target /tmp/ais aistore==2.0.0`` plus its imports, then
``PYTHONPATH=/tmp/ais .venv/bin/python bench/pytorch.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data (a smoke run)")
    parser.add_argument("--targets", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {machine()}")
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
