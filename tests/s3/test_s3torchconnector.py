"""s3torchconnector (AWS CRT client) against the gateway's S3 API: a dataset and a checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

s3tc = pytest.importorskip("s3torchconnector")


def test_map_dataset_and_checkpoint(
    endpoint: str, writer: dict[str, Any], s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", writer["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", writer["secret_key"])
    s3.create_bucket(Bucket="s3-torch")
    for i in range(5):
        s3.put_object(Bucket="s3-torch", Key=f"train/{i}", Body=f"sample {i}".encode() * 100)
    config = s3tc.S3ClientConfig(force_path_style=True)
    ds = s3tc.S3MapDataset.from_prefix(
        "s3://s3-torch/train/",
        region="us-east-1",
        endpoint=f"{endpoint}/s3",
        s3client_config=config,
    )
    assert len(ds) == 5
    assert ds[3].key == "train/3" and ds[3].read() == b"sample 3" * 100
    checkpoint = s3tc.S3Checkpoint(
        region="us-east-1", endpoint=f"{endpoint}/s3", s3client_config=config
    )
    blob = bytes(range(256)) * (40 << 12)  # 10 MiB: the CRT uploads it in parts
    with checkpoint.writer("s3://s3-torch/ckpt/model.pt") as w:
        w.write(blob)
    with checkpoint.reader("s3://s3-torch/ckpt/model.pt") as r:
        assert r.read() == blob
