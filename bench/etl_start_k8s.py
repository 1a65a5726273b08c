"""How long a new ETL takes to start on Kubernetes with real kubelets (issue 23 item 2).

Brings up the real-node harness (``tests/k8s/realnode.py``: control plane and
``--nodes`` kubelets with containerd and runc, each node in its own network
namespace), imports ``make images``' archives into every node (so the images
are already pulled, as the goal states), installs the chart
(``helm/sluice``, ``--targets`` target pods, one gateway, the operator), then
``--reps`` times:

``kubectl apply`` of an object ETL written as YAML (its source inline) →
``kubectl get etl`` shows ``Running N/N`` (polled every 50 ms) → the first GET
through the ETL answers the transformed bytes → ``kubectl delete etl``, and
waits until its transformer pods are gone before the next.

Printed per repetition and as medians: apply → Running, apply → first
transformed GET, and where the time went for the slowest transformer pod
(from the pod's own status: scheduled, container started, Ready).

    .venv/bin/python bench/etl_start_k8s.py [--reps 5] [--targets 3]

Needs what ``make test`` builds: ``make k8s-tools images``. Root (network
namespaces, containerd). About 3 minutes on a quiet 2-core machine, most of it
the images' import and the chart's start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from etl_runtime import Client  # noqa: E402
from tests.helm.realstack import TOKEN, Stack, endpoint, etl_yaml, installed  # noqa: E402
from tests.k8s.realfixtures import RUNS, RealNodes  # noqa: E402
from tests.k8s.realnode import RealCluster  # noqa: E402

SOURCE = """
def transform(data):
    return data.upper()
"""


def pod_times(st: Stack, etl: str) -> dict[str, float]:
    """Wall-clock times (epoch s) of the slowest transformer pod's milestones."""
    slowest: dict[str, float] = {}
    for pod in st.pods(f"sluice.dev/etl={etl}"):
        conds = {c.type: c.last_transition_time.timestamp() for c in pod.status.conditions or ()}
        started = None
        for cs in pod.status.container_statuses or ():
            if cs.state.running is not None:
                started = cs.state.running.started_at.timestamp()
        one = {
            "created": pod.metadata.creation_timestamp.timestamp(),
            "scheduled": conds.get("PodScheduled", 0.0),
            "container started": started or 0.0,
            "ready": conds.get("Ready", 0.0),
        }
        if not slowest or one["ready"] > slowest["ready"]:
            slowest = one
    return slowest


def one_start(st: Stack, url: str, rep: int, targets: int) -> dict[str, float]:
    name = f"start-{rep}"
    t0 = time.time()
    st.kubectl("apply", "-f", "-", stdin=etl_yaml(name, SOURCE))
    running = None
    while time.time() - t0 < 240:
        if st.etl_row(name)[1:3] == ["Running", f"{targets}/{targets}"]:
            running = time.time()
            break
        time.sleep(0.05)
    assert running is not None, st.diagnostics()
    first = httpx.get(f"{url}/v1/objects/b/o", params={"etl_name": name}, follow_redirects=True,
                      timeout=60)  # fmt: skip
    got = time.time()
    assert (first.status_code, first.content) == (200, b"HELLO"), first.text
    out = {"Running": running - t0, "first GET": got - t0}
    out.update({k: v - t0 for k, v in pod_times(st, name).items() if v})
    st.kubectl("delete", "etl", name, "--wait", "--timeout=120s")
    deadline = time.time() + 120
    while st.pods(f"sluice.dev/etl={name}") and time.time() < deadline:
        time.sleep(0.2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--targets", type=int, default=3, help="target pods (and nodes)")
    args = parser.parse_args()
    RUNS.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="run-", dir=RUNS))
    real = RealCluster(state, nodes=args.targets)
    t = time.monotonic()
    real.start()
    print(f"real nodes up in {time.monotonic() - t:.1f}s", flush=True)
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(real.kubeconfig), client_configuration=cfg)
        nodes = RealNodes(real.plane, client.ApiClient(cfg), real=real)
        home = Path(tempfile.mkdtemp(prefix="helm-"))
        with contextlib.contextmanager(installed)(nodes, home) as st:
            url = endpoint(st, args.targets)
            with Client(url, token=TOKEN, timeout=60) as sdk:
                sdk.bucket("b").create().object("o").put_content(b"hello")
            rows = []
            for rep in range(args.reps):
                row = one_start(st, url, rep, args.targets)
                rows.append(row)
                print(f"rep {rep}: " + ", ".join(f"{k} {v:.2f}s" for k, v in row.items()),
                      flush=True)  # fmt: skip
                time.sleep(2)
            print(f"\nmedians over {args.reps} (load average {os.getloadavg()[0]:.1f}):")
            for key in rows[0]:
                vals = [r[key] for r in rows if key in r]
                print(f"  apply -> {key}: {statistics.median(vals):.2f}s (max {max(vals):.2f}s)")
    finally:
        real.stop()


if __name__ == "__main__":
    main()
