"""``sluice s3 key create|list|revoke``: the keys of the gateway's S3 API.

A key is an access key id and a secret for any S3 client (boto3, the AWS
CLI, s3fs, ...) pointed at ``http://GATEWAY/s3``; ``--read`` makes one that
may only read, ``--bucket B`` (repeatable) one limited to those buckets.
The secret is printed once, at creation; ``revoke`` (or ``delete``) drops a key.
These calls need the user token (``--token`` / ``SLUICE_TOKEN``) when the cluster
has one.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from etl_runtime.cli.errors import CliError
from etl_runtime.sdk import Client


def cmd_key(client: Client, args: argparse.Namespace) -> None:
    if args.action == "create":
        body: dict[str, Any] = {"permission": "read" if args.read else "write"}
        if args.bucket:
            body["buckets"] = args.bucket
        key = client.request_json("POST", "/v1/s3/keys", json_body=body)
        endpoint = client.endpoint.rstrip("/") + "/s3"
        print(f"access key: {key['access_key']}")
        print(f"secret key: {key['secret_key']}")
        print(f"permission: {key['permission']}")
        print(f"buckets:    {', '.join(key.get('buckets') or ['(every bucket)'])}")
        print(f"endpoint:   {endpoint}  (path-style; sign with SigV4)")
        print("the secret is not shown again")
    elif args.action == "list":
        for k in client.request_json("GET", "/v1/s3/keys")["keys"]:
            when = datetime.datetime.fromtimestamp(k["created"]).isoformat(" ", "seconds")
            scope = ",".join(k.get("buckets") or ["*"])
            print(f"{k['access_key']:<22}  {k['permission']:<5}  {when}  {scope}")
    else:
        if not args.access_key:
            raise CliError(f"sluice s3 key {args.action}: give the ACCESS_KEY")
        client.request_json("DELETE", f"/v1/s3/keys/{args.access_key}")
        print(f"{'revoked' if args.action == 'revoke' else 'deleted'} {args.access_key}")


def register(sub: Any) -> None:
    """Add ``s3`` (``sluice s3 key ...``) to ``sluice``'s subcommands."""
    s3 = sub.add_parser(
        "s3",
        help="the S3 API's access keys (sluice s3 key create|list|revoke)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Examples:\n"
            "  sluice s3 key create            # a key that may read and write\n"
            "  sluice s3 key create --read     # a key that may only read\n"
            "  sluice s3 key create --bucket train --read   # only bucket train\n"
            "  sluice s3 key list\n"
            "  sluice s3 key revoke SLKABCDEFGHIJKLMNOPQ   # or delete\n"
        ),
    )
    what = s3.add_subparsers(dest="s3_command", metavar="key", required=True)
    key = what.add_parser(
        "key",
        help="create, list or delete S3 keys",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  sluice s3 key create --read\n  sluice s3 key list\n",
    )
    key.add_argument("action", choices=["create", "list", "revoke", "delete"])
    key.add_argument("access_key", nargs="?", help="revoke/delete: the access key id")
    key.add_argument(
        "--bucket", action="append", default=[], help="create: a bucket it may use (repeat)"
    )
    key.add_argument("--read", action="store_true", help="create: a read-only key")
    key.set_defaults(func=cmd_key)
