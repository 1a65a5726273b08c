"""``sluice-operator`` / ``python -m etl_operator``: run the kopf operator.

Equivalent to ``kopf run -m etl_operator.handlers`` with Sluice's defaults:
standalone unless ``--peering NAME`` (see docs/operator.md); the namespaces
from ``--namespace`` (repeatable) or ``SLUICE_NAMESPACE``, else every
namespace (``--all-namespaces``, also the default when none is given).

With ``--peering`` every replica gets its own priority (``--priority``, by
default a random one), so exactly one is active and the others stand by.
With exact ``--namespace`` names kopf does not list or watch the cluster's
namespaces (the operator's Role cannot, and need not).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, cast

import kopf

from etl_operator.controller import OperatorConfig
from etl_operator.metrics import DEFAULT_PORT as DEFAULT_METRICS_PORT
from etl_operator.metrics import serve_metrics
from etl_operator.peering import DEFAULT_LIFETIME, Peering, default_priority, own_identity

# Characters that make a --namespace a kopf pattern rather than a name.
_PATTERN_CHARS = set("*?[]!,")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sluice-operator", description=__doc__)
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to serve (repeatable; glob patterns allowed; default $SLUICE_NAMESPACE)",
    )
    p.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace")
    p.add_argument(
        "--peering",
        default=os.environ.get("SLUICE_PEERING") or None,
        help="kopf peering name for several replicas (needs crds/kopf-peering.yaml); "
        "default: standalone",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: this must be the only replica (the default without --peering)",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=int(os.environ["SLUICE_PRIORITY"]) if os.environ.get("SLUICE_PRIORITY") else None,
        help="kopf peering priority of this replica; the highest live one is active "
        "(default with --peering: random, so replicas never tie and pause each other)",
    )
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=int(os.environ.get("SLUICE_PEERING_LIFETIME") or DEFAULT_LIFETIME),
        help="seconds a replica that died without saying goodbye (SIGKILL, lost node) "
        "keeps blocking the standby replicas (default %(default)s)",
    )
    p.add_argument(
        "--liveness",
        default=os.environ.get("SLUICE_LIVENESS") or None,
        help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("SLUICE_METRICS_PORT") or DEFAULT_METRICS_PORT),
        help="port of the Prometheus GET /metrics endpoint (default %(default)s; 0 = none)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--debug", action="store_true")
    return p.parse_args(argv)


def exact_namespaces(namespaces: list[str]) -> bool:
    """Whether every namespace is a plain name (no kopf glob or negation pattern)."""
    return bool(namespaces) and not any(_PATTERN_CHARS & set(ns) for ns in namespaces)


def operator_settings(
    args: argparse.Namespace, namespaces: list[str], clusterwide: bool
) -> kopf.OperatorSettings:
    """kopf settings that depend on the command line (handlers.start adds the rest)."""
    settings = kopf.OperatorSettings()
    # Served namespaces given by name: kopf need not list/watch namespaces
    # (a namespaced Role forbids it; kopf would log each refusal, then fall
    # back to exactly these names anyway). Also skips the CRD watch, which a
    # namespaced operator cannot do either; the ETL CRD is found at start.
    settings.scanning.disabled = not clusterwide and exact_namespaces(namespaces)
    settings.peering.lifetime = args.peering_lifetime
    return settings


def peering_of(args: argparse.Namespace, clusterwide: bool) -> Peering | None:
    if args.standalone or args.peering is None:
        return None
    priority = args.priority if args.priority is not None else default_priority()
    return Peering(
        name=args.peering,
        identity=own_identity(),
        priority=priority,
        clusterwide=clusterwide,
        lifetime=args.peering_lifetime,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        OperatorConfig.from_env()  # read again at start-up; fail here, clearly, if malformed
    except ValueError as e:
        print(f"sluice-operator: {e}", file=sys.stderr)
        return 2
    namespaces = args.namespace or (
        [os.environ["SLUICE_NAMESPACE"]] if os.environ.get("SLUICE_NAMESPACE") else []
    )
    clusterwide = args.all_namespaces or not namespaces
    kopf.configure(verbose=args.verbose, debug=args.debug)
    if not (args.verbose or args.debug):
        # kopf logs every handler call at INFO; the controller logs what it does.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    import etl_operator.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        # The pod's own address (the chart sets POD_IP): pods that share a host
        # network (hostNetwork, the test suite's process kubelet) must not all
        # claim 0.0.0.0:PORT. Metrics are not worth a crash loop of the operator.
        addr = os.environ.get("POD_IP") or "0.0.0.0"
        try:
            serve_metrics(args.metrics_port, addr)
        except OSError as e:
            logging.getLogger("etl_operator").error(
                "metrics: cannot listen on %s:%d (%s); serving without /metrics",
                addr,
                args.metrics_port,
                e,
            )
    peering = peering_of(args, clusterwide)
    if peering is not None:
        logging.getLogger("etl_operator").info(
            "peering %r as %s with priority %d", peering.name, peering.identity, peering.priority
        )
    kopf.run(
        clusterwide=clusterwide,
        namespaces=[] if clusterwide else namespaces,
        standalone=peering is None,
        peering_name=peering.name if peering else None,
        priority=peering.priority if peering else None,
        # kopf's Identity is a NewType of str, not exported.
        identity=cast(Any, peering.identity) if peering else None,
        settings=operator_settings(args, namespaces, clusterwide),
        memo=kopf.Memo(peering=peering),
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
