"""``sluice token create|list|revoke``: access tokens limited to buckets.

A token reads (``--read``), or reads and writes (``--write``), the buckets
named with ``--bucket`` until it expires (``--ttl``, default 8h) or is
revoked; it works as ``--token`` / ``SLUICE_TOKEN`` of the CLI, the SDK's
``Client(token=...)`` and the aistore SDK's. Managing tokens needs the user
token (``--token`` / ``SLUICE_TOKEN``). The token is printed once.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from etl_runtime.cli.errors import CliError
from etl_runtime.sdk import Client


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(" ", "seconds")


def cmd_token(client: Client, args: argparse.Namespace) -> None:
    if args.action == "create":
        if not args.bucket:
            raise CliError("sluice token create: name at least one --bucket")
        if args.read == args.write:
            raise CliError("sluice token create: give --read or --write")
        body = {
            "buckets": args.bucket,
            "permission": "write" if args.write else "read",
            "ttl": args.ttl,
        }
        t = client.request_json("POST", "/v1/tokens", json_body=body)
        print(f"token:      {t['token']}")
        print(f"id:         {t['id']}")
        print(f"buckets:    {', '.join(t['buckets'])}")
        print(f"permission: {t['permission']}")
        print(f"expires:    {_when(t['expires'])}")
        print("the token is not shown again")
    elif args.action == "list":
        for t in client.request_json("GET", "/v1/tokens")["tokens"]:
            state = "revoked" if t.get("revoked") else "valid"
            print(
                f"{t['id']:<18}  {t['permission']:<5}  {state:<7}  "
                f"expires {_when(t['expires'])}  {','.join(t['buckets'])}"
            )
    else:
        if not args.id:
            raise CliError("sluice token revoke: give the token ID (`sluice token list`)")
        client.request_json("DELETE", f"/v1/tokens/{args.id}")
        print(f"revoked {args.id}")


def register(sub: Any) -> None:
    """Add ``token`` (``sluice token ...``) to ``sluice``'s subcommands."""
    token = sub.add_parser(
        "token",
        help="access tokens limited to buckets (sluice token create|list|revoke)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Examples:\n"
            "  sluice token create --bucket train --read --ttl 8h\n"
            "  sluice token create --bucket raw --bucket out --write\n"
            "  sluice token list\n"
            "  sluice token revoke 3f2a9c0d1e4b5a67\n"
        ),
    )
    token.add_argument("action", choices=["create", "list", "revoke"])
    token.add_argument("id", nargs="?", help="revoke: the token's id")
    token.add_argument(
        "--bucket", action="append", default=[], help="create: a bucket it may use (repeat)"
    )
    token.add_argument("--read", action="store_true", help="create: it may only read")
    token.add_argument("--write", action="store_true", help="create: it may read and write")
    token.add_argument("--ttl", default="8h", help="create: lifetime, e.g. 30m, 8h, 7d")
    token.set_defaults(func=cmd_token)
