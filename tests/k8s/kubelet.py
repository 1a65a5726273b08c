"""The process kubelet: fake nodes whose pods run as local processes.

Registers N Node objects (Ready, with capacity, heart-beating through their
Lease and status so the node lifecycle controller keeps them Ready), watches
every pod bound to one of them (``spec.nodeName``) and runs it: each pod gets
its own loopback address 127.0.1.N (reported as ``status.podIP``; servers
bind it through the downward API), each container becomes a process (see
``podspec.py`` for env/volumes/command and ``container.py`` for probes,
restarts and statuses).  Status goes back to the apiserver; a pod with a
``deletionTimestamp`` gets its processes stopped (SIGTERM, grace, SIGKILL)
and is then removed with grace 0, as the real kubelet does.

Not faked: scheduling, controllers, admission — only the node agent is
replaced.  Images, resource limits, security contexts and Service networking
are ignored (documented in docs/testing-kubernetes.md).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.k8s.api import Api, ApiError
from tests.k8s.pod import PodWorker

log = logging.getLogger("sluice.kubelet")
JSON = dict[str, Any]
HEARTBEAT = 10.0


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
        pod_cidr: str = "127.0.1.0/24",
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        probe_period_cap: float = 1.0,
    ) -> None:
        self.api = Api(kubeconfig)
        self.state_dir = Path(state_dir)
        self.node_names = [f"{node_prefix}{i}" for i in range(nodes)]
        self.node_ips = {n: f"127.0.100.{i + 1}" for i, n in enumerate(self.node_names)}
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.probe_period_cap = probe_period_cap
        self._free_ips = [str(ip) for ip in ipaddress.ip_network(pod_cidr).hosts()]
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}  # by pod uid
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

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

    def stop(self, delete_nodes: bool = False) -> None:
        """Stop every pod process (pods stay in the apiserver) and the loops."""
        self._stopping.set()
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
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
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
