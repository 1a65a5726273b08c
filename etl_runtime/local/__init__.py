"""Sluice on one machine: gateway, targets and transformers as local processes.

* ``controller.LocalEtlBackend`` -- the gateway's ETL API, running transformers
  (the local counterpart of the kopf operator, sharing its reconcile logic);
* ``up.main`` -- ``sluice up``; ``api.LocalCluster`` -- the same from Python;
* ``processes``, ``supervisor`` -- the child processes and their restarts.

The stores it shares with the servers (``FileRegistry``, ``StaticTargets``)
live in ``etl_runtime.cluster.local``.
"""

from __future__ import annotations

from etl_runtime.local.api import LocalCluster

__all__ = ["LocalCluster"]
