"""Cluster DNS for the real-node harness (``tests/k8s/realnode.py``): CoreDNS and ``kube-dns``.

CoreDNS (built by ``scripts/k8s-tools.sh`` with only the plugins below) runs as
a process on the host, bound to the slot's bridge address ``10.240.K.1:53``
(which every node and pod reaches), and reads the apiserver with the admin
kubeconfig: the ``kubernetes`` plugin answers ``SERVICE.NS.svc.cluster.local``,
the pod names of a headless Service (``POD.SERVICE.NS.svc.cluster.local``, as
a StatefulSet's pods have) and, with ``pods insecure``, ``A-B-C-D.NS.pod``;
everything else goes to the host's resolver (``forward``).  Pods find it as
on any cluster: a ``kube-dns`` Service in ``kube-system`` with ClusterIP
:data:`DNS_IP` (no selector; an EndpointSlice names the bridge address, and
kube-proxy on each node routes to it), and every kubelet has ``clusterDNS:
[DNS_IP]``, ``clusterDomain: cluster.local``.  TTLs are 5 s (answers and
denials) so a name that appears (a target turning Ready) resolves soon.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.k8s.api import Api, ApiError
from tests.k8s.controlplane import DIE_WITH_PARENT, ControlPlaneError, binary, stop_process

DNS_IP = "10.0.0.10"  # in the control plane's SERVICE_CIDR, as kubeadm's 10.96.0.10
DOMAIN = "cluster.local"
READY_PORT = 8181
HEALTH_PORT = 8180
PORTS = [{"name": "dns", "port": 53, "protocol": "UDP"},
         {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]  # fmt: skip


def corefile(address: str, kubeconfig: Path) -> str:
    return f""".:53 {{
    bind {address}
    errors
    health {address}:{HEALTH_PORT}
    ready {address}:{READY_PORT}
    kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loop
    forward . /etc/resolv.conf
}}
"""


def service_objects(address: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) of the ``kube-dns`` Service and its EndpointSlice."""
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {"clusterIP": DNS_IP, "ports": [{**p, "targetPort": 53} for p in PORTS]},
    }  # fmt: skip
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kube-dns-coredns", "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "kube-dns",
                                "endpointslice.kubernetes.io/managed-by": "sluice-harness"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": PORTS,
    }  # fmt: skip
    return [
        ("/api/v1/namespaces/kube-system/services", service),
        ("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", endpoints),
    ]


class ClusterDNS:
    """CoreDNS on ``address`` for the cluster of ``kubeconfig``; logs in ``<state>/logs``."""

    def __init__(self, state_dir: Path, address: str, kubeconfig: Path) -> None:
        self.state_dir, self.address, self.kubeconfig = state_dir, address, kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.state_dir / "logs" / "coredns.log"

    def start(self) -> None:
        """The Service objects, then CoreDNS (from the calling thread: it dies with it)."""
        api = Api(self.kubeconfig)
        try:
            for path, obj in service_objects(self.address):
                try:
                    api.post(path, obj)
                except ApiError as e:
                    if e.status != 409:  # a dev cluster restarted on its old etcd
                        raise
        finally:
            api.close()
        conf = self.state_dir / "Corefile"
        conf.write_text(corefile(self.address, self.kubeconfig))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*DIE_WITH_PARENT, str(binary("coredns")), "-conf", str(conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float = 60) -> None:
        """Until CoreDNS has listed the cluster's Services (its ``ready`` endpoint)."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.address}:{READY_PORT}/ready"
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-20:]
                raise ControlPlaneError(
                    f"coredns exited with {self.proc.returncode}:\n" + "\n".join(tail)
                )
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"coredns not ready after {timeout:.0f}s; see {self.log}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=2)
            self.proc = None
