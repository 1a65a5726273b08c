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
    runtime = env_of(operator)["SLUICE_TRANSFORMER_IMAGE"]["value"]
    assert image_dir(runtime) == "runtime"
    assert images["runtime"].final.exec_form("ENTRYPOINT") == ["sluice-transformer"]


def test_operator_transformer_pods_fit_the_runtime_image() -> None:
    """The operator's transformer pod runs a script the runtime image has, as its UID."""
    from etl_operator.pods import EtlRef, transformer_pod
    from etl_runtime.cluster.records import TargetInfo
    from etl_runtime.core.spec import EtlSpec

    runtime = all_images()["runtime"]
    spec = EtlSpec.from_dict({"mode": "wds", "code": {"source": "def transform(s):\n  return s\n"}})
    pod = transformer_pod(
        EtlRef(name="resize", namespace="data", uid="u-1"),
        spec,
        TargetInfo(id="sl-sluice-target-0", url="http://10.0.0.5:8080", node="n1"),
        image="sluice/runtime:0.1.0",
        with_token=True,
    )
    (c,) = pod["spec"]["containers"]
    assert c["command"][0] in commands_of(runtime)
    user = runtime.final.last("USER")
    assert user is not None
    assert str(pod["spec"]["securityContext"]["runAsUser"]) == user.split(":")[0]
    port = c["ports"][0]["containerPort"]
    assert f"EXPOSE {port}" in runtime.path.read_text()


def test_chart_command_lines_parse_with_the_programs_own_arguments() -> None:
    """Every flag the chart passes exists: each program's parser accepts the argv.

    Kubernetes expands ``$(POD_IP)``-style references from the container env
    before exec; we substitute plausible values the same way.
    """
    import importlib
    import tomllib

    from tests.helm.chart import REPO

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    pod_env = {"POD_IP": "10.1.2.3", "POD_NAME": "sl-sluice-target-0", "POD_NAMESPACE": "data"}
    for values in ({}, {"operator.replicas": 2}):
        for workload in render(values).workloads():
            (c,) = pod_spec(workload)["containers"]
            argv = list(c["command"][1:]) + list(c.get("args", []))
            for name, value in pod_env.items():
                if any(f"$({name})" in a for a in argv):
                    assert name in env_of(c), f"{c['name']} uses $({name}) without defining it"
                argv = [a.replace(f"$({name})", value) for a in argv]
            module = importlib.import_module(scripts[c["command"][0]].split(":")[0])
            try:
                parsed = module.parse_args(argv)
            except SystemExit as e:
                raise AssertionError(f"{c['command'][0]} rejects {argv}") from e
            if c["name"] == "target":
                assert (parsed.id, parsed.data_dir, parsed.registry) == (
                    "sl-sluice-target-0",
                    "/data",
                    "kubernetes",
                )
            if c["name"] == "operator":
                assert parsed.namespace == ["data"]
                assert parsed.liveness == "http://10.1.2.3:8080/healthz"
                assert (parsed.peering is not None) is ("operator.replicas" in values)
