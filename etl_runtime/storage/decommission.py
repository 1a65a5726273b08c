"""Decommission: a target that is leaving the cluster hands its objects over first.

On SIGTERM (``run_server(before_exit=...)``) a target asks ``leaving()`` —
on Kubernetes: is my StatefulSet ordinal at or above ``spec.replicas`` now,
i.e. is this a scale-down rather than a restart? A restarting target just
stops (it keeps its objects and comes back). A leaving one keeps serving
while it:

1. waits until the cluster map no longer lists it as a member (the gateway
   applies the scale-down; until then nobody else owns its objects);
2. waits until its own rebalance for that map is ``done``
   (``GET /v1/_rebalance`` on itself): every object it held now sits at its
   new owners;

then it exits. Both waits together are bounded by ``timeout`` (the chart sets
``SLUICE_DECOMMISSION_TIMEOUT`` a few seconds under the pod's
``terminationGracePeriodSeconds``). If it runs out, it logs an error naming
itself; its PVC is retained (``whenScaled: Retain``), so scaling back up
returns the objects through a rebalance. An unfinished hand-over (or a lost
node) is not silent: the gateways' rebalance monitor keeps the rebalance
running and lists this target in ``GET /v1/cluster`` -> ``rebalance.waiting_for``,
and reads of objects it may hold answer 503 naming it instead of 404. After a
clean hand-over the target lingers ``LINGER_SECONDS`` so the monitors see it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import httpx

from etl_runtime.cluster.clustermap import ClusterMapStore
from etl_runtime.core import auth, tls
from etl_runtime.storage.peers import INTERNAL_HEADER

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT = 25.0
POLL_SECONDS = 0.5


LINGER_SECONDS = 3.0


def timeout_from_env() -> float:
    try:
        return max(0.0, float(os.environ.get("SLUICE_DECOMMISSION_TIMEOUT", DEFAULT_TIMEOUT)))
    except ValueError:
        return DEFAULT_TIMEOUT


async def decommission(
    self_id: str,
    self_url: str,
    cmap: ClusterMapStore,
    leaving: Callable[[], bool],
    timeout: float,
) -> bool:
    """Hand this target's objects over if it is leaving; True when it is done (or staying)."""
    try:
        gone = await asyncio.to_thread(leaving)
    except Exception as e:  # cannot tell: behave as a restart, and say so
        log.warning("%s: cannot tell whether this target is leaving (%s); stopping", self_id, e)
        return False
    if not gone:
        return True
    deadline = time.monotonic() + timeout
    log.warning("%s is leaving the cluster: handing its objects over (up to %.0fs)",
                self_id, timeout)  # fmt: skip
    verify = tls.client_context()
    key = auth.cluster_key_from_env()  # GET /v1/_rebalance is internal
    internal = {INTERNAL_HEADER: auth.internal_token(key)} if key else {}
    async with httpx.AsyncClient(
        trust_env=False, timeout=5.0, verify=verify, headers=internal
    ) as http:
        while time.monotonic() < deadline:
            m = cmap.get()
            if self_id not in m.members:
                try:
                    r = await http.get(f"{self_url}/v1/_rebalance")
                    status = r.json() if r.status_code == 200 else {}
                except (httpx.HTTPError, ValueError):
                    status = {}
                if status.get("rebalance_id") == m.rebalance_id and status.get("state") == "done":
                    log.warning("%s handed its objects over (rebalance %d): %s",
                                self_id, m.rebalance_id, status)  # fmt: skip
                    # Stay long enough for the gateways' monitors (once a second)
                    # to see "done": a holder that vanishes unseen keeps the
                    # rebalance open and is reported as waiting_for.
                    await asyncio.sleep(LINGER_SECONDS)
                    return True
            await asyncio.sleep(POLL_SECONDS)
    log.error("%s: decommission did not finish in %.0fs; objects still here are reported "
              "by the gateway's /v1/cluster until this target's volume comes back",
              self_id, timeout)  # fmt: skip
    return False
