"""The whole pets workflow in one call: make data, convert, register the ETL, train.

``run_workflow(client, work_dir)`` runs the three step scripts of this folder
end to end against any Sluice cluster, printing progress, then writes a PNG
grid that shows a few original images above what the ETL made of them
(de-normalised). ``examples/demo.py`` calls it against a local cluster; the
step scripts can also be run one by one (see ``docs/webdataset.md``).

The step modules have names that start with a digit (they are meant to be run
in order), so they are loaded with ``importlib`` from this folder.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw

if TYPE_CHECKING:
    from etl_runtime import Client

HERE = Path(__file__).resolve().parent
GRID_CELL = 224
GRID_PAD = 8


def load_step(name: str) -> ModuleType:
    """Import ``make_dataset``, ``1_convert``, ``2_register_etl`` or ``3_train`` from here."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def grid_size(columns: int, cell: int = GRID_CELL, pad: int = GRID_PAD) -> tuple[int, int]:
    """``(width, height)`` of a grid of ``columns`` originals above their transforms."""
    return columns * cell + (columns + 1) * pad, 2 * cell + 3 * pad


def denormalize(array: np.ndarray, mean: Any, std: Any) -> Image.Image:
    """A normalised CHW float array back to a viewable RGB image."""
    chw = (
        array * np.asarray(std, np.float32)[:, None, None]
        + np.asarray(mean, np.float32)[:, None, None]
    )
    hwc = (np.clip(chw, 0.0, 1.0).transpose(1, 2, 0) * 255).round().astype(np.uint8)
    return Image.fromarray(hwc, "RGB")


def make_grid(
    originals: list[Image.Image],
    transformed: list[Image.Image],
    labels: list[str],
    cell: int = GRID_CELL,
    pad: int = GRID_PAD,
) -> Image.Image:
    """Originals (letter-boxed to ``cell``) on the top row, transforms below."""
    grid = Image.new("RGB", grid_size(len(originals), cell, pad), (250, 250, 250))
    draw = ImageDraw.Draw(grid)
    for i, (original, after, label) in enumerate(zip(originals, transformed, labels, strict=True)):
        x = pad + i * (cell + pad)
        thumb = original.convert("RGB")
        thumb.thumbnail((cell, cell))
        box = Image.new("RGB", (cell, cell), (40, 40, 40))
        box.paste(thumb, ((cell - thumb.width) // 2, (cell - thumb.height) // 2))
        grid.paste(box, (x, pad))
        grid.paste(after.resize((cell, cell)), (x, 2 * pad + cell))
        draw.text((x + 4, pad + 4), label, fill=(255, 255, 255))
    return grid


def write_grid(
    bucket: Any,
    shard: str,
    etl_name: str,
    path: Path,
    count: int = 6,
    mean: Any = None,
    std: Any = None,
) -> Path:
    """Read ``count`` samples of ``shard`` raw and through the ETL; save the grid to ``path``.

    The ETL keeps sample order, and the grid matches the two sides by key anyway.
    """
    import webdataset as wds

    register = load_step("2_register_etl")
    mean = register.IMAGENET_MEAN if mean is None else mean
    std = register.IMAGENET_STD if std is None else std
    make = load_step("make_dataset")
    raw_url = bucket.object(shard).url()
    etl_url = bucket.object(shard).url(etl_name)
    raw = {s["__key__"]: s for s in wds.WebDataset([raw_url], shardshuffle=False).decode("pil")}
    originals, transformed, labels = [], [], []
    for sample in wds.WebDataset([etl_url], shardshuffle=False).decode():
        source = raw[sample["__key__"]]
        originals.append(source["jpg"])
        transformed.append(denormalize(sample["npy"], mean, std))
        labels.append(make.BREEDS[int(sample["cls"])])
        if len(originals) == count:
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    make_grid(originals, transformed, labels).save(path)
    return path


def run_workflow(
    client: Client,
    work_dir: str | Path,
    *,
    images: int = 240,
    classes: int = 37,
    maxcount: int = 48,
    epochs: int = 2,
    bucket: str = "pets",
    etl_name: str = "pets-train",
    num_workers: int | None = None,
    etl_workers: int | None = 1,
    grid_path: str | Path | None = None,
    grid_samples: int = 6,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run steps 1-3 end to end; returns the figures and the grid's path.

    Keys: ``images``, ``shards``, ``samples_written``, ``urls``, ``epochs`` (per
    epoch: ``samples``, ``seconds``, ``samples_per_s``, ``loss``),
    ``samples_per_s`` (best epoch), ``classes_read`` (first epoch, sorted),
    ``etl_stats`` and ``grid_path``. ``num_workers`` (DataLoader workers)
    defaults to 4, or fewer on a machine with fewer CPUs. ``etl_workers``
    (worker processes per transformer) defaults to 1: each worker imports torch
    on its first sample, which dominates the first epoch on a laptop running
    every target; ``None`` means the runtime's default (one per CPU).
    """
    make, convert, register, train = (
        load_step(n) for n in ("make_dataset", "1_convert", "2_register_etl", "3_train")
    )
    if num_workers is None:
        num_workers = min(4, os.cpu_count() or 1)
    work = Path(work_dir)
    grid = Path(grid_path) if grid_path is not None else work / "pets-grid.png"
    started = time.monotonic()

    log(f"[1/4] drawing {images} pet images of {classes} classes in {work / 'pets'}")
    records = make.make_pets(work / "pets", images=images, classes=classes)
    log(f"[1/4] packing shards of {maxcount} samples and uploading to {client.endpoint}")
    handle = client.bucket(bucket)
    converted = convert.convert_and_upload(handle, records, maxcount=maxcount, shard_dir=work)
    log(f"      {converted.samples} samples, {converted.bytes / 1e6:.1f} MB in {bucket}/")

    log(f"[2/4] registering wds ETL {etl_name!r} (RandomResizedCrop(224), ToTensor, Normalize)")
    t0 = time.monotonic()
    etl = register.register_etl(client, etl_name, workers=etl_workers)
    log(f"      Running after {time.monotonic() - t0:.1f}s")

    urls = handle.object_urls(convert.shard_brace(len(converted.shards)), etl_name=etl_name)
    log(f"[3/4] training {epochs} epochs over {len(urls)} shards, e.g. {urls[0]}")
    epoch_stats = train.train(
        urls, epochs=epochs, classes=classes, num_workers=num_workers, log=log
    )

    log(f"[4/4] writing the original-vs-transformed grid to {grid}")
    write_grid(handle, converted.shards[0], etl_name, grid, count=grid_samples)
    details = etl.details()
    log(f"done in {time.monotonic() - started:.1f}s; ETL stats {details.stats}")
    return {
        "images": len(records),
        "shards": converted.shards,
        "samples_written": converted.samples,
        "urls": urls,
        "epochs": [
            {
                "samples": s.samples,
                "seconds": s.seconds,
                "samples_per_s": s.samples_per_s,
                "loss": s.loss,
            }
            for s in epoch_stats
        ],
        "samples_per_s": max(s.samples_per_s for s in epoch_stats),
        "classes_read": sorted(epoch_stats[0].classes) if epoch_stats else [],
        "etl_stats": details.stats,
        "grid_path": grid,
    }
