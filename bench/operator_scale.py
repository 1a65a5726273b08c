"""How fast does the operator bring an ETL up, and what does it cost?

For 1, 10 and 50 storage targets (pods on fake nodes, run by the process
kubelet on a real kube-apiserver), apply an ETL and measure:

* ``pods``: apply -> one transformer pod exists per target (operator work);
* ``running``: apply -> ``status.phase == Running`` with N/N ready (includes
  each tiny transformer starting and passing its readiness probe);
* ``delete``: ``kubectl delete etl`` -> every transformer pod gone;
* the operator's peak RSS and CPU seconds over the whole run (psutil).

Targets here are minimal pods (``sleep``) labelled ``sluice.dev/role=target``:
the operator only needs them scheduled, and it keeps the figures about the
operator rather than about target start-up. Transformers are the real
``sluice-transformer`` with one worker.

    .venv/bin/python bench/operator_scale.py [--sizes 1,10,50] [--nodes 10]

Needs ``make k8s-tools``. Prints one line per size, then the operator's totals.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, config  # noqa: E402

from tests.k8s.controlplane import BIN_DIR, ControlPlane  # noqa: E402
from tests.k8s.kubelet import Kubelet  # noqa: E402
from tests.operator.harness import (  # noqa: E402
    CRD,
    OperatorProcess,
    SluiceNamespace,
    wait_for,
)

TINY_ETL = """\
apiVersion: sluice.dev/v1alpha1
kind: ETL
metadata:
  name: tiny
spec:
  mode: object
  workers: 1
  code:
    source: "def transform(data):\\n    return data\\n"
"""


def sleeper_target(name: str, node: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"sluice.dev/role": "target"}),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="target", image="none", command=["sleep", "3600"])],
        ),
    )


class PeakRss(threading.Thread):
    """Samples a process's RSS every 50 ms; ``peak`` in bytes."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return


def run_size(
    api: client.ApiClient, kubectl, kubeconfig: Path, n: int, nodes: list[str]
) -> dict[str, float]:
    ns = f"bench-{n}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    env = SluiceNamespace(api, kubectl, ns).setup()
    for i in range(n):
        core.create_namespaced_pod(ns, sleeper_target(f"target-{i}", nodes[i % len(nodes)]))
    wait_for(
        f"{n} running targets",
        lambda: (
            sum(
                1
                for p in env.pods("sluice.dev/role=target")
                if p["status"].get("phase") == "Running"
            )
            == n
        ),
        timeout=300,
    )
    operator = OperatorProcess(kubeconfig, ns, env.cluster_key).start()
    assert operator.pid is not None
    rss = PeakRss(operator.pid)
    rss.start()
    try:
        time.sleep(3)  # let kopf connect and list before the clock starts
        t0 = time.monotonic()
        env.apply(TINY_ETL)
        wait_for("pods", lambda: len(env.transformers("tiny")) == n, timeout=600)
        t_pods = time.monotonic() - t0
        env.wait_phase("tiny", "Running", f"{n}/{n}", timeout=900)
        t_running = time.monotonic() - t0
        t1 = time.monotonic()
        kubectl("delete", "etl", "tiny", "-n", ns, "--wait=true", "--timeout=600s")
        wait_for("pods gone", lambda: not env.pods("sluice.dev/etl=tiny"), timeout=600)
        t_delete = time.monotonic() - t1
        cpu = psutil.Process(operator.pid).cpu_times()
    finally:
        rss.stop.set()
        operator.stop()
        core.delete_namespace(ns)
    return {
        "pods": t_pods,
        "running": t_running,
        "delete": t_delete,
        "rss_mb": rss.peak / 2**20,
        "cpu_s": cpu.user + cpu.system,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1,10,50")
    p.add_argument("--nodes", type=int, default=10)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    state = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    plane = ControlPlane(state, controllers=True, scheduler=True)
    plane.start()
    kubelet = Kubelet(plane.kubeconfig, state / "kubelet", nodes=args.nodes)
    kubelet.start()
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)

        def kubectl(*a: str, check: bool = True):
            import subprocess

            cmd = [str(BIN_DIR / "kubectl"), f"--kubeconfig={plane.kubeconfig}", *a]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if check and done.returncode != 0:
                raise RuntimeError(f"kubectl {' '.join(a)}: {done.stderr}")
            return done

        kubectl("apply", "-f", str(CRD))
        kubectl("wait", "--for=condition=Established", "crd/etls.sluice.dev")
        print(f"operator scale: {args.nodes} fake nodes, {psutil.cpu_count()} CPUs")
        print(f"{'targets':>7} {'pods':>8} {'running':>8} {'delete':>8} {'rss MB':>7} {'cpu s':>6}")
        for n in sizes:
            r = run_size(api, kubectl, plane.kubeconfig, n, kubelet.node_names)
            print(
                f"{n:>7} {r['pods']:>7.1f}s {r['running']:>7.1f}s {r['delete']:>7.1f}s "
                f"{r['rss_mb']:>7.0f} {r['cpu_s']:>6.1f}",
                flush=True,
            )
    finally:
        kubelet.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
