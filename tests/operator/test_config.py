"""Operator settings from the environment (what the Helm chart sets)."""

from __future__ import annotations

import json

import pytest

from etl_operator.controller import Controller, OperatorConfig

from .fakes import FakeKube


def test_transformer_defaults_from_env():
    resources = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    config = OperatorConfig.from_env(
        {
            "SLUICE_TRANSFORMER_IMAGE": "reg/runtime:1",
            "SLUICE_TRANSFORMER_RESOURCES": json.dumps(resources),
            "SLUICE_TRANSFORMER_PULL_POLICY": "Always",
            "SLUICE_TRANSFORMER_PULL_SECRETS": "regcred, other",
        }
    )
    assert config.image == "reg/runtime:1"
    assert config.resources == resources
    assert config.pull_policy == "Always"
    assert config.pull_secrets == ("regcred", "other")


def test_unset_or_empty_env_means_no_defaults():
    config = OperatorConfig.from_env({"SLUICE_TRANSFORMER_RESOURCES": "{}"})
    assert config.resources is None
    assert config.pull_policy == "IfNotPresent" and config.pull_secrets == ()
    assert OperatorConfig.from_env({}).resources is None


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SLUICE_TRANSFORMER_RESOURCES", "{cpu: 1}", "not JSON"),
        ("SLUICE_TRANSFORMER_RESOURCES", '{"cpu": "1"}', "'requests' and/or 'limits'"),
        ("SLUICE_TRANSFORMER_PULL_POLICY", "always", "must be one of"),
    ],
)
def test_malformed_env_is_a_clear_error(name, value, says):
    with pytest.raises(ValueError, match=says):
        OperatorConfig.from_env({name: value})


def test_controller_creates_pods_with_the_defaults():
    kube = FakeKube()
    kube.add_target("target-0", node="node-0")
    kube.add_etl("plain", {"code": {"source": "x=1"}})
    kube.add_etl("own", {"code": {"source": "x=1"}, "resources": {"limits": {"cpu": "1"}}})
    config = OperatorConfig(
        image="img",
        resources={"limits": {"memory": "1Gi"}},
        pull_policy="Never",
        pull_secrets=("regcred",),
    )
    ctl = Controller(kube, config)  # type: ignore[arg-type]
    ctl.reconcile("ns", "plain")
    ctl.reconcile("ns", "own")
    by_etl = {p["metadata"]["labels"]["sluice.dev/etl"]: p for p in kube.pods.values() if
              "sluice.dev/etl" in p["metadata"]["labels"]}  # fmt: skip
    plain, own = by_etl["plain"]["spec"], by_etl["own"]["spec"]
    assert plain["containers"][0]["resources"] == {"limits": {"memory": "1Gi"}}
    assert own["containers"][0]["resources"] == {"limits": {"cpu": "1"}}
    for spec in (plain, own):
        assert spec["containers"][0]["imagePullPolicy"] == "Never"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_operator_refuses_to_start_with_malformed_env(monkeypatch, capsys):
    from etl_operator.__main__ import main

    monkeypatch.setenv("SLUICE_TRANSFORMER_PULL_POLICY", "sometimes")
    assert main(["-n", "ns"]) == 2
    assert "SLUICE_TRANSFORMER_PULL_POLICY must be one of" in capsys.readouterr().err
