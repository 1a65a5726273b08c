"""The pets workflow (examples/pets) against a real local cluster.

Small on purpose: 60 images in shards of 16 (the last one short), read back
through the gateway with webdataset, whose ``curl -L`` follows the 307 to the
owning target.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import webdataset as wds
from PIL import Image

from etl_runtime import Client

IMAGES = 60
MAXCOUNT = 16
SHARDS = 4  # 16 + 16 + 16 + 12


@pytest.fixture(scope="module")
def uploaded(
    client: Client, steps: dict[str, ModuleType], tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[Any], Any]:
    """Step 1 once for the module: draw the images, pack and upload the shards."""
    work = tmp_path_factory.mktemp("pets")
    records = steps["make_dataset"].make_pets(work / "data", images=IMAGES)
    converted = steps["convert"].convert_and_upload(
        client.bucket("pets"), records, maxcount=MAXCOUNT, shard_dir=work
    )
    return records, converted


def test_convert_uploads_every_sample_in_shards(
    client: Client, steps: dict[str, ModuleType], uploaded: tuple[list[Any], Any]
) -> None:
    records, converted = uploaded
    bucket = client.bucket("pets")
    names = [o.name for o in bucket.list_objects(prefix="shard-")]
    assert names == converted.shards == [f"shard-{i:06d}.tar" for i in range(SHARDS)]
    assert converted.samples == IMAGES

    urls = bucket.object_urls(steps["convert"].shard_brace(SHARDS))
    # The gateway redirects; webdataset's `curl -L` must follow it.
    assert httpx.get(urls[0], follow_redirects=False).status_code == 307
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert [len(list(wds.WebDataset([u], shardshuffle=False))) for u in urls] == [16, 16, 16, 12]
    by_key = {s["__key__"]: s for s in samples}
    assert len(by_key) == IMAGES
    for record in records:
        sample = by_key[record.name]
        # "Abyssinian_1.trimap.png" groups as field "trimap.png" of key "Abyssinian_1".
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {
            "jpg",
            "cls",
            "trimap.png",
        }
        assert sample["jpg"] == record.image.read_bytes()
        assert sample["trimap.png"] == record.trimap.read_bytes()
        assert int(sample["cls"]) == record.class_id
    trimap = wds.WebDataset(urls[:1], shardshuffle=False).decode("l8")
    values = set(next(iter(trimap))["trimap.png"].flatten().tolist())
    assert values == {1, 2, 3}


@pytest.mark.torch
def test_training_pipeline_reads_every_transformed_sample(
    client: Client, steps: dict[str, ModuleType], uploaded: tuple[list[Any], Any]
) -> None:
    import torch

    records, converted = uploaded
    train = steps["train"]
    etl = steps["register"].register_etl(client, "pets-train", workers=1)
    urls = client.bucket("pets").list_urls(prefix="shard-", etl_name="pets-train")
    assert len(urls) == SHARDS and all("etl_name=pets-train" in u for u in urls)

    sizes: list[int] = []

    def check(images: torch.Tensor, labels: torch.Tensor) -> None:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 224, 224)
        assert labels.dtype == torch.int64 and images.shape[0] == labels.shape[0]
        # Normalize() ran: ImageNet-normalised pixels, not [0, 1] ToTensor output.
        assert float(images.min()) < 0.0
        sizes.append(len(labels))

    model = train.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = train.run_epoch(
        train.make_loader(urls, num_workers=2), model, optimizer, check=check, log=None
    )
    assert sizes[:-1] == [16] * (len(sizes) - 1) and 1 <= sizes[-1] <= 16
    assert stats.samples == sum(sizes) == converted.samples == IMAGES
    assert Counter(stats.classes) == Counter(r.class_id for r in records)
    assert math.isfinite(stats.loss)  # the SGD steps ran

    details = etl.details()
    assert details.stats["samples"] >= IMAGES
    assert details.stats["errors"] == 0 and details.stats["skipped"] == 0


@pytest.mark.torch
def test_workflow_runs_end_to_end_and_writes_the_grid(
    client: Client, workflow: ModuleType, tmp_path: Path
) -> None:
    grid = tmp_path / "grid.png"
    result = workflow.run_workflow(
        client,
        tmp_path,
        images=24,
        maxcount=8,
        epochs=2,
        bucket="pets-demo",
        etl_name="pets-train",
        num_workers=2,
        etl_workers=1,
        grid_path=grid,
        grid_samples=4,
        log=lambda line: None,
    )
    assert len(result["shards"]) == 3 and result["samples_written"] == 24
    assert [e["samples"] for e in result["epochs"]] == [24, 24]
    assert result["classes_read"] == sorted(i % 37 for i in range(24))
    assert result["samples_per_s"] > 0
    assert result["grid_path"] == grid
    with Image.open(grid) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.size == workflow.grid_size(4)
