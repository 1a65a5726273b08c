"""The process kubelet: fake nodes whose pods run as local processes.

Registers N Node objects (Ready, with capacity, heart-beating through their
Lease and status so the node lifecycle controller keeps them Ready), watches
every pod bound to one of them (``spec.nodeName``) and runs it: each pod gets
its own loopback address 127.1.K.N (reported as ``status.podIP``; servers
bind it through the downward API), each container becomes a process (see
``podspec.py`` for env/volumes/command and ``container.py`` for probes,
restarts and statuses).  Status goes back to the apiserver; a pod with a
``deletionTimestamp`` gets its processes stopped (SIGTERM, grace, SIGKILL)
and is then removed with grace 0, as the real kubelet does.

It also runs a local-path volume provisioner (``provisioner.py``) so that
StatefulSet claims bind.  Not faked: scheduling, controllers, admission — only the node agent is
replaced.  Images, resource limits, security contexts and Service networking
are ignored (documented in docs/testing-kubernetes.md).
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from tests.k8s import logserver
from tests.k8s.api import Api, ApiError
from tests.k8s.pod import PodWorker
from tests.k8s.provisioner import LocalPathProvisioner

log = logging.getLogger("sluice.kubelet")
JSON = dict[str, Any]
HEARTBEAT = 10.0


def claim_subnet(subnet: str | None) -> tuple[IO[bytes] | None, ipaddress.IPv4Network]:
    """A loopback /24 no other kubelet on this machine uses (held until exit)."""
    if subnet is not None:
        return None, ipaddress.IPv4Network(subnet)
    locks = Path(tempfile.gettempdir()) / "sluice-kubelet-subnets"
    locks.mkdir(exist_ok=True)
    for third in range(1, 255):
        net = ipaddress.IPv4Network(f"127.1.{third}.0/24")
        f = open(locks / f"127.1.{third}.lock", "wb")  # noqa: SIM115 - held while we run
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f, net
        except BlockingIOError:
            f.close()
    raise RuntimeError("process kubelet: every 127.1.x.0/24 subnet is taken")


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Kubelet:
    """Run pods bound to ``nodes`` fake nodes as processes, until ``stop()``."""

    def __init__(
        self,
        kubeconfig: Path | str,
        state_dir: Path,
        nodes: int = 3,
        node_prefix: str = "node-",
        subnet: str | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        probe_period_cap: float = 1.0,
        provision_volumes: bool = True,
    ) -> None:
        self.api = Api(kubeconfig)
        self.state_dir = Path(state_dir)
        self.node_names = [f"{node_prefix}{i}" for i in range(nodes)]
        # Another test run on this machine has its own kubelet: claim a /24 of
        # 127.0.0.0/8 for ours (pods .1-.199, nodes .200+) with a lock file.
        self._subnet_lock, net = claim_subnet(subnet)
        self.subnet = str(net)
        hosts = [str(ip) for ip in net.hosts()]
        self.node_ips = {n: hosts[199 + i] for i, n in enumerate(self.node_names)}
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.probe_period_cap = probe_period_cap
        self._free_ips = hosts[:199]
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}  # by pod uid
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log_servers: list[logserver.LogServer] = []
        self.provisioner = (
            LocalPathProvisioner(self.api, self.state_dir) if provision_volumes else None
        )

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        """Register the nodes and start heart-beating and running pods."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for name in self.node_names:
            self._register(name)
        for target in (self._heartbeat_loop, self._watch_loop):
            t = threading.Thread(target=target, name=f"kubelet-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.provisioner is not None:
            self.provisioner.start()
        cert = logserver.self_signed(self.state_dir / "pki")
        for ip in self.node_ips.values():
            server = logserver.LogServer(ip, cert, self.log_path)
            server.start()
            self._log_servers.append(server)

    def stop(self, delete_nodes: bool = False) -> None:
        """Stop every pod process (pods stay in the apiserver) and the loops."""
        self._stopping.set()
        if self.provisioner is not None:
            self.provisioner.stop()
        for server in self._log_servers:
            server.stop()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(timeout=60)
        if delete_nodes:
            for name in self.node_names:
                self.api.delete(f"/api/v1/nodes/{name}")
        self.api.close()
        if self._subnet_lock is not None:
            self._subnet_lock.close()

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        """The log file of a container of a pod this kubelet runs (newest pod by that name)."""
        runs = sorted(
            (self.state_dir / "pods").glob(f"{namespace}_{pod}_*/logs/{container}.log"),
            key=lambda p: p.stat().st_mtime,
        )
        if not runs:
            raise FileNotFoundError(f"no logs for {namespace}/{pod} container {container}")
        return runs[-1]

    def logs(self, namespace: str, pod: str, container: str) -> str:
        """A container's output (stdout+stderr, all restarts): ``kubectl logs`` stand-in."""
        return self.log_path(namespace, pod, container).read_text(errors="replace")

    # -- pod IPs ------------------------------------------------------------
    def allocate_ip(self) -> str:
        with self._lock:
            if not self._free_ips:
                raise RuntimeError("process kubelet: pod IP range exhausted")
            return self._free_ips.pop(0)

    def release(self, uid: str, ip: str | None) -> None:
        with self._lock:
            self._workers.pop(uid, None)
            if ip:
                self._free_ips.append(ip)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- nodes --------------------------------------------------------------
    def _node_status(self, name: str) -> JSON:
        now = micro_now()[:19] + "Z"
        resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        return {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": self.node_ips[name]},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": "",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
                for t, r in (("MemoryPressure", "SufficientMemory"),
                             ("DiskPressure", "NoDiskPressure"), ("PIDPressure", "SufficientPID"))
            ] + [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "process kubelet is posting ready status",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.34.4-sluice-process", "kubeProxyVersion": "",
                "containerRuntimeVersion": "process://local", "operatingSystem": "linux",
                "architecture": "amd64", "osImage": "sluice process kubelet",
                "kernelVersion": "", "machineID": name, "systemUUID": name, "bootID": name,
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": logserver.PORT}},
        }  # fmt: skip

    def _register(self, name: str) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "sluice.dev/process-kubelet": "true",
                },
            },
        }
        try:
            self.api.post("/api/v1/nodes", node)
        except ApiError as e:
            if e.status != 409:
                raise
        self.api.patch(f"/api/v1/nodes/{name}/status", {"status": self._node_status(name)})
        self._renew_lease(name)

    def _renew_lease(self, name: str) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_now()}
        try:
            self.api.patch(f"{path}/{name}", {"spec": spec}, kind="merge-patch")
        except ApiError as e:
            if e.status != 404:
                raise
            meta = {"name": name, "namespace": "kube-node-lease"}
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta}
            self.api.post(path, {**lease, "spec": spec})
            return

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(HEARTBEAT):
            for name in self.node_names:
                try:
                    self._renew_lease(name)
                    status = {"conditions": self._node_status(name)["conditions"]}
                    self.api.patch(f"/api/v1/nodes/{name}/status", {"status": status})
                except Exception as e:  # noqa: BLE001 - keep beating; apiserver may blip
                    log.warning("heartbeat for %s failed: %s", name, e)

    # -- pods ---------------------------------------------------------------
    def _mine(self, pod: JSON) -> bool:
        return pod.get("spec", {}).get("nodeName") in self.node_names

    def _dispatch(self, kind: str, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.gone()
                return
            if worker is None and not self._stopping.is_set():
                worker = self._workers[uid] = PodWorker(self, pod)
                worker.start()
            elif worker is not None:
                worker.update(pod)

    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods")
                seen = set()
                for pod in listing["items"]:
                    if self._mine(pod):
                        seen.add(pod["metadata"]["uid"])
                        self._dispatch("MODIFIED", pod)
                with self._lock:
                    vanished = [w for uid, w in self._workers.items() if uid not in seen]
                for w in vanished:
                    w.gone()
                rv = listing["metadata"]["resourceVersion"]
                while not self._stopping.is_set():
                    for event in self.api.watch("/api/v1/pods", rv, timeout=30):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError(int(obj.get("code", 500)), str(obj.get("message")))
                        rv = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK" and self._mine(obj):
                            self._dispatch(event["type"], obj)
                        if self._stopping.is_set():
                            return
            except Exception as e:  # noqa: BLE001 - relist after any watch failure
                if not self._stopping.is_set():
                    log.info("pod watch restarting: %s", e)
                    time.sleep(0.5)
