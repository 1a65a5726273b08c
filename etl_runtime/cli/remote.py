"""``sluice`` commands for remote buckets: ``prefetch``, ``evict``, ``props``; ``gs://`` refs.

A bucket reference may carry its provider as AIStore writes it: ``s3://b``
or ``aws://b``, ``gs://b`` or ``gcp://b``, ``az://b`` or ``azure://b`` (any
provider or alias of ``etl_runtime.core.providers``), ``ais://b`` or a bare
``b`` a Sluice bucket. ``parse_ref`` is what ``get``,
``put`` and ``ls`` in ``etl_runtime.cli.commands`` call; ``register`` adds this
module's subcommands to the parser.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tqdm import tqdm

from etl_runtime.cli.errors import CliError
from etl_runtime.core import providers
from etl_runtime.sdk import Client
from etl_runtime.sdk.remote import RemoteBucket


def parse_ref(ref: str) -> tuple[str, str]:
    """``gs://b/o`` -> (``gcp``, ``b/o``); ``b/o`` -> (``ais``, ``b/o``)."""
    return providers.split_uri(ref)


def remote_bucket(client: Client, ref: str) -> RemoteBucket:

    provider, name = parse_ref(ref)
    name = name.rstrip("/")
    if not providers.is_remote(provider) or not name or "/" in name:
        raise CliError(
            f"expected a remote bucket as s3://BUCKET, gs://BUCKET or az://BUCKET, got {ref!r}"
        )
    bucket = client.bucket(name, provider=provider)
    assert isinstance(bucket, RemoteBucket)
    return bucket


def ls(client: Client, bucket: str, prefix: str, provider: str) -> None:
    """``sluice ls gs://b``: the backend's objects, with a cached column."""
    remote = client.bucket(bucket, provider=provider)
    assert isinstance(remote, RemoteBucket)
    for o in remote.list_entries(prefix=prefix):
        cached = "cached" if o.get("cached") else "-"
        print(f"{o['size']:>12}  {o.get('etag') or '-':<34}  {cached:<6}  {o['name']}")


def cmd_prefetch(client: Client, args: argparse.Namespace) -> None:
    bucket = remote_bucket(client, args.bucket)
    bar: tqdm[Any] | None = None

    def progress(job: dict[str, Any]) -> None:
        nonlocal bar
        total = (job.get("spec") or {}).get("total") or {}
        p = job["progress"]
        if bar is None:
            bar = tqdm(
                total=total.get("bytes"),
                unit="B",
                unit_scale=True,
                desc=f"prefetch {bucket.provider}://{bucket.name}/{args.prefix}",
                disable=args.quiet,
            )
        bar.update(p["bytes"] - bar.n)
        bar.set_postfix(objects=p["objects"], cached_already=p["skipped"])

    try:
        job = bucket.prefetch(prefix=args.prefix, on_progress=progress)
    finally:
        if bar is not None:
            bar.close()
    p = job["progress"]
    print(
        f"prefetched {p['objects']} object(s), {p['bytes']} bytes of {bucket.provider}://{bucket.name}/"
        f"{args.prefix} ({p['skipped']} cached already; job {job['id']})"
    )
    if job.get("error_count"):
        for e in job.get("errors", [])[:10]:
            print(f"  failed: {e.get('object')}: {e.get('error')}")

        raise CliError(f"{job['error_count']} object(s) could not be prefetched")


def cmd_evict(client: Client, args: argparse.Namespace) -> None:
    bucket = remote_bucket(client, args.bucket)
    job = bucket.evict(prefix=args.prefix)
    p = job["progress"]
    print(
        f"evicted {p['objects']} cached object(s), {p['bytes']} bytes of {bucket.provider}://{bucket.name}"
    )


def _bool(text: str) -> bool:
    if text.lower() in ("true", "on", "yes", "1"):
        return True
    if text.lower() in ("false", "off", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def cmd_props(client: Client, args: argparse.Namespace) -> None:
    bucket = remote_bucket(client, args.bucket)
    given = {
        "endpoint": args.s3_endpoint,
        "region": args.region,
        "project": args.project,
        "account": args.account,
        "secret": args.secret,
        "validate_cold_get": args.validate_cold_get,
        "validate_warm_get": args.validate_warm_get,
        "validate_interval": args.validate_interval,
    }
    if any(v is not None for v in given.values()):
        if args.create:
            bucket.create(**given)  # type: ignore[arg-type]
        else:
            bucket.set_props(**given)  # type: ignore[arg-type]
    elif args.create:
        bucket.create()
    else:
        bucket._ensure()  # nothing to change: show the props
    print(json.dumps(bucket.props(), indent=1, sort_keys=True))


def register(sub: Any) -> None:
    """Add ``prefetch``, ``evict`` and ``props`` to ``sluice``'s subcommands."""
    fmt = argparse.RawDescriptionHelpFormatter
    pf = sub.add_parser(
        "prefetch",
        help="warm the cache of a remote bucket (a job, with a progress bar)",
        formatter_class=fmt,
        epilog="example:\n  sluice prefetch s3://imagenet --prefix train/shard-00\n",
    )
    pf.add_argument("bucket", metavar="s3://BUCKET|gs://BUCKET|az://BUCKET")
    pf.add_argument("--prefix", default="", help="only objects whose names start with it")
    pf.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    pf.set_defaults(func=cmd_prefetch)

    ev = sub.add_parser(
        "evict",
        help="drop the cached copies of a remote bucket (the backend keeps them)",
        formatter_class=fmt,
        epilog="example:\n  sluice evict s3://imagenet --prefix train/\n",
    )
    ev.add_argument("bucket", metavar="s3://BUCKET|gs://BUCKET|az://BUCKET")
    ev.add_argument("--prefix", default="", help="only objects whose names start with it")
    ev.set_defaults(func=cmd_evict)

    pr = sub.add_parser(
        "props",
        help="show or set a remote bucket's backend props (endpoint, region, secret, ...)",
        formatter_class=fmt,
        epilog=(
            "examples:\n"
            "  sluice props s3://imagenet\n"
            "  sluice props s3://imagenet --create --s3-endpoint http://minio:9000 "
            "--secret minio-keys\n"
            "  sluice props s3://imagenet --validate-warm-get true --validate-interval 60\n"
        ),
    )
    pr.add_argument("bucket", metavar="s3://BUCKET|gs://BUCKET|az://BUCKET")
    pr.add_argument("--create", action="store_true", help="add the backend bucket to Sluice")
    pr.add_argument(
        "--s3-endpoint",
        "--endpoint",
        dest="s3_endpoint",
        help="the backend's endpoint URL (default: the servers' environment)",
    )
    pr.add_argument("--region", help="an aws bucket's region")
    pr.add_argument("--project", help="a gcp bucket's project")
    pr.add_argument("--account", help="an azure bucket's storage account")
    pr.add_argument("--secret", help="profile:NAME, anonymous, or a secret mounted on targets")
    pr.add_argument("--validate-cold-get", type=_bool, metavar="true|false")
    pr.add_argument("--validate-warm-get", type=_bool, metavar="true|false")
    pr.add_argument("--validate-interval", type=float, metavar="SECONDS")
    pr.set_defaults(func=cmd_props)
