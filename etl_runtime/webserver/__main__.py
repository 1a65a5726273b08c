"""``sluice-transformer`` / ``python -m etl_runtime.webserver``: serve one ETL.

Flags win over environment variables (see docs/transformer.md).
A permanent configuration error ends the process with exit code 2 and, as the
last line on stderr, ``sluice: ETL '<name>': <reason>`` (the pod's termination
message on Kubernetes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

import uvicorn

from etl_runtime.core import procs
from etl_runtime.core.errors import EXIT_CONFIG_ERROR, StartupError
from etl_runtime.core.eventloop import loop_from_env
from etl_runtime.core.spec import EtlSpec, InvalidSpec
from etl_runtime.webserver import sizing
from etl_runtime.webserver.app import create_app
from etl_runtime.webserver.code import check_code
from etl_runtime.webserver.servers import ServersFailing, serve_many
from etl_runtime.webserver.sizing import parse_inline, parse_servers
from etl_runtime.webserver.stats import Board
from etl_runtime.webserver.transformer import Transformer
from etl_runtime.wire.http import connections, wholebody
from etl_runtime.wire.http.connections import Limits

RETIRE_DRAIN_SECONDS = 0.5  # a retiring server reads the requests of connections it took


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="sluice-transformer", description=__doc__)
    p.add_argument("--host", default=env("SLUICE_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(env("SLUICE_PORT", "8000")))
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("SLUICE_WORKERS", "0")) or None,
        help="worker processes (default: spec.workers, else CPU count)",
    )
    p.add_argument(
        "--inline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="object mode: run the code in the server processes' threads (--inline), or in "
        "worker processes (--no-inline); default $SLUICE_INLINE, else inline for object mode "
        "(see docs/transformer.md, 'The default shape')",
    )
    p.add_argument(
        "--servers",
        type=int,
        default=None,
        help="server processes sharing the port, each with ceil(workers / servers) of the "
        "workers or threads (default $SLUICE_SERVERS, else the usable CPUs when inline, 1 "
        "otherwise; see docs/transformer.md)",
    )
    p.add_argument(
        "--spec-file", default=None, help="ETL spec JSON file (default: $SLUICE_ETL_SPEC text)"
    )
    p.add_argument(
        "--zygote-fd",
        type=int,
        default=None,
        help="run as the local cluster's pre-started runtime on this socket, forking "
        "transformers (see etl_runtime/webserver/zygote.py; started by the local controller)",
    )
    return p


def _fail(name: str, reason: str, code: int = EXIT_CONFIG_ERROR) -> int:
    """The last stderr line names the reason; 2 = a configuration error, 1 = may pass."""
    sys.stderr.flush()
    print(f"sluice: ETL '{name}': {reason}", file=sys.stderr, flush=True)
    return code


def _load_spec(spec_file: str | None) -> EtlSpec:
    if spec_file:
        try:
            with open(spec_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise InvalidSpec(f"cannot read --spec-file {spec_file!r}: {e}") from e
    else:
        text = os.environ.get("SLUICE_ETL_SPEC", "")
        if not text.strip():
            raise InvalidSpec("no spec: set SLUICE_ETL_SPEC to the spec JSON or pass --spec-file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidSpec(f"spec is not valid JSON: {e}") from e
    return EtlSpec.from_dict(data)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.zygote_fd is not None:
        from etl_runtime.webserver import zygote

        return zygote.main(args.zygote_fd)
    name = os.environ.get("SLUICE_ETL_NAME") or "unnamed"
    procs.outlive_parent_if_adopted()  # local: a killed gateway's transformers live on
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        loop = loop_from_env()
        # before the servers fork: every process gets the raised open-files limit
        limits = connections.setup()
    except ValueError as e:
        return _fail(name, str(e))
    logging.getLogger("sluice.transformer").info("%s", limits.describe())
    try:
        spec = _load_spec(args.spec_file)
        check_code(spec)
    except (InvalidSpec, StartupError) as e:
        return _fail(name, str(e))
    if args.workers is not None and args.workers < 1:
        return _fail(name, f"--workers must be at least 1, got {args.workers}")
    try:
        inline = args.inline
        if inline is None:
            inline = parse_inline(os.environ.get("SLUICE_INLINE"))
        servers = args.servers
        if servers is None:
            servers = parse_servers(os.environ.get("SLUICE_SERVERS"))
    except ValueError as e:
        return _fail(name, str(e))
    if servers is not None and servers < 1:
        return _fail(name, f"--servers must be at least 1, got {servers}")
    if inline and spec.mode != "object":
        return _fail(name, f"--inline (SLUICE_INLINE) is for object mode; this ETL is {spec.mode}")
    chosen = sizing.shape(spec, args.workers, servers, inline)
    logging.getLogger("sluice.transformer").info(
        "%d server process(es), %s, %d %s in all",
        chosen.servers,
        "code inline" if chosen.inline else "worker processes",
        chosen.workers,
        "threads" if chosen.inline else "workers",
    )
    if chosen.servers > 1 or chosen.inline:  # inline code needs a supervisor (servers)
        return _serve_many(name, spec, chosen, args, loop, limits)

    app = create_app(
        name,
        spec,
        workers=chosen.workers,
        token=os.environ.get("SLUICE_ETL_TOKEN"),
        deps_dir=os.environ.get("SLUICE_DEPS_DIR"),
        inline=chosen.inline,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            loop=loop,
            log_level="info",
            access_log=False,
            **connections.server_options("auto", limits),  # header timeout, connection cap
        )
    )
    transformer = app.state.transformer

    def stop(reason: str) -> None:
        server.should_exit = True

    transformer.on_fatal = stop
    server.run()
    if transformer.fatal:
        return _fail(name, transformer.fatal)
    return 0


def _is_hpush(scope: dict) -> bool:
    """The object's PUT (hpush), whose body an inline server gives its function whole."""
    return bool(scope["method"] == "PUT")


def _serve_many(
    name: str,
    spec: EtlSpec,
    chosen: sizing.Shape,
    args: argparse.Namespace,
    loop: str,
    limits: Limits,
) -> int:
    board = Board(chosen.servers)

    def make_server(slot: int, board: Board, restarted: bool) -> tuple[uvicorn.Server, Transformer]:
        app = create_app(
            name,
            spec,
            workers=chosen.per_server,
            token=os.environ.get("SLUICE_ETL_TOKEN"),
            deps_dir=os.environ.get("SLUICE_DEPS_DIR"),
            board=board,
            slot=slot,
            inline=chosen.inline,
            ready_before_serving=restarted,
        )
        # made in each server process: its own connection tracker. Inline code takes
        # the object whole: its hpush body is received into one buffer (wholebody).
        http = wholebody.protocol(_is_hpush) if chosen.inline else "auto"
        options = connections.server_options(http, limits)
        server = uvicorn.Server(
            uvicorn.Config(app, loop=loop, log_level="info", access_log=False, **options)
        )
        transformer: Transformer = app.state.transformer

        def stop(reason: str) -> None:
            server.should_exit = True

        def retire(reason: str) -> None:
            # Stop taking connections now, not at uvicorn's next tick (0.1 s): its
            # shutdown closes a connection that has no request read yet, and one
            # accepted in that tick (its client's request on its way) saw a reset.
            # The shared socket stays open in the supervisor; its backlog waits for
            # the replacement. A connection accepted just before gets its request
            # read, answered and closed.
            for listener in server.servers:
                listener.close()
            asyncio.get_running_loop().call_later(RETIRE_DRAIN_SECONDS, stop, reason)

        transformer.on_fatal = stop
        transformer.on_retire = retire  # the supervisor starts a new server in this slot
        return server, transformer

    try:
        fatal = serve_many(chosen.servers, args.host, args.port, make_server, board)
    except OSError as e:  # e.g. the port was taken meanwhile: a new start may do
        return _fail(name, f"cannot listen on {args.host}:{args.port}: {e}", code=1)
    except ServersFailing as e:  # not a configuration error: exit 1, to be restarted
        return _fail(name, str(e), code=1)
    return _fail(name, fatal) if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
