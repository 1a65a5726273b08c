"""examples/resume/train.py: a training loop killed mid-epoch resumes with another worker count."""

from __future__ import annotations

import importlib.util
import signal
from collections import Counter
from pathlib import Path

import pytest

from etl_runtime import Client

pytestmark = pytest.mark.torch
pytest.importorskip("torchdata.stateful_dataloader")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resume" / "train.py"


def test_killed_mid_epoch_then_resumed_with_1_worker_trains_on_each_sample_once(
    client: Client, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("examples_resume_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    lines: list[str] = []
    result = example.run(client.endpoint, tmp_path, kill_after=5, log=lines.append)
    assert result["killed"] == signal.SIGKILL
    assert "20 of 48 samples trained on" in lines[1]  # 5 steps of 4, then the kill
    keys = result["keys"]
    assert len(keys) == 48 and len(result["seen"]) == 2
    for epoch in result["seen"]:
        assert Counter(epoch) == Counter(keys)  # epoch 0 across the kill, and epoch 1
