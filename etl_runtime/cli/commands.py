"""``sluice``: the command line over the SDK (and ``sluice up`` for a local cluster).

Every command is a few lines on top of ``etl_runtime.sdk``; what the server says
on failure is printed as one line, ``sluice: error: <message>``, with exit
code 1 — never a traceback. ``--endpoint``/``SLUICE_ENDPOINT`` and
``--token``/``SLUICE_TOKEN`` select the cluster.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from etl_runtime.cli import dsort as cli_dsort
from etl_runtime.cli import remote as cli_remote
from etl_runtime.cli import s3 as cli_s3
from etl_runtime.cli import tokens as cli_tokens
from etl_runtime.cli.errors import CliError
from etl_runtime.cli.etl import cmd_etl
from etl_runtime.cli.jobs import register as register_jobs
from etl_runtime.cli.remote import parse_ref
from etl_runtime.core.providers import AIS
from etl_runtime.sdk import Client, SluiceError
from etl_runtime.sdk.client import DEFAULT_ENDPOINT

PROG = "sluice"


def split_object(ref: str) -> tuple[str, str]:
    bucket, sep, name = parse_ref(ref)[1].partition("/")
    if not (bucket and sep and name):
        raise CliError(f"expected BUCKET/OBJECT, got {ref!r}")
    return bucket, name


# -- objects and buckets -----------------------------------------------------


def cmd_bucket(client: Client, args: argparse.Namespace) -> None:
    if args.action == "ls":
        for name in client.list_buckets():
            print(name)
        return
    if not args.name:
        raise CliError(f"'sluice bucket {args.action}' needs a bucket name")
    bucket = client.bucket(args.name)
    if args.action == "create" and (args.view_of or args.etl):
        if not (args.view_of and args.etl):
            raise CliError("an ETL view needs both --view-of SRC and --etl NAME")
        bucket.create(exist_ok=True, view_of=args.view_of, etl=args.etl, etl_args=args.etl_args)
        print(f"view {args.name!r} ready: {args.view_of!r} through ETL {args.etl!r}")
    elif args.action == "create":
        bucket.create(exist_ok=True, copies=args.copies)
        print(f"bucket {args.name!r} ready")
    else:
        bucket.delete()
        print(f"bucket {args.name!r} deleted")


def format_cluster(view: dict[str, Any]) -> str:
    """``sluice cluster``: members, who is away, and the rebalance's progress."""
    lines = []
    rb = view.get("rebalance") or {}
    if "version" in view:
        lines.append(
            f"cluster map v{view['version']}: {len(view.get('members', []))} member(s); "
            f"rebalance {rb.get('state', '?')} (id {rb.get('id')}), "
            f"{rb.get('objects_moved', 0)} object(s) / {rb.get('bytes_moved', 0)} bytes moved"
            + (f", {rb['errors']} error(s)" if rb.get("errors") else "")
        )
    lines.append(f"{'TARGET':<16} {'STATE':<8} {'MEMBER':<7} {'REBALANCE':<10} URL")
    for t in view.get("targets", []):
        st = t.get("rebalance") or {}
        progress = st.get("state", "-")
        if st.get("state") == "running":
            progress += f" {st.get('objects_moved', 0)}/{st.get('objects_scanned', 0)}"
        member = "yes" if t.get("member", True) else "leaving"
        state = "up" if t.get("alive") else "DOWN" if t.get("down") else "AWAY"
        lines.append(f"{t['id']:<16} {state:<8} {member:<7} {progress:<10} {t.get('url') or '-'}")
    for t in view.get("targets", []):
        if t.get("down") and not t.get("alive"):
            lines.append(f"target {t['id']} is down ({t['down']}); retried with a back-off")
    for name, props in sorted((view.get("buckets") or {}).items()):
        if view := props.get("view"):
            args = f" etl_args={view['args']!r}" if view.get("args") else ""
            lines.append(f"bucket {name}: view of {view['of']} through ETL {view['etl']}{args}")
        else:
            lines.append(f"bucket {name}: copies={props.get('copies', 1)}")
    return "\n".join(lines)


def cmd_cluster(client: Client, args: argparse.Namespace) -> None:
    print(format_cluster(client.cluster()))


def show_progress(args: argparse.Namespace, to_stdout: bool = False) -> bool:
    """A progress bar on stderr: only for a person watching (a terminal), never
    with ``--quiet``, and never while the data itself goes to stdout."""
    return not (getattr(args, "quiet", False) or to_stdout) and sys.stderr.isatty()


def cmd_put(client: Client, args: argparse.Namespace) -> None:
    bucket, name = split_object(args.dest)
    obj = client.bucket(bucket, provider=parse_ref(args.dest)[0]).object(name)
    if args.file == "-":
        info = obj.put_content(sys.stdin.buffer.read())
    else:
        if not os.path.isfile(args.file):
            raise CliError(f"no such file: {args.file}")
        info = obj.put_file(args.file, progress=show_progress(args))
    print(f"put {bucket}/{name} ({info.size} bytes, etag {info.etag})")


def cmd_get(client: Client, args: argparse.Namespace) -> None:
    bucket, name = split_object(args.src)
    obj = client.bucket(bucket, provider=parse_ref(args.src)[0]).object(name)
    etl = args.etl.split(",") if args.etl else None  # a,b,c: a pipeline
    to_stdout = args.output in (None, "-")
    progress = show_progress(args, to_stdout)
    with obj.open(etl_name=etl, etl_args=args.etl_args, progress=progress) as reader:
        if to_stdout:
            _copy(reader, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return
        # Write beside the destination and rename, so a broken stream leaves no
        # truncated file behind.
        out = Path(args.output)
        part = out.with_name(f".{out.name}.part")
        try:
            with open(part, "wb") as f:
                _copy(reader, f)
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)


def _copy(reader: Any, out: BinaryIO) -> None:
    while chunk := reader.read(1 << 20):
        out.write(chunk)


def cmd_ls(client: Client, args: argparse.Namespace) -> None:
    provider, bucket = parse_ref(args.bucket)
    if provider != AIS:
        return cli_remote.ls(client, bucket.rstrip("/"), args.prefix, provider)
    for info in client.bucket(bucket).list_objects(prefix=args.prefix):
        print(f"{info.size:>12}  {info.etag or '-':<32}  {info.name}")


# -- the parser --------------------------------------------------------------


def examples(*lines: str) -> dict[str, Any]:
    """``add_parser``/``ArgumentParser`` keywords for an "Examples:" epilog, kept as written.

    Every subcommand has one (tests/cli/test_help.py walks them all), including
    those registered by ``etl_runtime/cli_*.py`` modules.
    """
    return {
        "epilog": "Examples:\n" + "\n".join(f"  {line}" for line in lines),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar (shown on a terminal)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Sluice: run Python transforms next to the data.",
        **examples(
            "sluice up --targets 3 --port 8080        # a local cluster, in the foreground",
            "sluice bucket create images",
            "sluice put cat.jpg images/cat.jpg",
            "sluice get images/cat.jpg --etl resize -o small.jpg",
            "sluice <command> --help                  # each command's options and examples",
        ),
    )
    p.add_argument(
        "--endpoint",
        default=os.environ.get("SLUICE_ENDPOINT") or DEFAULT_ENDPOINT,
        help="gateway URL (env SLUICE_ENDPOINT, default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("SLUICE_TOKEN") or None,
        help="user token (env SLUICE_TOKEN)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="network timeout, seconds")
    p.add_argument(
        "--ca",
        default=os.environ.get("SLUICE_CA") or None,
        metavar="PEM",
        help="CA file an https:// gateway is verified with (env SLUICE_CA; sluice up --tls: "
        "DATA_DIR/tls/ca.crt)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser(
        "up",
        help="run a local cluster (gateway + N targets) in the foreground",
        **examples("sluice up --targets 3 --port 8080 --data-dir ./sluice-data"),
    )
    up.add_argument(
        "args", nargs=argparse.REMAINDER, help="--targets N --port P --data-dir DIR [--token T]"
    )

    b = sub.add_parser(
        "bucket",
        help="create, list or remove buckets",
        **examples(
            "sluice bucket create images",
            "sluice bucket create precious --copies 2   # each object on 2 targets",
            "sluice bucket create small --view-of images --etl resize   # an ETL view",
            "sluice bucket ls",
            "sluice bucket rm images",
        ),
    )
    b.add_argument("action", choices=["create", "ls", "rm"])
    b.add_argument("name", nargs="?")
    b.add_argument("--copies", type=int, help="create: targets holding each object (1-3)")
    b.add_argument("--view-of", metavar="SRC", help="create an ETL view of bucket SRC (read-only)")
    b.add_argument("--etl", metavar="NAME", help="the view's ETL")
    b.add_argument("--etl-args", metavar="ARGS", help="the view's etl_args")
    b.set_defaults(func=cmd_bucket)

    cl = sub.add_parser(
        "cluster",
        help="targets, who is away, rebalance progress, buckets",
        **examples(
            "sluice cluster",
            "sluice --endpoint http://gateway:8080 cluster   # the browser view: http://gateway:8080/ui",
        ),
    )
    cl.set_defaults(func=cmd_cluster)

    put = sub.add_parser(
        "put",
        help="upload a file (or - for stdin) to BUCKET/OBJECT",
        **examples(
            "sluice put shard-000.tar data/shards/shard-000.tar   # progress bar on a terminal",
            "tar c photos | sluice put - data/photos.tar",
            "sluice put -q big.bin data/big.bin                  # no progress bar",
        ),
    )
    put.add_argument("file")
    put.add_argument("dest", metavar="BUCKET/OBJECT")
    add_quiet(put)
    put.set_defaults(func=cmd_put)

    get = sub.add_parser(
        "get",
        help="download BUCKET/OBJECT, optionally through an ETL",
        **examples(
            "sluice get data/shards/shard-000.tar -o shard.tar   # progress bar on a terminal",
            "sluice get images/cat.jpg --etl resize --etl-args 64 -o small.jpg",
            "sluice get data/notes.txt | head                   # to stdout: no progress bar",
        ),
    )
    get.add_argument("src", metavar="BUCKET/OBJECT")
    get.add_argument("--etl", metavar="NAME", help="transform with this ETL (a,b,c: a pipeline)")
    get.add_argument("--etl-args", metavar="ARGS", help="string passed to the transform")
    get.add_argument("-o", "--output", metavar="FILE", help="write here (default stdout)")
    add_quiet(get)
    get.set_defaults(func=cmd_get)

    ls = sub.add_parser(
        "ls",
        help="list the objects of a bucket",
        **examples("sluice ls images", "sluice ls data --prefix shards/"),
    )
    ls.add_argument("bucket")
    ls.add_argument("--prefix", default="")
    ls.set_defaults(func=cmd_ls)

    e = sub.add_parser(
        "etl",
        help="manage ETLs",
        **examples(
            "sluice etl init resize --code transforms.py:resize          # object mode",
            "sluice etl init aug --code aug.py:augment --mode wds --decode pil --on-error skip",
            "sluice etl ls",
            "sluice etl show aug              # phase, counts, last errors with sample keys",
            "sluice etl logs aug --tail 50",
            "sluice etl stop aug && sluice etl start aug",
            "sluice etl rm aug",
        ),
    )
    e.add_argument("action", choices=["init", "ls", "show", "stop", "start", "rm", "logs"])
    e.add_argument("name", nargs="?")
    e.add_argument("--code", metavar="FILE.py:FUNC", help="init: the transform function")
    e.add_argument("--mode", choices=["object", "wds"], default="object")
    e.add_argument("--decode", help="init, wds mode: webdataset decoder (pil, rgb, ...)")
    e.add_argument("--on-error", choices=["fail", "skip"], default="fail")
    e.add_argument(
        "--dep", action="append", default=[], metavar="REQ", help="pip requirement (repeatable)"
    )
    e.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--workers", type=int)
    e.add_argument("--arg-type", choices=["", "fqn"], default="")
    e.add_argument(
        "--cache",
        action="store_true",
        help="init: keep transformed objects on the targets (deterministic transforms only)",
    )
    e.add_argument(
        "--wait",
        dest="timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="init: how long to wait for Running (default %(default)s)",
    )
    e.add_argument("--tail", type=int, default=200, help="logs: lines per transformer")
    e.set_defaults(func=cmd_etl)
    register_jobs(sub)  # sluice job ..., sluice transform (etl_runtime.cli.jobs)
    cli_dsort.register(sub)
    cli_remote.register(sub)
    cli_s3.register(sub)  # sluice s3 key ... (etl_runtime.cli.s3)
    cli_tokens.register(sub)  # sluice token ... (etl_runtime.cli.tokens)
    return p


# What the local cluster's servers import from the ``server`` extra (pyproject.toml).
SERVER_MODULES = ("fastapi", "starlette", "uvicorn", "httptools", "prometheus_client", "msgspec")


def run_up(argv: Sequence[str]) -> int:
    missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:  # the SDK alone (`pip install sluice`): its servers would die at start
        raise CliError(
            f"'sluice up' runs the servers, which need {', '.join(missing)}: "
            "pip install 'sluice[server]'"
        )
    try:
        from etl_runtime.local.up import main as cluster_main
    except ImportError as exc:
        raise CliError(f"the local cluster is not available ({exc})") from None
    code = cluster_main(list(argv))
    return int(code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["up"]:  # its flags belong to the local cluster, not to us
            return run_up(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command == "up":
            extra = ["--token", args.token] if args.token and "--token" not in args.args else []
            return run_up([*args.args, *extra])
        func: Callable[[Client, argparse.Namespace], None] = args.func
        with Client(args.endpoint, token=args.token, timeout=args.timeout, ca=args.ca) as client:
            func(client, args)
        return 0
    except (SluiceError, CliError) as exc:
        message = exc.message if isinstance(exc, SluiceError) else str(exc)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `sluice get ... | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
