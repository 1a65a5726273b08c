"""The chart's ``images.runtime`` is the image the operator runs transformers in.

Installed as the docs say for images from ``make images`` (no registry:
``images.registry=localhost``, ``images.tag=dev``, ``images.pullPolicy=Never``),
the transformer pod the operator builds from the chart's own operator env runs
``localhost/sluice/runtime:dev`` and never pulls; not the operator's built-in
default, which no registry here serves.
"""

from __future__ import annotations

from etl_operator import pods
from etl_operator.controller import OperatorConfig
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec
from tests.helm.chart import container, env_of, render

DEV = {"images.registry": "localhost", "images.tag": "dev", "images.pullPolicy": "Never"}


def transformer(values: dict) -> dict:
    m = render(values)
    env = env_of(container(m.component("Deployment", "operator")))
    config = OperatorConfig.from_env({k: e["value"] for k, e in env.items() if "value" in e})
    spec = EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}})
    pod = pods.transformer_pod(
        pods.EtlRef("resize", "data", "u1"),
        spec,
        TargetInfo(id="sl-target-0", url="", node="node-1"),
        image=config.image,
        pull_policy=config.pull_policy,
        with_token=True,
    )
    (c,) = pod["spec"]["containers"]
    return c


def test_transformers_run_the_locally_built_runtime_image_and_never_pull() -> None:
    c = transformer(DEV)
    assert c["image"] == "localhost/sluice/runtime:dev"
    assert c["imagePullPolicy"] == "Never"
    assert c["image"] != pods.DEFAULT_IMAGE


def test_a_runtime_image_of_its_own_reaches_the_transformers() -> None:
    c = transformer(
        {**DEV, "images.runtime.repository": "ml/runtime-gpu", "images.runtime.tag": "7"}
    )
    assert c["image"] == "localhost/ml/runtime-gpu:7"
