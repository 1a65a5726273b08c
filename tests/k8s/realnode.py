"""Real Kubernetes nodes for tests: kubelet + containerd + runc + CNI + kube-proxy.

``RealCluster(state_dir, nodes=3)`` starts, in this order:

1. the network (``tests/k8s/nodenet.py``): a host bridge and one network
   namespace per node, in a slot of its own so sessions do not collide;
2. the control plane (``tests/k8s/controlplane.py``) with the apiserver bound
   to the bridge address ``10.240.K.1`` (kubelets in the namespaces cannot
   reach the host's loopback), the ``kubernetes`` Service's endpoints on, and
   the admin certificate as the apiserver's kubelet client certificate;
3. per node, each in the node's namespace and cgroup: a **containerd** of its
   own (CRI, runc, ``restrict_oom_score_adj = true``, the bridge + host-local
   CNI plugins on the node's pod subnet, network namespaces mounted under its
   state dir), the test images imported into its ``k8s.io`` namespace, a
   **kubelet** (cgroupfs driver, ``cgroupRoot`` = the node cgroup, x509 client
   auth against the cluster CA, its own root dir and pod log dir, cluster DNS
   ``10.0.0.10``) and a **kube-proxy** (iptables mode, in the node's namespace);
   beside them the cluster DNS (``tests/k8s/clusterdns.py``: CoreDNS on the
   bridge address behind a ``kube-dns`` Service);
4. a local-path provisioner (``tests/k8s/provisioner.py``, a thread here):
   default StorageClass ``standard``, hostPath PVs in ``<state>/node-i/pv``.

Why a containerd per node rather than one shared: the CNI bridge plugin runs
in containerd's network namespace, so a shared containerd would put every
pod on one host bridge and the nodes' namespaces would be decoration; per node
each node routes its own pod subnet, like a real node.  It also keeps each
node's images, sandboxes and state apart (an image is imported per node).

Teardown (``stop``) is done by a reaper process (``python -m
tests.k8s.realnode reap``) started with ``--pdeathsig TERM``: when this
process ends or is killed, the reaper kills every process in the node cgroups
(containers, shims, containerd, kubelet, kube-proxy), unmounts everything
under the state dir, deletes the namespaces, the bridge and the cgroups.  A
reaper killed too is covered by the next session, which cleans its slot first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.k8s import nodenet
from tests.k8s.api import Api
from tests.k8s.clusterdns import DNS_IP, DOMAIN, ClusterDNS
from tests.k8s.controlplane import (
    BIN_DIR,
    DIE_WITH_PARENT,
    ControlPlane,
    ControlPlaneError,
    binary,
    stop_process,
)
from tests.k8s.provisioner import LocalPathProvisioner

IMAGES_DIR = Path(os.environ.get("SLUICE_K8S_IMAGES", Path.home() / ".cache/sluice/k8s-images"))
PAUSE_IMAGE = "localhost/sluice/pause:3.10"
ECHO_IMAGE = "localhost/sluice/echo:v1"
NODE_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "nsenter": "util-linux",
}
CNI_BIN = Path("/usr/lib/cni")


def _which(cmd: str) -> bool:
    return any(
        os.access(Path(d) / cmd, os.X_OK)
        for d in [*os.environ["PATH"].split(":"), "/usr/sbin", "/sbin"]
    )


def images_index() -> Path:
    """Where ``make images`` (scripts/images.sh) lists the archives it exported."""
    return (
        Path(os.environ.get("SLUICE_IMAGES", Path.home() / ".cache/sluice/images")) / "index.json"
    )


def sluice_image(name: str) -> tuple[str, Path] | None:
    """(ref, archive) of an image built by ``make images`` (scripts/images.sh), if any."""
    try:
        entry = json.loads(images_index().read_text())["images"][name]
        archive = Path(entry["archive"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (str(entry["ref"]), archive) if archive.exists() else None


def check_node_tools() -> None:
    """Fail with what to run when a node binary, package or image is missing."""
    for name in ("kubelet", "kube-proxy", "coredns"):
        binary(name)
    missing = sorted({pkg for cmd, pkg in NODE_TOOLS.items() if not _which(cmd)})
    if not (CNI_BIN / "bridge").exists() or not (CNI_BIN / "host-local").exists():
        missing.append("containernetworking-plugins")
    if missing:
        raise ControlPlaneError(
            f"missing node packages {missing}: run `make k8s-tools` (scripts/k8s-tools.sh "
            "installs them with apt-get)"
        )
    for image in ("pause", "echo"):
        if not (IMAGES_DIR / f"{image}.tar").exists():
            raise ControlPlaneError(f"{IMAGES_DIR / image}.tar is missing: run `make k8s-tools`")


def _containerd_config(d: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = "{d}/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d}/cni"
    max_conf_num = 1
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
"""


def _cni_config(d: Path, pod_cidr: str) -> str:
    ipam = {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": f"{d}/cni-ipam"}  # fmt: skip
    return json.dumps({
        "cniVersion": "0.4.0", "name": "sluice",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "hairpinMode": True, "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2)  # fmt: skip


def _kubelet_config(d: Path, slot: nodenet.Slot, node: int, ca: Path) -> str:
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": slot.node_ip(node), "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{slot.cgroup(node)}",
        "containerRuntimeEndpoint": f"unix://{d}/containerd.sock",
        "failSwapOn": False, "failCgroupV1": False,
        "podLogsDir": f"{d}/pod-logs", "resolvConf": "/etc/resolv.conf",
        "clusterDNS": [DNS_IP], "clusterDomain": DOMAIN,
        # No image GC and near-zero eviction thresholds: the imported images
        # cannot be pulled again, and the shared disk is not ours to judge.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False, "maxPods": 50,
        "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
    }, indent=2)  # fmt: skip


def _kube_proxy_config(d: Path, slot: nodenet.Slot, node: int, kubeconfig: Path) -> str:
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": f"node-{node}", "mode": "iptables",
        "clusterCIDR": slot.cluster_cidr,
        "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
        # conntrack tables and timeouts are the host's, not a namespace's: leave them.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
    }, indent=2)  # fmt: skip


@dataclass
class RealNode:
    """containerd + kubelet + kube-proxy of node ``index`` (in its namespace and cgroup)."""

    cluster: RealCluster
    index: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def dir(self) -> Path:
        return self.cluster.state_dir / self.name

    @property
    def ip(self) -> str:
        return self.cluster.slot.node_ip(self.index)

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    def _spawn(self, name: str, args: list[str]) -> None:
        slot = self.cluster.slot
        with open(self.dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [*DIE_WITH_PARENT, *nodenet.in_cgroup(slot.cgroup(self.index)),
                 *nodenet.in_netns(slot, self.index), *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.dir / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                raise ControlPlaneError(
                    f"{self.name}: {name} exited with {proc.returncode}; last log lines:\n"
                    + "\n".join(tail)
                )

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, namespace k8s.io."""
        cmd = ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ControlPlaneError(f"{self.name}: ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def start_containerd(self) -> None:
        slot, d = self.cluster.slot, self.dir
        for sub in ("cni", "pod-logs", "kubelet"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "containerd.toml").write_text(_containerd_config(d))
        (d / "cni" / "10-sluice.conflist").write_text(_cni_config(d, slot.pod_cidr(self.index)))
        self._spawn("containerd", ["containerd", f"--config={d / 'containerd.toml'}"])

    def import_images(self, archives: list[Path], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{self.name}: containerd did not open {self.socket}")
            time.sleep(0.1)
        for archive in archives:
            self.ctr("images", "import", "--snapshotter=overlayfs", str(archive), timeout=300)

    def start_kubelet_and_proxy(self) -> None:
        c, d = self.cluster, self.dir
        (d / "kubelet.json").write_text(
            _kubelet_config(d, c.slot, self.index, c.plane.pki / "ca.crt")
        )
        (d / "kube-proxy.json").write_text(
            _kube_proxy_config(d, c.slot, self.index, c.plane.kubeconfig)
        )
        self._spawn("kubelet", [
            str(binary("kubelet")), f"--config={d / 'kubelet.json'}",
            f"--kubeconfig={c.plane.kubeconfig}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}", f"--hostname-override={self.name}",
            f"--node-ip={self.ip}", "--v=1",
        ])  # fmt: skip
        self._spawn("kube-proxy", [str(binary("kube-proxy")), f"--config={d / 'kube-proxy.json'}"])

    def reap(self) -> None:
        """Collect our processes once the reaper has killed them (no graceful stop:
        the node's state is thrown away, and pods would only slow it down)."""
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                stop_process(proc, grace=0)
        self.procs.clear()


@dataclass
class RealCluster:
    """Control plane + ``nodes`` real nodes; ``with RealCluster(dir) as c:``."""

    state_dir: Path
    nodes: int = 3
    extra_images: list[Path] = field(default_factory=list)
    plane: ControlPlane = field(init=False)
    slot: nodenet.Slot = field(init=False)
    node_list: list[RealNode] = field(default_factory=list)
    _lock: IO[bytes] | None = None
    _reaper: subprocess.Popen[bytes] | None = None
    provisioner: LocalPathProvisioner | None = None
    dns: ClusterDNS | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds since start, cumulative

    def __enter__(self) -> RealCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def start(self, timeout: float = 180.0) -> None:
        if not 1 <= self.nodes <= nodenet.MAX_NODES:
            raise ControlPlaneError(f"nodes must be 1..{nodenet.MAX_NODES}, not {self.nodes}")
        check_node_tools()
        self.state_dir = self.state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.slot, self._lock = nodenet.acquire_slot(self.state_dir)
        ext = self.state_dir / "pki" / "apiserver.ext"
        if ext.exists() and f"IP:{self.slot.host_ip}" not in ext.read_text():
            shutil.rmtree(self.state_dir / "pki")  # made for another slot's address
        self._start_reaper()
        t0 = time.monotonic()
        try:
            nodenet.make_bridge(self.slot)
            for i in range(self.nodes):
                nodenet.make_node_netns(self.slot, i, self.nodes)
            pki = self.state_dir / "pki"
            self.plane = ControlPlane(
                self.state_dir, controllers=True, scheduler=True,
                bind_address=self.slot.host_ip,
                apiserver_args=[f"--kubelet-client-certificate={pki / 'admin.crt'}",
                                f"--kubelet-client-key={pki / 'admin.key'}"],
            )  # fmt: skip
            self.node_list = [RealNode(self, i) for i in range(self.nodes)]
            for node in self.node_list:  # containerd starts while the apiserver does
                node.dir.mkdir(parents=True, exist_ok=True)
                node.start_containerd()
            self.timings["network+containerd"] = time.monotonic() - t0
            self.plane.start(timeout)
            self.timings["control plane"] = time.monotonic() - t0
            self.dns = ClusterDNS(self.state_dir, self.slot.host_ip, self.kubeconfig)
            self.dns.start()  # from this thread: it dies with it
            archives = [IMAGES_DIR / "pause.tar", IMAGES_DIR / "echo.tar", *self.extra_images]
            with ThreadPoolExecutor(len(self.node_list)) as pool:  # imports are IO-bound
                list(pool.map(lambda n: n.import_images(archives), self.node_list))
            self.timings["images imported"] = time.monotonic() - t0
            for node in self.node_list:  # from this thread: they die with it
                node.start_kubelet_and_proxy()
            self.wait_nodes_ready(timeout - (time.monotonic() - t0))
            self.timings["nodes Ready"] = time.monotonic() - t0
            self.dns.wait_ready()
            # StorageClass "standard" (default): hostPath PVs in <state>/node-i/pv.
            self.provisioner = LocalPathProvisioner(
                Api(self.kubeconfig), self.state_dir,
                root_of=lambda node: self.state_dir / node / "pv",
            )  # fmt: skip
            self.provisioner.start()
            (self.state_dir / "timings.json").write_text(json.dumps(self.timings, indent=1))
        except BaseException:
            self.stop()
            raise

    def _start_reaper(self) -> None:
        """The cleanup process: it runs ``cleanup_slot`` when we stop or die."""
        assert self._lock is not None
        with open(self.state_dir / "reaper.log", "ab") as log:
            self._reaper = subprocess.Popen(
                ["setpriv", "--pdeathsig", "TERM", "--", sys.executable, "-m",
                 "tests.k8s.realnode", "reap", str(self.slot.index), str(self.state_dir)],
                cwd=Path(__file__).resolve().parents[2], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=[self._lock.fileno()],
            )  # fmt: skip

    def wait_nodes_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 30)
        with self.plane.http_client() as http:
            while True:
                for node in self.node_list:
                    node.check_alive()
                ready = set()
                r = http.get("/api/v1/nodes")
                if r.status_code == 200:
                    for item in r.json()["items"]:
                        conds = {
                            c["type"]: c["status"] for c in item["status"].get("conditions", [])
                        }
                        if conds.get("Ready") == "True":
                            ready.add(item["metadata"]["name"])
                if ready >= {n.name for n in self.node_list}:
                    return
                if time.monotonic() > deadline:
                    raise ControlPlaneError(
                        f"nodes not Ready after {timeout:.0f}s (Ready: {sorted(ready)}); "
                        f"see {self.state_dir}/node-*/kubelet.log"
                    )
                time.sleep(0.3)

    def stop(self) -> None:
        """The reaper kills the nodes and removes what they made; then the control plane."""
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None
        if self._reaper is not None:
            if self._reaper.poll() is None:
                self._reaper.send_signal(signal.SIGTERM)
            try:
                self._reaper.wait(120)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
            self._reaper = None
        for node in self.node_list:
            node.reap()
        if self.dns is not None:
            self.dns.stop()
            self.dns = None
        if hasattr(self, "plane"):
            self.plane.stop(grace=3)  # its state is thrown away: no need to wait long
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def kubectl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(BIN_DIR / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def reap(slot_index: int, state_dir: Path) -> None:
    """Wait for SIGTERM (our stop, or our parent's death), then clean the slot."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    t0 = time.monotonic()
    nodenet.cleanup_slot(nodenet.Slot(slot_index), state_dir)
    print(f"slot {slot_index} cleaned in {time.monotonic() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "reap":
        reap(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: python -m tests.k8s.realnode reap SLOT STATE_DIR")
