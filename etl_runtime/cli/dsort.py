"""``sluice dsort start``: start a dSort (shuffle / reshard) job from a JSON spec.

The spec is AIStore's (``docs/dsort.md``); the command prints the job id, which
``sluice job show|wait|abort`` (and ``GET /v1/jobs/{id}``) take. ``--wait``
shows a progress bar (output shards written) until the job ends, then the
job; a failed or aborted job exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from etl_runtime.cli.jobs import format_job, wait_with_bar
from etl_runtime.sdk import Client, SluiceError

EXAMPLE = """\
example:
  cat > spec.json <<'EOF'
  {
    "extension": ".tar",
    "bck": {"name": "images", "provider": "ais"},
    "input_format": "shard-{000000..000099}",
    "output_format": "shuffled-%06d.tar",
    "output_shard_size": "100MB",
    "algorithm": {"kind": "shuffle", "seed": "42"},
    "output_bck": {"name": "images-shuffled"},
    "description": "shuffle before training"
  }
  EOF
  sluice dsort start -f spec.json          # prints the job id, e.g. dsort-1a2b3c4d
  sluice dsort start -f spec.json --wait   # ... and waits until it ends
"""


class SpecError(SluiceError):
    """The spec could not be read (a file that is missing, or not JSON)."""


def load_spec(args: argparse.Namespace) -> Any:
    if args.file and args.spec:
        raise SpecError("give the spec inline or with -f, not both")
    if not args.file and not args.spec:
        raise SpecError("no spec: give -f spec.json, -f - (stdin) or the JSON inline")
    where = args.file or "the inline spec"
    try:
        if args.file == "-":
            text = sys.stdin.read()
        elif args.file:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        else:
            text = args.spec
        return json.loads(text)
    except OSError as e:
        raise SpecError(f"cannot read {where}: {e.strerror or e}") from None
    except ValueError as e:
        raise SpecError(f"{where} is not JSON: {e}") from None


def cmd_dsort_start(client: Client, args: argparse.Namespace) -> None:
    job = client.dsort(load_spec(args))
    print(job.id, flush=True)
    if args.wait:
        status = wait_with_bar(job, None)
        print(format_job(status), file=sys.stderr)


def register(sub: Any) -> None:
    """Add ``sluice dsort ...`` to the ``sluice`` command's subparsers."""
    d = sub.add_parser(
        "dsort",
        help="shuffle or reshard WebDataset shards across the cluster (dSort)",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dsub = d.add_subparsers(dest="dsort_command", metavar="ACTION", required=True)
    start = dsub.add_parser(
        "start",
        help="start a dSort job from a JSON spec; prints the job id",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    start.add_argument("spec", nargs="?", help="the spec as inline JSON (or use -f)")
    start.add_argument("-f", "--file", metavar="SPEC.json", help="the spec file, - for stdin")
    start.add_argument("--wait", action="store_true", help="wait until the job ends")
    start.set_defaults(func=cmd_dsort_start)
