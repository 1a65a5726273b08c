"""``sluice-gateway`` / ``python -m etl_runtime.gateway``: run the gateway.

Local mode (``--targets t0=URL,...``): a ``StaticTargets`` health loop and the
local ETL controller (transformers as child processes, state in
``--state-dir``). Kubernetes mode (``--kubernetes``): target pods by label and
ETL custom resources; with ``--cluster-map kubernetes`` the map lives in a
ConfigMap and its members follow the StatefulSet ``--target-statefulset``.
Flags and env vars as in docs/processes.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etl_runtime.core import auth
from etl_runtime.gateway.app import create_gateway_app
from etl_runtime.wire.http.serving import Hook, noop, run_server

TARGET_SELECTOR = "sluice.dev/role=target"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="sluice-gateway", description=__doc__)
    p.add_argument("--host", default=env("SLUICE_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(env("SLUICE_PORT", "8080")))
    p.add_argument("--token", default=env("SLUICE_TOKEN"), help="user token for mutating calls")
    p.add_argument(
        "--read-token",
        default=env("SLUICE_READ_TOKEN"),
        help="if set, reads need this token (or --token)",
    )
    p.add_argument("--targets", default=env("SLUICE_TARGETS"), help="t0=http://host:port,...")
    p.add_argument(
        "--kubernetes",
        action="store_true",
        default=env("SLUICE_KUBERNETES", "") not in ("", "0", "false"),
        help="discover target pods and use ETL custom resources",
    )
    p.add_argument("--state-dir", default=env("SLUICE_STATE_DIR"), help="local ETL state dir")
    p.add_argument(
        "--s3-keys",
        default=env("SLUICE_S3_KEYS"),
        help="file of the S3 API's keys (default: STATE_DIR/s3-keys.json with --state-dir), "
        "or kubernetes:SECRET (the Secret every gateway replica shares; the chart's)",
    )
    p.add_argument(
        "--batch-assembly",
        choices=("target", "gateway"),
        default=env("SLUICE_BATCH_ASSEMBLY", "target"),
        help="who assembles a GetBatch: a target the gateway designates (redirect, the "
        "default) or the gateway itself",
    )
    p.add_argument(
        "--down-file",
        default=env("SLUICE_DOWN_FILE"),
        help="local mode: JSON of targets 'sluice up' marked down after a crash loop",
    )
    p.add_argument(
        "--cluster-map",
        default=env("SLUICE_CLUSTER_MAP"),
        help="file:PATH or kubernetes[:CONFIGMAP]: the cluster map shared with the targets "
        "(members, buckets)",
    )
    p.add_argument(
        "--target-statefulset",
        default=env("SLUICE_TARGET_STATEFULSET"),
        help="Kubernetes: the targets' StatefulSet; its replicas are the map's members",
    )
    p.add_argument(
        "--members",
        default=env("SLUICE_MEMBERS"),
        help="t0,t1,...: the targets objects are placed on (default: every --targets id); "
        "others in --targets are leaving and hand their objects over",
    )
    args = p.parse_args(argv)
    if not args.kubernetes and not args.targets:
        p.error("give --targets t0=URL,... (or SLUICE_TARGETS), or --kubernetes")
    if not args.kubernetes and not args.state_dir:
        p.error("--state-dir (or SLUICE_STATE_DIR) is required with --targets")
    return args


def local_parts(args: argparse.Namespace, key: str) -> tuple[Any, Any, list[Hook], list[Hook]]:
    from etl_runtime.cluster.local.discovery import StaticTargets
    from etl_runtime.cluster.records import TargetInfo
    from etl_runtime.local.controller import LocalEtlBackend
    from etl_runtime.local.zygote import mode_from_env

    targets = []
    for item in args.targets.split(","):
        tid, sep, url = item.strip().partition("=")
        if not sep or not tid or not url:
            raise SystemExit(f"sluice-gateway: bad --targets item {item!r}: expected ID=URL")
        targets.append(TargetInfo(id=tid.strip(), url=url.strip().rstrip("/")))
    discovery = StaticTargets(targets, down_file=Path(args.down_file) if args.down_file else None)
    try:
        zygote_mode = mode_from_env()
    except ValueError as e:
        raise SystemExit(f"sluice-gateway: {e}") from None
    backend = LocalEtlBackend(Path(args.state_dir), discovery, key, zygote_mode=zygote_mode)
    return discovery, backend, [discovery.start, backend.start], [discovery.stop, backend.stop]


def kube_parts() -> tuple[Any, Any, list[Hook], list[Hook]]:
    from etl_runtime.cluster.kube.backend import KubeEtlBackend
    from etl_runtime.cluster.kube.discovery import KubeTargetDiscovery

    namespace = os.environ.get("SLUICE_NAMESPACE") or os.environ.get("POD_NAMESPACE") or None
    discovery = KubeTargetDiscovery(namespace, TARGET_SELECTOR)  # its watch starts here
    backend = KubeEtlBackend(namespace)
    return discovery, backend, [noop], [getattr(discovery, "close", noop)]


def kube_membership(discovery: Any, statefulset: str) -> Any:
    from etl_runtime.cluster.kube.membership import StatefulSetMembership

    membership = StatefulSetMembership(statefulset, discovery)  # its watch starts here
    discovery.wait_synced(10)
    membership.wait_synced(10)
    return membership


def s3_keys_file(args: argparse.Namespace) -> Any:
    """The S3 key store: ``kubernetes:SECRET`` (every replica shares it), a file, or None."""
    if args.s3_keys and args.s3_keys.startswith("kubernetes:"):
        from etl_runtime.gateway.s3.kubekeys import KubeKeyStore

        namespace = os.environ.get("SLUICE_NAMESPACE") or os.environ.get("POD_NAMESPACE") or None
        return KubeKeyStore(args.s3_keys.removeprefix("kubernetes:"), namespace)
    if args.s3_keys:
        return Path(args.s3_keys)
    return Path(args.state_dir) / "s3-keys.json" if args.state_dir else None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    key = auth.cluster_key_from_env()
    if not key:
        key = auth.new_key()
        print(
            "sluice-gateway: SLUICE_CLUSTER_KEY is not set; using a random key, so targets "
            "will refuse signed redirects and transformer tokens will not match",
            file=sys.stderr,
        )
    if args.kubernetes:
        discovery, backend, on_start, on_stop = kube_parts()
    else:
        discovery, backend, on_start, on_stop = local_parts(args, key)
    from etl_runtime.cluster.stores import open_cluster_map

    try:
        cmap = open_cluster_map(args.cluster_map)
    except ValueError as e:
        raise SystemExit(f"sluice-gateway: {e}") from None
    members = [m.strip() for m in args.members.split(",") if m.strip()] if args.members else None
    membership = None
    if args.kubernetes and cmap is not None and args.target_statefulset:
        membership = kube_membership(discovery, args.target_statefulset)
    app = create_gateway_app(
        discovery,
        backend,
        token=args.token,
        cluster_key=key,
        cluster_map=cmap,
        members=members,
        membership=membership,
        read_token=args.read_token,
        s3_keys=s3_keys_file(args),
        batch_assembly=args.batch_assembly,
    )
    run_server(
        app,
        args.host,
        args.port,
        on_start=on_start,
        on_stop=on_stop,
        answerer=app.state.answerer,  # GetBatch's redirect (gateway/inprotocol.py)
        starter=app.state.starter,
    )


if __name__ == "__main__":
    main()
