"""The loaders side by side (``bench/pytorch.py --loaders``): one child runs them all.

Each loader reads the same JPEG images, in a ``DataLoader(num_workers=W)``,
ETL off (the stored bytes) and on (a per-sample resize: on the storage
target for Sluice's ``ShardReader`` and for ``wds.WebDataset`` over ETL
URLs; in the loader's workers for LitData, which reads its own chunk format
through Sluice's S3 API). Client CPU is this process's and its reaped
children's (the DataLoader workers, webdataset's curl) user + system time;
server CPU is that of the cluster's processes (``sluice up`` and below: the
gateway, the targets, the transformers and their workers), by role.
"""

from __future__ import annotations

import io
import json
import resource
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZE = 64


def resize(data: bytes) -> bytes:
    """The per-sample ETL: decode a JPEG, resize it to SIZE x SIZE, encode it again."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def resize_sample(sample: dict) -> dict:
    sample["jpg"] = resize(sample["jpg"])
    return sample


def cpu() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


ROLES = ("gateway", "targets", "transformers")


def server_cpu(pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the cluster's processes under ``pid``, by role."""
    import psutil

    total = dict.fromkeys(ROLES, 0.0)
    if pid is None:
        return total
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            argv = " ".join(proc.cmdline())
            t = proc.cpu_times()
        except psutil.Error:
            continue
        role = "gateway" if "etl_runtime.gateway" in argv else "transformers"
        role = "targets" if "etl_runtime.storage_target" in argv else role
        total[role] += t.user + t.system + t.children_user + t.children_system
    return total


def measure(make: Callable[[], Iterable[Any]], cluster: int | None = None) -> dict[str, float]:
    s0, c0, t0 = server_cpu(cluster), cpu(), time.perf_counter()
    loader = make()
    n = sum(1 for _ in loader)
    del loader  # its workers are joined (reaped) here
    got = {"samples": n, "seconds": time.perf_counter() - t0, "cpu": cpu() - c0}
    s1 = server_cpu(cluster)
    return {**got, **{role: s1[role] - s0[role] for role in ROLES}}


def run(config: dict[str, Any]) -> dict[str, Any]:
    import webdataset as wds
    from torch.utils.data import DataLoader

    from etl_runtime import Client
    from etl_runtime.pytorch import ShardReader, Source

    endpoint, workers, etl = config["endpoint"], config["workers"], config["etl"]
    client = Client(endpoint)
    bucket = client.bucket(config["bucket"])
    template = config["template"]
    results: dict[str, Any] = {}

    def sluice(on: bool, ahead: bool = True) -> DataLoader:
        reader = ShardReader(
            Source(bucket, template=template),
            etl_name=etl if on else None,
            read_ahead=None if ahead else False,
        )
        return DataLoader(reader, batch_size=None, num_workers=workers)

    def webdataset(on: bool) -> DataLoader:
        urls = bucket.object_urls(template, etl_name=etl if on else None)
        data = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        return DataLoader(data, batch_size=None, num_workers=workers)

    loaders: dict[str, Callable[[bool], Iterable[Any]]] = {"ShardReader": sluice}
    if config.get("no_read_ahead"):  # the baseline of read_ahead, in the same rounds
        loaders["ShardReader read_ahead=False"] = lambda on: sluice(on, ahead=False)
    loaders["wds.WebDataset"] = webdataset
    if config.get("litdata"):
        import litdata
        import litdata.streaming.downloader as lit_downloader

        # LitData builds its obstore S3 store with client options that leave out
        # allow_http (and override AWS_ALLOW_HTTP): without this, it cannot read an
        # http:// endpoint at all ("builder error").
        lit_downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[assignment]
            **lit_downloader._OBSTORE_CLIENT_OPTIONS,
            "allow_http": True,
        }

        class Resized(litdata.StreamingDataset):  # the same resize, in the loader's workers
            def __getitem__(self, index: Any) -> Any:
                item = super().__getitem__(index)
                return {**item, "jpg": resize(item["jpg"])}

        lit = config["litdata"]

        def litdata_loader(on: bool) -> Any:
            cls = Resized if on else litdata.StreamingDataset
            data = cls(
                lit["url"],
                storage_options=lit["storage_options"],
                cache_dir=lit["cache"] + ("-on" if on else "-off") + f"-{time.monotonic_ns()}",
            )
            return DataLoader(data, batch_size=None, num_workers=workers)

        loaders["litdata.StreamingDataset"] = litdata_loader
    for rnd in range(config["rounds"]):
        for name, make in loaders.items():
            for on in config.get("etl_rows", (False, True)):
                key = f"{name} etl={'on' if on else 'off'}"
                try:
                    got: Any = measure(lambda m=make, o=on: m(o), config.get("cluster_pid"))
                except Exception as exc:  # one library failing does not sink the others
                    got = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(key, got, file=sys.stderr, flush=True)
                results.setdefault(key, []).append(got)
        print(f"round {rnd + 1} done", file=sys.stderr)
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
