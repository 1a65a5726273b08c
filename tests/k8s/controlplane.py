"""A real Kubernetes control plane on loopback, for tests.

Starts etcd and kube-apiserver (and, on request, kube-controller-manager and
kube-scheduler) as child processes from the binaries that
``scripts/k8s-tools.sh`` builds into ``~/.cache/sluice/bin``.  Certificates
are made with ``openssl``: a CA, the apiserver serving certificate (valid for
127.0.0.1 and the in-cluster ``kubernetes.default.svc`` names), an admin client
certificate in ``system:masters`` and the service-account signing key.  A
kubeconfig for that admin is written to ``<state>/kubeconfig``.

Nothing is faked: authentication, RBAC, admission, watches and (with
``controllers=True``) garbage collection, namespace deletion, service-account
tokens, Deployments and StatefulSets are the real Kubernetes code.  Pods are
run by the process kubelet in ``tests/k8s/kubelet.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

BIN_DIR = Path(os.environ.get("SLUICE_K8S_BIN", Path.home() / ".cache/sluice/bin"))
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
SERVICE_CIDR = "10.0.0.0/24"
# Children get SIGKILL when the thread that started them dies, so a test run
# that is killed (timeout, Ctrl-C twice) leaks no apiserver, etcd or pod.
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (or a tool is missing)."""


def binary(name: str) -> Path:
    """Path of a built tool; a clear error that says how to build it if missing."""
    path = BIN_DIR / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(
            f"{path} is missing: run `make k8s-tools` (scripts/k8s-tools.sh) to build "
            "the Kubernetes binaries from the Go module proxy"
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(pki: Path, extra_sans: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert, admin client cert, service-account key pair.

    ``extra_sans`` are more subjectAltNames of the serving cert (``IP:...``).
    """
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "admin.crt").exists():
        return
    days = "3650"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", days, "-subj", "/CN=sluice-test-ca", cwd=pki)  # fmt: skip
    sans = ",".join(
        ["IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes",
         "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
         "DNS:kubernetes.default.svc.cluster.local", *extra_sans]
    )  # fmt: skip
    for name, subj, ext in (
        ("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}"),
        ("admin", "/O=system:masters/CN=sluice-admin", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subj, cwd=pki)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", days, "-extfile",
                 _extfile(pki, name, ext), cwd=pki)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def _extfile(pki: Path, name: str, ext: str) -> str:
    path = pki / f"{name}.ext"
    path.write_text(ext + "\n")
    return str(path)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ optional controller-manager and scheduler).

    ``with ControlPlane(state_dir) as cp:`` starts everything and waits until
    the apiserver is ready; ``cp.kubeconfig`` is an admin kubeconfig.  Start it
    from a thread that outlives it (e.g. the main thread): the processes die
    with the thread that started them.
    """

    state_dir: Path
    controllers: bool = False
    scheduler: bool = False
    apiserver_port: int = 0
    # The apiserver's address.  The real-node harness (tests/k8s/realnode.py)
    # binds it to its host bridge so kubelets in node network namespaces reach
    # it; that also turns on the "kubernetes" Service's endpoints.
    bind_address: str = "127.0.0.1"
    apiserver_args: list[str] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.apiserver_port}"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lifecycle ----------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        """Start all components and wait until they are usable."""
        for name in BINARIES:
            binary(name)
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl is needed to make test certificates")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        extra = () if self.bind_address == "127.0.0.1" else (f"IP:{self.bind_address}",)
        make_certs(self.pki, extra)
        t0 = time.monotonic()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self.wait_ready(timeout)
            if self.controllers:
                self._start_controller_manager()
            if self.scheduler:
                self._start_scheduler()
            if self.controllers:
                self._wait_default_service_account(timeout - (time.monotonic() - t0))
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        """Stop components in reverse start order (SIGTERM, then SIGKILL)."""
        for name in reversed(list(self.procs)):
            stop_process(self.procs.pop(name), grace)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.state_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        with log:
            self.procs[name] = subprocess.Popen(
                [*DIE_WITH_PARENT, str(binary(name)), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "--name=sluice", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=sluice=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=2147483648",
        ])  # fmt: skip

    def _start_apiserver(self) -> None:
        self.apiserver_port = self.apiserver_port or free_port()
        p = self.pki
        admission = [] if self.controllers else ["--disable-admission-plugins=ServiceAccount"]
        loopback = self.bind_address == "127.0.0.1"
        self._spawn("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}", f"--secure-port={self.apiserver_port}",
            f"--bind-address={self.bind_address}", f"--advertise-address={self.bind_address}",
            f"--endpoint-reconciler-type={'none' if loopback else 'lease'}",
            "--kubelet-preferred-address-types=InternalIP",  # node names do not resolve
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false",
            "--event-ttl=10m", *admission, *self.apiserver_args,
        ])  # fmt: skip

    def _component_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _start_controller_manager(self) -> None:
        p = self.pki
        self._spawn("kube-controller-manager", [
            *self._component_args(),
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--concurrent-gc-syncs=5",
        ])  # fmt: skip

    def _start_scheduler(self) -> None:
        self._spawn("kube-scheduler", self._component_args())

    def _write_kubeconfig(self) -> None:
        p = self.pki
        self.kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: sluice
  cluster:
    server: {self.server}
    certificate-authority: {p / "ca.crt"}
contexts:
- name: sluice
  context: {{cluster: sluice, user: admin, namespace: default}}
current-context: sluice
users:
- name: admin
  user:
    client-certificate: {p / "admin.crt"}
    client-key: {p / "admin.key"}
"""
        )

    # -- readiness ----------------------------------------------------------
    def http_client(self, timeout: float = 10.0) -> httpx.Client:
        """An httpx client authenticated as the admin, talking to the apiserver."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return httpx.Client(base_url=self.server, verify=ctx, timeout=timeout)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = self.state_dir / "logs" / f"{name}.log"
                tail = log.read_text(errors="replace").splitlines()[-15:]
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode}; last log lines:\n" + "\n".join(tail)
                )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until ``/readyz`` answers ok (RBAC bootstrap and friends done)."""
        deadline = time.monotonic() + timeout
        last = ""
        with self.http_client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    r = http.get("/readyz")
                    if r.status_code == 200:
                        return
                    last = r.text[-500:]
                except httpx.HTTPError as e:
                    last = repr(e)
                time.sleep(0.3)
        raise ControlPlaneError(f"kube-apiserver not ready after {timeout:.0f}s: {last}")

    def _wait_default_service_account(self, timeout: float) -> None:
        """Pods need the "default" ServiceAccount; the controller-manager makes it."""
        deadline = time.monotonic() + max(timeout, 5.0)
        with self.http_client() as http:
            while time.monotonic() < deadline:
                self._check_alive()
                r = http.get("/api/v1/namespaces/default/serviceaccounts/default")
                if r.status_code == 200:
                    return
                time.sleep(0.3)
        raise ControlPlaneError("kube-controller-manager did not create the default ServiceAccount")


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
