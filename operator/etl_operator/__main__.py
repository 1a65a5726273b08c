"""``sluice-operator`` / ``python -m etl_operator``: run the kopf operator.

Equivalent to ``kopf run -m etl_operator.handlers`` with Sluice's defaults:
standalone unless ``--peering NAME`` (see docs/operator.md); the namespaces
from ``--namespace`` (repeatable) or ``SLUICE_NAMESPACE``, else every
namespace (``--all-namespaces``, also the default when none is given).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf


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
        "--liveness",
        default=os.environ.get("SLUICE_LIVENESS") or None,
        help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--debug", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    namespaces = args.namespace or (
        [os.environ["SLUICE_NAMESPACE"]] if os.environ.get("SLUICE_NAMESPACE") else []
    )
    clusterwide = args.all_namespaces or not namespaces
    kopf.configure(verbose=args.verbose, debug=args.debug)
    if not (args.verbose or args.debug):
        # kopf logs every handler call at INFO; the controller logs what it does.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    import etl_operator.handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        clusterwide=clusterwide,
        namespaces=[] if clusterwide else namespaces,
        standalone=args.standalone or args.peering is None,
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
