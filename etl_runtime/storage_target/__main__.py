"""``sluice-target`` / ``python -m etl_runtime.storage_target``: run one storage target.

Flags and environment variables are those of docs/processes.md; flags win.
The registry (where this target learns its transformers' addresses) is
``file:DIR`` for the local cluster or ``kubernetes`` for ETL custom resources.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from etl_runtime.cluster.records import EtlRecord, EtlRegistry
from etl_runtime.core import auth, tls
from etl_runtime.storage_target.app import create_target_app
from etl_runtime.wire.http.serving import Hook, noop, run_server


class NoRegistry:
    """A target without ETLs: every ``etl_name`` is unknown."""

    def get(self, name: str) -> EtlRecord | None:
        return None


def make_registry(spec: str | None) -> EtlRegistry:
    if not spec:
        return NoRegistry()
    if spec.startswith("file:"):
        from etl_runtime.cluster.local.registry import FileRegistry

        return FileRegistry(spec[len("file:") :])
    if spec == "kubernetes":
        from etl_runtime.cluster.kube.registry import KubeEtlRegistry

        namespace = os.environ.get("SLUICE_NAMESPACE") or os.environ.get("POD_NAMESPACE")
        return KubeEtlRegistry(namespace or None)  # its watch starts at construction
    raise SystemExit(f"sluice-target: bad --registry {spec!r}: use file:DIR or kubernetes")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="sluice-target", description=__doc__)
    p.add_argument("--host", default=env("SLUICE_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(env("SLUICE_PORT", "8080")))
    p.add_argument(
        "--id",
        default=env("SLUICE_TARGET_ID") or env("POD_NAME") or socket.gethostname(),
        help="stable target id (HRW placement, ETL status)",
    )
    p.add_argument("--data-dir", default=env("SLUICE_DATA_DIR"), help="object storage root")
    p.add_argument("--token", default=env("SLUICE_TOKEN"), help="user token for mutating calls")
    p.add_argument(
        "--read-token",
        default=env("SLUICE_READ_TOKEN"),
        help="if set, reads need this token (or --token)",
    )
    p.add_argument("--registry", default=env("SLUICE_REGISTRY"), help="file:DIR or kubernetes")
    p.add_argument(
        "--cluster-map",
        default=env("SLUICE_CLUSTER_MAP"),
        help="file:PATH or kubernetes[:CONFIGMAP]: the cluster map shared with the gateway "
        "(members, buckets)",
    )
    p.add_argument(
        "--target-statefulset",
        default=env("SLUICE_TARGET_STATEFULSET"),
        help="Kubernetes: this target's StatefulSet; on a scale-down it hands its objects "
        "over before it exits",
    )
    p.add_argument(
        "--events",
        default=env("SLUICE_EVENTS"),
        help="kubernetes: record what this target finds (a scrub's corrupted, missing and "
        "orphaned copies) as Events on its pod",
    )
    args = p.parse_args(argv)
    if not args.data_dir:
        p.error("--data-dir (or SLUICE_DATA_DIR) is required")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    registry = make_registry(args.registry)
    key = auth.cluster_key_from_env()
    if args.token and not key:
        print(
            "sluice-target: SLUICE_CLUSTER_KEY is not set; redirects signed by the gateway "
            "will be refused",
            file=sys.stderr,
        )
    from etl_runtime.cluster.stores import open_cluster_map
    from etl_runtime.etl.cacheindex import budget_from_env
    from etl_runtime.etl.forward import redirect_bytes_from_env

    try:
        cmap = open_cluster_map(args.cluster_map)
        redirect_bytes_from_env()  # checked here: a bad value is a clear exit, not a traceback
        budget_from_env(args.data_dir or ".")  # SLUICE_ETL_CACHE_BYTES, the same
    except ValueError as e:
        raise SystemExit(f"sluice-target: {e}") from None
    app = create_target_app(
        args.id,
        args.data_dir,
        registry,
        token=args.token,
        cluster_key=key,
        cluster_map=cmap,
        read_token=args.read_token,
    )
    if args.events:
        from etl_runtime.cluster.kube.events import events_from_option

        try:
            app.state.target.events = events_from_option(args.events, args.id)
        except ValueError as e:
            raise SystemExit(f"sluice-target: {e}") from None
    close = getattr(registry, "close", None)  # the Kubernetes registry's watch
    before_exit = None
    if cmap is not None and args.target_statefulset:
        before_exit = decommission_hook(args, cmap)
    run_server(
        app,
        args.host,
        args.port,
        on_start=[noop],
        on_stop=[close or noop],
        before_exit=before_exit,
        answerer=app.state.answerer,  # small plain GETs skip ASGI (storage_target/inprotocol.py)
    )


def decommission_hook(args: argparse.Namespace, cmap: Any) -> Hook:
    from etl_runtime.cluster.kube.membership import ordinal_leaving
    from etl_runtime.storage.decommission import decommission, timeout_from_env

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    sts, pod = args.target_statefulset, args.id

    async def hook() -> None:
        url = f"{tls.scheme()}://{host}:{args.port}"
        leaving = lambda: ordinal_leaving(sts, pod)  # noqa: E731
        await decommission(pod, url, cmap, leaving, timeout_from_env())

    return hook


if __name__ == "__main__":
    main()
