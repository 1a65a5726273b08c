"""Render and inspect the Helm chart in ``helm/sluice`` with the real ``helm``.

``helm`` is built from the Go module proxy by ``scripts/k8s-tools.sh`` into
``~/.cache/sluice/bin`` (``SLUICE_K8S_BIN`` overrides). Tests that need it
fail, never skip, when it is missing: the message says to run
``make k8s-tools``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "sluice"
BIN_DIR = Path(os.environ.get("SLUICE_K8S_BIN", Path.home() / ".cache/sluice/bin"))
COMPONENTS = ("operator", "target", "gateway")


def helm_binary() -> Path:
    path = BIN_DIR / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: run `make k8s-tools` (scripts/k8s-tools.sh builds helm "
            "and the Kubernetes binaries from the Go module proxy)",
            pytrace=False,
        )
    return path


def helm(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``helm args...``; raise with its output if it fails and ``check``."""
    proc = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def set_args(values: dict[str, Any]) -> list[str]:
    """``--set-json`` arguments for a flat ``{"a.b": value}`` mapping."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


@dataclass
class Manifest:
    """The objects of one ``helm template`` run, indexed by kind and name."""

    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for o in self.of_kind(kind):
            if o["metadata"]["name"] == name:
                return o
        names = [f"{o['kind']}/{o['metadata']['name']}" for o in self.objects]
        raise AssertionError(f"no {kind}/{name} in the rendered chart: {names}")

    def component(self, kind: str, component: str) -> dict[str, Any]:
        found = [
            o
            for o in self.of_kind(kind)
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} for {component}, got {len(found)}"
        return found[0]

    def workloads(self) -> Iterator[dict[str, Any]]:
        for o in self.objects:
            if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
                yield o


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1, containers
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def parse(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(
    values: dict[str, Any] | None = None,
    *,
    release: str = "sl",
    namespace: str = "data",
    include_crds: bool = False,
    extra: Iterable[str] = (),
) -> Manifest:
    """``helm template`` the chart with ``{"a.b": value}`` overrides.

    ``crds/`` is left out unless ``include_crds``: it is a verbatim file,
    checked by its own tests, and the templates' tests should not depend on it.
    """
    proc = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        *(["--include-crds"] if include_crds else []),
        *set_args(values or {}),
        *extra,
    )
    return Manifest(parse(proc.stdout))
