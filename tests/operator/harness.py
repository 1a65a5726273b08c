"""Sluice on the test control plane: CRD, operator process, target pods, ETL helpers.

Used by the operator's end-to-end tests and by ``bench/operator_scale.py``.
Everything is real: the CRD goes in with ``kubectl apply``, the operator
runs as ``python -m etl_operator`` (a separate process, as in production)
and targets are pods the process kubelet runs as ``sluice-target``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "etls.sluice.dev.yaml"
GROUP, VERSION, PLURAL = "sluice.dev", "v1alpha1", "etls"
T = TypeVar("T")

REVERSE_YAML = """\
apiVersion: sluice.dev/v1alpha1
kind: ETL
metadata:
  name: {name}
spec:
  mode: object
  code:
    entrypoint: transform
    source: "def transform(data):\\n    return data[::-1]\\n"
"""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except ApiException as e:
            last = f"{e.status} {e.reason}"
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """``python -m etl_operator --namespace NS`` as a child process, restartable."""

    def __init__(self, kubeconfig: Path, namespace: str, cluster_key: str) -> None:
        self.kubeconfig, self.namespace, self.cluster_key = kubeconfig, namespace, cluster_key
        self.log = Path(tempfile.mkstemp(prefix="sluice-operator-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "SLUICE_CLUSTER_KEY": self.cluster_key,
            "SLUICE_TRANSFORMER_IMAGE": "sluice-runtime:test",
            "SLUICE_RESYNC_SECONDS": "5",
        }
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "etl_operator", "--namespace", self.namespace],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to tidy up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


class SluiceNamespace:
    """One namespace with the cluster key Secret, target RBAC and helpers for ETLs."""

    def __init__(self, api: client.ApiClient, kubectl: Callable[..., Any], namespace: str) -> None:
        self.api, self.kubectl, self.ns = api, kubectl, namespace
        self.core = client.CoreV1Api(api)
        self.crs = client.CustomObjectsApi(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.cluster_key = secrets.token_hex(32)

    def setup(self) -> SluiceNamespace:
        key = base64.b64encode(self.cluster_key.encode()).decode()
        self.core.create_namespaced_secret(
            self.ns,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name="sluice-cluster"), data={"cluster-key": key}
            ),
        )
        self.core.create_namespaced_service_account(
            self.ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="sluice-target"))
        )
        self.rbac.create_namespaced_role(
            self.ns,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="sluice-target"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=[GROUP], resources=[PLURAL], verbs=["get", "list", "watch"]
                    )
                ],
            ),
        )
        self.rbac.create_namespaced_role_binding(
            self.ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="sluice-target"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="sluice-target"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name="sluice-target", namespace=self.ns
                    )
                ],
            ),
        )
        return self

    # -- targets -----------------------------------------------------------

    def add_target(self, name: str, node: str) -> None:
        from tests.k8s.cluster import target_pod

        pod = target_pod(0, node)
        pod["metadata"]["name"] = name
        pod["metadata"]["namespace"] = self.ns
        self.core.create_namespaced_pod(self.ns, client.V1Pod.model_validate(pod))

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.ns)
        except ApiException as e:
            if e.status != 404:
                raise

    def pods(self, selector: str) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_pod(
            self.ns, label_selector=selector, _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def ready_targets(self) -> list[dict[str, Any]]:
        return [p for p in self.pods("sluice.dev/role=target") if _ready(p)]

    def target_url(self, name: str) -> str:
        pod = next(p for p in self.pods("sluice.dev/role=target") if p["metadata"]["name"] == name)
        return f"http://{pod['status']['podIP']}:8080"

    # -- ETLs --------------------------------------------------------------

    def apply(self, yaml_text: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(yaml_text)
        try:
            return self.kubectl("apply", "-n", self.ns, "-f", f.name, check=check)
        finally:
            os.unlink(f.name)

    def etl(self, name: str) -> dict[str, Any] | None:
        try:
            obj = self.crs.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        assert isinstance(obj, dict)
        return obj

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.crs.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec}
        )

    def status(self, name: str) -> dict[str, Any]:
        return (self.etl(name) or {}).get("status") or {}

    def wait_phase(self, name: str, phase: str, ready: str | None = None, timeout: float = 180.0):
        def probe() -> dict[str, Any] | None:
            obj = self.etl(name) or {}
            st = obj.get("status") or {}
            fresh = st.get("observedGeneration") == obj.get("metadata", {}).get("generation")
            ok = fresh and st.get("phase") == phase and (ready is None or st.get("ready") == ready)
            return st if ok else None

        try:
            return wait_for(f"ETL {name} phase {phase} {ready or ''}", probe, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\nstatus now: {self.status(name)}") from None

    def transformers(self, etl: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(f"sluice.dev/etl={etl}")
            if not p["metadata"].get("deletionTimestamp")
        ]


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )
