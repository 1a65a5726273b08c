"""``tls``: the chart's certificates (made, or an existing cert-manager Secret), mounted into
the gateway, the targets and (through the operator) the transformers; probes over HTTPS.

The chart-made certificate is checked as a client would: Python's ``ssl`` verifies a
server serving it against its ``ca.crt``, for the names every hop uses (the gateway
Service, a target pod's name under its headless Service, a transformer pod's IP name).
"""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from etl_operator import pods
from etl_runtime.cluster.kube import records
from etl_runtime.cluster.records import TargetInfo
from etl_runtime.core.spec import EtlSpec
from tests.helm.chart import Manifest, container, env_of, pod_spec, render

SERVERS = (("StatefulSet", "target"), ("Deployment", "gateway"))


def tls_secret(m: Manifest) -> dict[str, Any]:
    (secret,) = [s for s in m.of_kind("Secret") if s["metadata"]["name"].endswith("-tls")]
    return secret


def test_tls_off_by_default_nothing_mounted_probes_plain() -> None:
    m = render()
    assert not [s for s in m.of_kind("Secret") if s["metadata"]["name"].endswith("-tls")]
    for kind, component in SERVERS:
        c = container(m.component(kind, component))
        assert "SLUICE_TLS_CERT" not in env_of(c)
        assert "scheme" not in c["readinessProbe"]["httpGet"]  # HTTP, Kubernetes' default


def test_chart_made_certificates_are_mounted_and_every_probe_is_https() -> None:
    m = render({"tls.enabled": True})
    secret = tls_secret(m)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    for kind, component in SERVERS:
        workload = m.component(kind, component)
        c = container(workload)
        env = env_of(c)
        assert env["SLUICE_TLS_CERT"]["value"] == "/etc/sluice/tls/tls.crt"
        assert env["SLUICE_TLS_KEY"]["value"] == "/etc/sluice/tls/tls.key"
        assert env["SLUICE_CA"]["value"] == "/etc/sluice/tls/ca.crt"
        assert {"name": "tls", "mountPath": "/etc/sluice/tls", "readOnly": True} in c[
            "volumeMounts"
        ]
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == secret["metadata"]["name"]
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    operator = env_of(container(m.component("Deployment", "operator")))
    assert operator["SLUICE_TLS_SECRET"]["value"] == secret["metadata"]["name"]


def test_an_existing_cert_manager_secret_is_used_and_none_is_made() -> None:
    m = render({"tls.enabled": True, "tls.existingSecret": "sluice-cert"})
    assert not [s for s in m.of_kind("Secret") if s["metadata"]["name"].endswith("-tls")]
    for kind, component in SERVERS:
        volumes = {v["name"]: v for v in pod_spec(m.component(kind, component))["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "sluice-cert"


def test_transformer_pods_mount_the_secret_and_are_named_by_their_certificate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(records.TLS_SECRET_ENV, "sl-sluice-tls")
    pod = pods.transformer_pod(
        pods.EtlRef("up", "data", "uid-1"),
        EtlSpec.from_dict({"code": {"source": "def transform(d):\n    return d\n"}}),
        TargetInfo(id="sl-sluice-target-0", url="https://x"),
        image="sluice/runtime",
        with_token=True,
    )
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SLUICE_TLS_CERT"] == "/etc/sluice/tls/tls.crt"
    assert env["SLUICE_CA"] == "/etc/sluice/tls/ca.crt"
    assert {"name": "tls", "secret": {"secretName": "sl-sluice-tls"}} in pod["spec"]["volumes"]
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    running = {"metadata": {"name": "p", "namespace": "data"}, "status": {"podIP": "10.1.2.3"}}
    assert records.pod_url(running, 8000) == "https://10-1-2-3.data.pod:8000"
    target = {
        "metadata": {"name": "sl-sluice-target-0", "namespace": "data"},
        "spec": {"subdomain": "sl-sluice-target"},
        "status": {"podIP": "10.1.2.4"},
    }
    assert records.pod_url(target, 8080) == (
        "https://sl-sluice-target-0.sl-sluice-target.data.svc:8080"
    )
    monkeypatch.delenv(records.TLS_SECRET_ENV)
    assert records.pod_url(running, 8000) == "http://10.1.2.3:8000"


@pytest.mark.parametrize(
    "name",
    [
        "sl-sluice-gateway.data.svc",
        "sl-sluice-target-2.sl-sluice-target.data.svc",
        "10-1-2-3.data.pod",
        "localhost",
    ],
)
def test_the_chart_made_certificate_verifies_for_every_hop_name(name: str, tmp_path: Path) -> None:
    data = tls_secret(render({"tls.enabled": True}))["data"]
    for key in data:
        (tmp_path / key).write_bytes(base64.b64decode(data[key]))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:
            conn, _ = listener.accept()
            with conn, server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        raw = socket.create_connection(listener.getsockname(), timeout=10)
        with client.wrap_socket(raw, server_hostname=name) as tls:
            assert tls.recv(2) == b"ok"
        t.join(10)
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            threading.Thread(target=lambda: _serve_once(listener, server), daemon=True).start()
            raw = socket.create_connection(listener.getsockname(), timeout=10)
            client.wrap_socket(raw, server_hostname="other.example.com")


def _serve_once(listener: socket.socket, server: ssl.SSLContext) -> None:
    conn, _ = listener.accept()
    with conn:
        try:
            server.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            pass
