"""One pod on the process kubelet: a thread that runs its containers.

The worker materialises the pod's volumes, runs init containers one after the
other and then the main containers, restarts them per ``restartPolicy`` with
back-off, and keeps ``status`` (phase, conditions, IPs, container statuses) in
the apiserver in step with what the processes do.  When the pod gets a
``deletionTimestamp`` it stops the processes within the grace period and
deletes the pod object with grace 0.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from tests.k8s.api import ApiError
from tests.k8s.container import Container, now_iso
from tests.k8s.podspec import (
    BASE_PATH,
    LaunchError,
    can_unshare,
    container_env,
    expand,
    launch,
    volume_dir,
)

if TYPE_CHECKING:
    from tests.k8s.kubelet import Kubelet

log = logging.getLogger("sluice.kubelet")
JSON = dict[str, Any]
PASS_THROUGH = ("LANG", "LC_ALL", "TZ", "TMPDIR")
_UNSHARE: bool | None = None


def use_unshare() -> bool:
    global _UNSHARE
    if _UNSHARE is None:
        _UNSHARE = can_unshare()
        if not _UNSHARE:
            log.warning("no mount namespaces: volumes are exported as SLUICE_VOLUME_* env vars")
    return _UNSHARE


class PodWorker:
    """Runs one pod's containers (in its own thread) and reports its status."""

    def __init__(self, kubelet: Kubelet, pod: JSON) -> None:
        meta = pod["metadata"]
        self.name = f"{meta['namespace']}/{meta['name']}"
        self._thread = threading.Thread(target=self.run, name=f"pod-{self.name}", daemon=True)
        self.kubelet, self.api, self.pod = kubelet, kubelet.api, pod
        self.uid = meta["uid"]
        self.dir = kubelet.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        cap = kubelet.probe_period_cap

        def make(spec: JSON) -> Container:
            return Container(spec, self.dir / "logs" / f"{spec['name']}.log", cap)

        self.init = [make(c) for c in pod["spec"].get("initContainers", [])]
        self.containers = [make(c) for c in pod["spec"]["containers"]]
        self.ip: str | None = None
        self.volumes: dict[str, Path] | None = None
        self.failed = False  # an init container failed for good
        self.start_time = now_iso()
        self._transitions: dict[str, tuple[str, str]] = {}
        self._last_status: JSON | None = None
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self._shutdown = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- called from the kubelet's watch thread ------------------------------
    def update(self, pod: JSON) -> None:
        with self._lock:
            self.pod = pod

    def gone(self) -> None:
        """The pod object no longer exists: stop at once."""
        self._gone.set()

    def shutdown(self) -> None:
        """The kubelet stops: stop the processes, leave the pod object alone."""
        self._shutdown.set()

    # -- main loop ---------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except Exception:
            log.exception("pod worker %s crashed", self.name)
        finally:
            self._stop_all(grace=0 if self._gone.is_set() else 5.0)
            self.kubelet.release(self.uid, self.ip)

    def _current(self) -> JSON:
        with self._lock:
            return self.pod

    def _loop(self) -> None:
        pod = self._current()
        # A pod that already ended (seen again after a kubelet restart) is never re-run.
        terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if not terminal:
            self.ip = self.kubelet.allocate_ip()
        while not (self._gone.is_set() or self._shutdown.is_set()):
            pod = self._current()
            if pod["metadata"].get("deletionTimestamp"):
                self._delete(pod, write_status=not terminal)
                return
            if not terminal:
                self._step(pod)
                self._write_status(pod)
            self._shutdown.wait(0.2)

    def _delete(self, pod: JSON, write_status: bool) -> None:
        meta = pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        self._stop_all(float(grace))
        if write_status:
            self._write_status(pod)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            self.api.delete(path, {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except ApiError as e:
            if e.status != 409:  # 409: a newer pod with the same name
                raise

    def _stop_all(self, grace: float) -> None:
        everything = [*self.init, *self.containers]
        for c in everything:
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.running for c in everything) and time.monotonic() < deadline:
            time.sleep(0.05)
        for c in everything:
            c.stop(grace=0)
            c.poll()

    # -- running containers ------------------------------------------------
    def _base_env(self, pod: JSON) -> dict[str, str]:
        url = urlparse(self.api.server)
        host, port = url.hostname or "127.0.0.1", str(url.port or 443)
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        env.update({
            "PATH": BASE_PATH, "HOME": "/root", "HOSTNAME": pod["metadata"]["name"],
            # No Service networking here: in-cluster clients reach the apiserver directly.
            "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port, "KUBERNETES_PORT": f"tcp://{host}:{port}",
        })  # fmt: skip
        return env

    def _with_ips(self, pod: JSON) -> JSON:
        node_ip = self.kubelet.node_ips[pod["spec"]["nodeName"]]
        status = {**pod.get("status", {}), "podIP": self.ip, "podIPs": [{"ip": self.ip}]}
        status.update(hostIP=node_ip, hostIPs=[{"ip": node_ip}])
        return {**pod, "status": status}

    def _start(self, pod: JSON, c: Container) -> None:
        pod = self._with_ips(pod)
        try:
            if self.volumes is None:
                self.volumes = {
                    v["name"]: volume_dir(self.api, pod, v, self.dir, self.kubelet.state_dir)
                    for v in pod["spec"].get("volumes", [])
                }
            env = container_env(self.api, pod, c.spec, self._base_env(pod))
            mounts = {}
            for m in c.spec.get("volumeMounts", []):
                sub = m.get("subPath") or expand(m.get("subPathExpr", ""), env)
                src = self.volumes[m["name"]] / sub if sub else self.volumes[m["name"]]
                if sub and not src.exists():
                    src.mkdir(parents=True)
                mounts[m["mountPath"]] = src
            c.start(launch(c.spec, env, mounts, use_unshare()))
        except (LaunchError, ApiError, OSError) as e:
            reason = e.reason if isinstance(e, LaunchError) else "CreateContainerError"
            c.waiting(reason, str(e))
            c.next_start = time.monotonic() + self.kubelet.backoff_base

    def _drive(self, pod: JSON, c: Container, policy: str) -> None:
        """Start, notice the exit of, or restart (after back-off) one container."""
        if c.proc is not None:  # started: notice an exit
            if c.poll() and (policy == "Always" or (policy == "OnFailure" and c.exit_code != 0)):
                kl = self.kubelet
                delay = min(kl.backoff_base * 2**c.restart_count, kl.backoff_max)
                c.archive()
                c.next_start = time.monotonic() + delay
                msg = f"back-off {delay:g}s restarting failed container={c.name} pod={self.name}"
                c.waiting("CrashLoopBackOff", msg)
            return
        if "waiting" in c.state and time.monotonic() >= c.next_start:
            self._start(pod, c)

    def _step(self, pod: JSON) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        if all("terminated" in c.state for c in self.containers):  # done for good
            for c in self.init:  # sidecars go when the main containers have gone
                if c.running:
                    c.stop(grace=2.0)
                    c.poll()
            return
        for c in self.init:  # one after the other, each to success
            if c.spec.get("restartPolicy") == "Always":  # a native sidecar keeps running
                self._drive(pod, c, "Always")
                c.run_probes(self.ip or "")
                if not self._init_done(c):
                    return
                continue
            if "terminated" in c.state:
                if c.exit_code == 0:
                    continue
                self.failed = True  # failed and not to be restarted
                return
            self._drive(pod, c, "Never" if policy == "Never" else "OnFailure")
            return
        for c in self.containers:
            self._drive(pod, c, policy)
            c.run_probes(self.ip or "")

    # -- status ------------------------------------------------------------
    @staticmethod
    def _init_done(c: Container) -> bool:
        if c.spec.get("restartPolicy") == "Always":  # sidecar: started is enough
            return c.running and c.started
        return "terminated" in c.state and c.exit_code == 0

    def _phase(self) -> str:
        if self.failed:
            return "Failed"
        if all("terminated" in c.state for c in self.containers):  # after init, for good
            return "Succeeded" if all(c.exit_code == 0 for c in self.containers) else "Failed"
        if not all(self._init_done(c) for c in self.init):
            return "Pending"
        if any(c.running for c in self.containers):
            return "Running"
        ran = any(c.runs or "terminated" in c.state for c in self.containers)
        return "Running" if ran else "Pending"

    def _condition(self, kind: str, ok: bool, reason: str = "") -> JSON:
        status = "True" if ok else "False"
        prev = self._transitions.get(kind)
        if prev is None or prev[0] != status:
            self._transitions[kind] = prev = (status, now_iso())
        cond = {"type": kind, "status": status, "lastTransitionTime": prev[1]}
        return {**cond, "reason": reason} if reason and not ok else cond

    def _write_status(self, pod: JSON) -> None:
        phase = self._phase()
        init_done = all(self._init_done(c) for c in self.init)
        sidecars = [c for c in self.init if c.spec.get("restartPolicy") == "Always"]
        serving = self.containers + sidecars
        ready = phase == "Running" and all(c.ready and c.running for c in serving)
        why = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
        image = {c["name"]: c.get("image", "") for c in pod["spec"]["containers"]}
        init_image = {c["name"]: c.get("image", "") for c in pod["spec"].get("initContainers", [])}
        status: JSON = {
            "phase": phase,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.ip is not None),
                self._condition("Initialized", init_done, "ContainersNotInitialized"),
                self._condition("ContainersReady", ready, why),
                self._condition("Ready", ready, why),
                self._condition("PodScheduled", True),
            ],
            "startTime": self.start_time,
            "containerStatuses": [c.status(image[c.name]) for c in self.containers],
        }
        if self.ip:
            node_ip = self.kubelet.node_ips[pod["spec"]["nodeName"]]
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
            status.update(hostIP=node_ip, hostIPs=[{"ip": node_ip}])
        if self.init:
            status["initContainerStatuses"] = [c.status(init_image[c.name]) for c in self.init]
        if status == self._last_status:
            return
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            self.api.patch(path, {"metadata": {"uid": self.uid}, "status": status})
            self._last_status = status
        except ApiError as e:
            if e.status in (404, 409):  # deleted, or replaced by a namesake
                self._gone.set()
            else:
                log.warning("status of %s: %s", self.name, e)
