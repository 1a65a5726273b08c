"""The chart runs, in each image, a program that image actually has.

``helm template`` output is matched against the Dockerfiles: every container
command is a console script its image declares (ENTRYPOINT or the
``dev.sluice.commands`` label) and the image reference points at the image
built from that Dockerfile. The operator's default transformer image is the
runtime image, whose ENTRYPOINT is the transformer.
"""

from __future__ import annotations

from tests.helm.chart import container, env_of, pod_spec, render
from tests.images.dockerfile import all_images
from tests.images.test_dockerfiles import commands_of


def image_dir(reference: str) -> str:
    """``registry/sluice/server:1.0`` -> ``server`` (the images/<name> it is built from)."""
    name = reference.split("@")[0].rsplit("/", 1)[-1]
    return name.split(":")[0]


def test_chart_commands_are_the_images_console_scripts() -> None:
    images = all_images()
    m = render({"images.registry": "r.example/ml", "operator.replicas": 2})
    seen = set()
    for workload in m.workloads():
        for c in pod_spec(workload)["containers"] + pod_spec(workload).get("initContainers", []):
            image = images[image_dir(c["image"])]
            command = c.get("command") or image.final.exec_form("ENTRYPOINT")
            assert command, c["name"]
            assert command[0] in commands_of(image), (
                f"{workload['metadata']['name']}/{c['name']} runs {command[0]!r}, "
                f"but {image.path} provides {sorted(commands_of(image))}"
            )
            seen.add(command[0])
    assert seen == {"sluice-target", "sluice-gateway", "sluice-operator"}


def test_default_transformer_image_runs_the_transformer() -> None:
    images = all_images()
    operator = container(render().component("Deployment", "operator"))
    runtime = env_of(operator)["SLUICE_RUNTIME_IMAGE"]["value"]
    assert image_dir(runtime) == "runtime"
    assert images["runtime"].final.exec_form("ENTRYPOINT") == ["sluice-transformer"]
