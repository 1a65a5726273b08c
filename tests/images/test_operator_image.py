"""The operator image starts its entrypoint and loads the kopf handlers, as non-root."""

from __future__ import annotations

from typing import Any

import pytest

from tests.images.podman import UID, podman, ref, run_once

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]


def test_entrypoint_prints_its_usage(built_images: dict[str, Any]) -> None:
    proc = run_once("operator", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: sluice-operator"), proc.stdout
    assert "--namespace" in proc.stdout and "--peering" in proc.stdout


def test_handlers_load_as_uid_10001_on_a_read_only_root(built_images: dict[str, Any]) -> None:
    """What ``sluice-operator`` imports before it calls the apiserver: kopf, client, handlers."""
    code = "import os, etl_operator.handlers, kopf, kubernetes; print(os.getuid(), os.getgid())"
    proc = run_once("operator", "-c", code, entrypoint="python")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(UID), str(UID)]
    config = podman(
        "image",
        "inspect",
        "--format",
        "{{json .Config.Entrypoint}} {{.Config.User}}",
        ref("operator"),
    )
    assert config.split() == ['["sluice-operator"]', f"{UID}:{UID}"]
