"""The built images, once per session (``scripts/images.sh``; cached by content)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.images.podman import Container, build_images, owned_dir, serving


@pytest.fixture(scope="session")
def built_images() -> dict[str, Any]:
    """``index.json`` of ``make images``: a build when something changed, else seconds."""
    index, _ = build_images()
    return index


CLUSTER_KEY = "images-test-cluster-key"


@pytest.fixture(scope="module")
def cluster(
    built_images: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Container, Container, Path]]:
    """A target (volume /data; ETL registry file:/registry) and a gateway: URL, both, volume."""
    root = tmp_path_factory.mktemp("server-image")
    data, shared = owned_dir(root / "data"), owned_dir(root / "shared")
    registry = owned_dir(root / "registry")
    # Relay ETL answers (the chart's default without transformerClients).
    env = {"SLUICE_CLUSTER_KEY": CLUSTER_KEY, "SLUICE_ETL_REDIRECT_BYTES": "off"}
    cmap = "file:/shared/cluster.json"

    def target(port: int) -> Container:
        return Container(
            "server",
            ["--id", "t0", "--host", "127.0.0.1", "--port", str(port), "--data-dir", "/data"]
            + ["--cluster-map", cmap, "--registry", "file:/registry"],
            env=env,
            volumes={str(data): "/data", str(shared): "/shared", str(registry): "/registry"},
            name="target",
        )

    with ExitStack() as stack:
        t0, target_port = serving(stack, target)

        def gateway(port: int) -> Container:
            return Container(
                "server",
                ["--host", "127.0.0.1", "--port", str(port)]
                + ["--targets", f"t0=http://127.0.0.1:{target_port}", "--members", "t0"]
                + ["--cluster-map", cmap, "--state-dir", "/shared/etl"],
                entrypoint="sluice-gateway",
                env=env,
                volumes={str(shared): "/shared"},
                name="gateway",
            )

        gw, gateway_port = serving(stack, gateway)
        yield f"http://127.0.0.1:{gateway_port}", t0, gw, data
