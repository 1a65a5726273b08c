"""The runtime image runs a transformer pod exactly as the operator writes it.

``etl_operator.pods.transformer_pod`` gives the container's command, env and
volumes for an ETL; they run here with podman + runc from
``localhost/sluice/runtime:dev`` (read-only root, the pod's emptyDirs as tmpfs,
host network in place of the pod IP). The transformer then answers the
target's hpush ``PUT /{bucket}/{object}`` with transformed bytes: code sent as
source text (``kubectl apply``) using the image's pillow, and code cloudpickled
by this Python (the SDK), which the image's Python 3.11 must load. Last, a
target container from the server image relays an ETL GET to the transformer
container, as a target pod does to the transformer pod beside it.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from etl_operator.pods import EtlRef, transformer_pod
from etl_runtime.cluster.local.registry import FileRegistry
from etl_runtime.cluster.records import EtlRecord, TargetInfo, TransformerStatus
from etl_runtime.core.spec import EtlSpec
from etl_runtime.sdk.etl import pickle_transform
from tests.images.podman import UID, Container, PortTaken
from tests.servers import free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

CLIENT_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"  # what the SDK sends

GRAY_SOURCE = """
import io
from PIL import Image

def transform(data):
    image = Image.open(io.BytesIO(data)).convert("L")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
"""

GRAY = EtlSpec.from_dict(
    {"mode": "object", "workers": 1, "code": {"source": GRAY_SOURCE, "entrypoint": "transform"}}
)


def reverse_words(data: bytes, args: str) -> bytes:
    return b" ".join(reversed(data.split())) + f" [{args}]".encode()


def run_transformer(name: str, spec: EtlSpec) -> tuple[Container, str]:
    """The operator's transformer pod for ``spec``, as a podman container on a free port."""
    pod = transformer_pod(
        EtlRef(name=name, namespace="data", uid="uid-1"),
        spec,
        TargetInfo(id="t0", url="http://127.0.0.1:1", node="node-a"),
        image="localhost/sluice/runtime:dev",
        with_token=False,
    )
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    emptydirs = {v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v}
    tmpfs = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in emptydirs]
    for _ in range(4):  # another port when another test's server took the free one
        port = free_port()
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env = {k: v.replace("$(POD_IP)", "127.0.0.1") for k, v in env.items()}
        env["SLUICE_PORT"] = str(port)
        argv = [a.replace("$(POD_IP)", "127.0.0.1") for a in container["command"]]
        argv[argv.index("--port") + 1] = str(port)
        running = Container(
            "runtime", argv[1:], entrypoint=argv[0], env=env, tmpfs=tmpfs, name=f"etl-{name}"
        )
        url = f"http://127.0.0.1:{port}"
        try:
            running.wait_http(f"{url}/health", timeout=180.0)
            return running, url
        except PortTaken:
            running.stop()
        except BaseException:
            running.stop()
            raise
    raise AssertionError(f"no free port held long enough to start the {name} transformer")


@pytest.fixture(scope="module")
def gray(built_images: dict[str, Any]) -> Iterator[tuple[Container, str]]:
    container, url = run_transformer("gray", GRAY)
    with container:
        yield container, url


def test_source_etl_transforms_an_image_with_the_image_pillow(gray: tuple[Container, str]) -> None:
    container, url = gray
    picture = Image.new("RGB", (64, 48), (200, 30, 90))
    raw = io.BytesIO()
    picture.save(raw, format="PNG")
    r = httpx.put(f"{url}/photos/cat.png", content=raw.getvalue(), timeout=120.0)
    assert r.status_code == 200, r.text
    out = Image.open(io.BytesIO(r.content))
    assert out.format == "PNG" and out.mode == "L" and out.size == (64, 48)
    assert out.getpixel((10, 10)) == picture.convert("L").getpixel((10, 10))
    assert container.proc_ids() == (UID, UID)  # the image's USER, not root


def test_transformer_reports_its_etl_and_health(gray: tuple[Container, str]) -> None:
    _, url = gray
    r = httpx.get(f"{url}/health", timeout=30.0)
    assert r.status_code == 200
    bad = httpx.put(f"{url}/photos/not-a-picture.png", content=b"plain text", timeout=120.0)
    assert bad.status_code >= 400 and bad.status_code != 500, bad.text
    error = bad.json()
    assert error["etl"] == "gray" and "not-a-picture.png" in error["object"], error


def test_sdk_pickled_code_runs_in_the_image(built_images: dict[str, Any]) -> None:
    """What ``init_code(transform=fn)`` sends: cloudpickled here, loaded by the image's Python."""
    spec = EtlSpec.from_dict(
        {
            "mode": "object",
            "workers": 1,
            "code": {"pickled": pickle_transform(reverse_words), "pythonVersion": CLIENT_PYTHON},
        }
    )
    container, url = run_transformer("reverse", spec)
    with container:
        r = httpx.put(
            f"{url}/docs/a.txt", params={"etl_args": "v2"}, content=b"one two three", timeout=120.0
        )
        assert r.status_code == 200, r.text
        assert r.content == b"three two one [v2]"
        version = "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"
        assert container.exec("python", "-c", version).stdout.strip() == CLIENT_PYTHON


def test_a_target_container_serves_the_etl_through_the_transformer_container(
    gray: tuple[Container, str], cluster: tuple[str, Container, Container, Path]
) -> None:
    """The data path on images: object on the target's volume -> transformer -> client."""
    _, transformer_url = gray
    url, target, _, data = cluster
    registry = FileRegistry(data.parent / "registry")
    registry.write(
        EtlRecord(
            name="gray",
            uid="uid-1",
            spec=GRAY,
            phase="Running",
            transformers=(TransformerStatus(target="t0", endpoint=transformer_url, ready=True),),
        )
    )
    os.chown(registry.path("gray"), UID, UID)  # written 0600, as the target's user would
    picture = Image.new("RGB", (32, 32), (10, 200, 40))
    raw = io.BytesIO()
    picture.save(raw, format="PNG")
    with httpx.Client(base_url=url, timeout=120.0, follow_redirects=True) as client:
        assert client.post("/v1/buckets/pets", json={"action": "create-bck"}).status_code < 300
        assert client.put("/v1/objects/pets/dog.png", content=raw.getvalue()).status_code == 200
        r = client.get("/v1/objects/pets/dog.png", params={"etl_name": "gray"})
    assert r.status_code == 200, r.text
    out = Image.open(io.BytesIO(r.content))
    assert out.mode == "L" and out.size == (32, 32), target.logs()
